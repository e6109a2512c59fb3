/** Requests to the server extension under `<base_url>/trainfactory/`. */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { TrainfactoryError } from './errors';
import { IJob, IReliability, IServices, ITrainfactoryAPI } from './types';

async function request<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'trainfactory', path);
  let reply: Response;
  try {
    reply = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new TrainfactoryError(
      0,
      `The Jupyter server does not answer: ${error}`
    );
  }
  const text = await reply.text();
  let data: any = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = { message: text };
  }
  if (!reply.ok) {
    const message = data?.message || reply.statusText || `HTTP ${reply.status}`;
    throw new TrainfactoryError(reply.status, message);
  }
  return data as T;
}

/** The real server. */
export const serverAPI: ITrainfactoryAPI = {
  jobs: all => request<IJob[]>(all ? 'jobs?all=1' : 'jobs'),
  services: () => request<IServices>('services'),
  stop: (id, now) =>
    request<IJob>(`jobs/${encodeURIComponent(id)}/stop`, {
      method: 'POST',
      body: JSON.stringify({ now })
    }),
  resume: id =>
    request<IJob>(`jobs/${encodeURIComponent(id)}/resume`, {
      method: 'POST',
      body: '{}'
    }),
  startServices: () =>
    request<IServices>('services/start', { method: 'POST', body: '{}' }),
  reliability: since =>
    request<IReliability>(`reliability?since=${encodeURIComponent(since)}`)
};
