import { Widget } from '@lumino/widgets';

import { IPanelActions } from '../src/actions';
import { TrainfactoryError } from '../src/errors';
import { JobsModel } from '../src/model';
import { JobsPanel } from '../src/panel';
import { IJob, IServices, ITrainfactoryAPI } from '../src/types';
import { job } from './jobs';

const services: IServices = {
  services: [
    {
      service: 'Ray head',
      name: 'ray',
      state: 'running',
      address: '127.0.0.1:6379',
      ui: 'http://127.0.0.1:8265',
      link: '/trainfactory/proxy/ray/'
    },
    {
      service: 'MLflow server',
      name: 'mlflow',
      state: 'running',
      address: 'http://127.0.0.1:5000',
      ui: 'http://127.0.0.1:5000',
      link: '/trainfactory/proxy/mlflow/'
    }
  ],
  running: true,
  embedded: true,
  state_dir: '/tmp/tf'
};

function setup(jobs: IJob[], failure: Error | null = null) {
  const calls: string[] = [];
  const api: ITrainfactoryAPI = {
    jobs: async () => {
      if (failure) {
        throw failure;
      }
      return jobs;
    },
    services: async () => services,
    stop: async (id, now) => {
      calls.push(`stop ${id} now=${now}`);
      return job({ id, state: 'STOPPED' });
    },
    resume: async id => {
      calls.push(`resume ${id}`);
      return job({ id, state: 'PENDING' });
    },
    startServices: async () => services
  };
  const actions: IPanelActions & {
    copied: string[];
    answer: 'graceful' | 'now' | null;
  } = {
    copied: [],
    answer: 'graceful',
    async confirmStop() {
      return this.answer;
    },
    copy(text) {
      this.copied.push(text);
    },
    notify() {}
  };
  const model = new JobsModel(api);
  const panel = new JobsPanel(model, actions);
  Widget.attach(panel, document.body);
  return { model, panel, calls, actions };
}

const flush = () => new Promise(resolve => setTimeout(resolve, 0));

describe('JobsPanel', () => {
  afterEach(() => {
    document.body.replaceChildren();
  });

  it('shows one row per job with its state, fields and service links', async () => {
    const { model, panel } = setup([
      job({ id: 'tf-00000001', state: 'RUNNING' }),
      job({ id: 'tf-00000002', state: 'STOPPED', throughput: null })
    ]);
    await model.refresh();
    const rows = panel.node.querySelectorAll('tr[data-job-id]');
    expect(rows).toHaveLength(2);
    const first = panel.node.querySelector('tr[data-job-id="tf-00000001"]')!;
    expect(first.querySelector('.jp-tf-state')!.textContent).toBe('RUNNING');
    expect(first.textContent).toContain('1.52k samples/s');
    expect(first.querySelector('[data-action="stop"]')).not.toBeNull();
    expect(first.querySelector('[data-action="resume"]')).toBeNull();
    const second = panel.node.querySelector('tr[data-job-id="tf-00000002"]')!;
    expect(second.querySelector('[data-action="resume"]')).not.toBeNull();
    const links = Array.from(
      panel.node.querySelectorAll('.jp-tf-services a')
    ).map(a => a.getAttribute('href'));
    expect(links).toEqual([
      '/trainfactory/proxy/ray/',
      '/trainfactory/proxy/mlflow/'
    ]);
  });

  it('says so when there are no jobs', async () => {
    const { model, panel } = setup([]);
    await model.refresh();
    expect(panel.node.querySelector('.jp-tf-empty')!.textContent).toContain(
      '%train launch'
    );
    expect(panel.node.querySelector('table')).toBeNull();
  });

  it('shows a readable error when MLflow cannot be reached', async () => {
    const { model, panel } = setup(
      [],
      new TrainfactoryError(
        503,
        'Cannot reach MLflow at http://127.0.0.1:5000: refused'
      )
    );
    await model.refresh();
    expect(panel.node.querySelector('.jp-tf-error')!.textContent).toBe(
      'Ray or MLflow cannot be reached: Cannot reach MLflow at http://127.0.0.1:5000: refused'
    );
  });

  it('stops a job only after the confirmation, and copies the attach line', async () => {
    const { model, panel, calls, actions } = setup([
      job({ id: 'tf-00000001' })
    ]);
    await model.refresh();
    const stop = () =>
      panel.node
        .querySelector<HTMLButtonElement>('[data-action="stop"]')!
        .click();
    actions.answer = null; // cancelled
    stop();
    await flush();
    expect(calls).toEqual([]);
    actions.answer = 'now';
    stop();
    await flush();
    expect(calls).toEqual(['stop tf-00000001 now=true']);
    await model.refresh();
    panel.node
      .querySelector<HTMLButtonElement>('[data-action="copy"]')!
      .click();
    expect(actions.copied).toEqual(['%train attach tf-00000001']);
  });

  it('filters rows by state', async () => {
    const { model, panel } = setup([
      job({ id: 'tf-00000001', state: 'RUNNING' }),
      job({ id: 'tf-00000002', state: 'FAILED' })
    ]);
    await model.refresh();
    const select = panel.node.querySelector<HTMLSelectElement>(
      'select[data-filter="state"]'
    )!;
    select.value = 'FAILED';
    select.dispatchEvent(new Event('change'));
    const ids = Array.from(panel.node.querySelectorAll('tr[data-job-id]')).map(
      r => (r as HTMLElement).dataset.jobId
    );
    expect(ids).toEqual(['tf-00000002']);
  });
});
