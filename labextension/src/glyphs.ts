/** The panel's icons (stop, resume, open, copy, refresh) and the icon-and-label action control. */

import { el } from './dom';

/**
 * The SVG of JupyterLab's stop, run, launch, copy and refresh icons (its `jp-icon3`
 * class colours them with the theme); drawn here rather than through
 * @jupyterlab/ui-components so that the panel loads in the unit tests.
 */
const GLYPHS = {
  stop: ['0 0 24 24', ['M6 6h12v12H6z']],
  resume: ['0 0 24 24', ['M8 5v14l11-7z']],
  open: [
    '0 0 32 32',
    [
      'M26 28H6a2.003 2.003 0 0 1-2-2V6a2.003 2.003 0 0 1 2-2h10v2H6v20h20V16h2v10a2.003 2.003 0 0 1-2 2',
      'M20 2v2h6.586L18 12.586 19.414 14 28 5.414V12h2V2z'
    ]
  ],
  copy: [
    '0 0 18 18',
    [
      'M11.9 1H3.2c-.8 0-1.5.7-1.5 1.5v10.2h1.5V2.5h8.7zm2.2 2.9h-8c-.8 0-1.5.7-1.5 1.5v10.2c0 .8.7 1.5 1.5 1.5h8c.8 0 1.5-.7 1.5-1.5V5.4c-.1-.8-.7-1.5-1.5-1.5m0 11.6h-8V5.4h8z'
    ]
  ],
  refresh: [
    '0 0 18 18',
    [
      'M9 13.5c-2.49 0-4.5-2.01-4.5-4.5S6.51 4.5 9 4.5c1.24 0 2.36.52 3.17 1.33L10 8h5V3l-1.76 1.76A6 6 0 0 0 9 3C5.69 3 3.01 5.69 3.01 9S5.69 15 9 15a5.98 5.98 0 0 0 5.9-5h-1.52c-.46 2-2.24 3.5-4.38 3.5'
    ]
  ]
} satisfies Record<string, [string, string[]]>;

/** The name of one of the panel's icons. */
export type Glyph = keyof typeof GLYPHS;

/** A 14 px icon for a button or link: a `span.jp-tf-icon` around the SVG. */
export function iconOf(glyph: Glyph): HTMLElement {
  const SVG = 'http://www.w3.org/2000/svg';
  const [viewBox, paths] = GLYPHS[glyph];
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', viewBox);
  svg.setAttribute('width', '14');
  svg.setAttribute('height', '14');
  svg.setAttribute('aria-hidden', 'true');
  for (const d of paths) {
    const path = document.createElementNS(SVG, 'path');
    path.setAttribute('class', 'jp-icon3');
    path.setAttribute('fill', '#616161');
    path.setAttribute('d', d);
    svg.append(path);
  }
  const span = el('span', 'jp-tf-icon');
  span.append(svg);
  return span;
}

/**
 * An action control: an icon, and a label that shows only where the panel is wide; the
 * label is also its accessible name, the title says what it does.
 *
 * @param tag - 'button' or 'a'.
 * @param action - its `data-action`.
 */
export function actionControl<K extends 'button' | 'a'>(
  tag: K,
  action: string,
  label: string,
  title: string,
  icon: Glyph
): HTMLElementTagNameMap[K] {
  const node = el(tag, 'jp-tf-button jp-tf-action');
  node.dataset.action = action;
  node.title = title;
  node.setAttribute('aria-label', label);
  node.append(iconOf(icon), el('span', 'jp-tf-label', label));
  return node;
}
