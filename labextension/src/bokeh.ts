/**
 * Puts BokehJS in the page, from the installed bokeh package (never a CDN).
 *
 * jupyter_bokeh's widgets (the job dashboard's plots) draw only once `window.Bokeh`
 * exists; bokeh's default resources come from a CDN that clusters cannot reach. The
 * server extension serves the Python package's own files under
 * `<base_url>trainfactory/bokehjs/` (jupyter_trainfactory/server/bokehjs.py), so the
 * version always matches the kernel's bokeh.
 */

import { JupyterFrontEndPlugin } from '@jupyterlab/application';
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** What `GET trainfactory/bokehjs/` answers. */
export interface IBokehJSInfo {
  version: string;
  files: string[];
}

declare global {
  interface Window {
    Bokeh?: { version?: string };
  }
}

/** The BokehJS version in the page, undefined when there is none. */
function pageBokeh(): string | undefined {
  return window.Bokeh === undefined ? undefined : (window.Bokeh.version ?? '?');
}

/** Add one classic script tag, resolved when it has run. */
function addScript(src: string, doc: Document): Promise<void> {
  return new Promise((resolve, reject) => {
    const script = doc.createElement('script');
    script.src = src;
    script.async = false; // in order: bokeh.min.js defines what the others extend
    script.onload = () => resolve();
    script.onerror = () => reject(new Error(`BokehJS: failed to load ${src}`));
    doc.head.appendChild(script);
  });
}

/**
 * Load BokehJS once per page (nothing to do when another extension already did).
 * Resolves to the version now in the page, or null when the server has no bokeh.
 */
export async function loadBokehJS(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings(),
  doc: Document = document
): Promise<string | null> {
  const present = pageBokeh();
  if (present !== undefined) {
    return present;
  }
  const base = URLExt.join(settings.baseUrl, 'trainfactory', 'bokehjs');
  const response = await ServerConnection.makeRequest(base, {}, settings);
  if (!response.ok) {
    throw new Error(`BokehJS: ${base} answered ${response.status}`);
  }
  const info = (await response.json()) as IBokehJSInfo;
  const version = encodeURIComponent(info.version);
  await Promise.all(
    info.files.map(f => addScript(`${URLExt.join(base, f)}?v=${version}`, doc))
  );
  return pageBokeh() ?? null;
}

export const bokehPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-trainfactory:bokehjs',
  description:
    'Loads BokehJS from the installed bokeh package, so the job dashboard draws offline.',
  autoStart: true,
  activate: async () => {
    try {
      const version = await loadBokehJS();
      console.info(`jupyter-trainfactory: BokehJS ${version} loaded`);
    } catch (reason) {
      console.error('jupyter-trainfactory: BokehJS not loaded;', reason);
    }
  }
};
