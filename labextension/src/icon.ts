/** The panel's icon: a rising training curve. */

import { LabIcon } from '@jupyterlab/ui-components';

const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="none" stroke="#616161" stroke-width="2" stroke-linecap="round">
    <path d="M3 20h18"/><path d="M4 16l5-5 4 3 7-8"/><circle cx="20" cy="6" r="1.5" fill="#616161"/>
  </g>
</svg>`;

export const trainfactoryIcon = new LabIcon({
  name: 'jupyter-trainfactory:jobs',
  svgstr: svg
});
