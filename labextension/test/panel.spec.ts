/// <reference types="node" />
import { readFileSync } from 'fs';
import { join } from 'path';

import { Widget } from '@lumino/widgets';

import { IPanelActions } from '../src/actions';
import { TrainfactoryError } from '../src/errors';
import { JobsModel } from '../src/model';
import { COLUMNS, columnClass, MAX_LEVEL } from '../src/columns';
import { JobsPanel } from '../src/panel';
import { stopMessage } from '../src/rowActions';
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
      const had = jobs.find(j => j.id === id);
      // the server starts a job without a checkpoint over as a new job
      if (had && had.checkpoint_step === null) {
        const started = job({ id: 'tf-0000beef', state: 'PENDING' });
        jobs.unshift(started); // the server lists it from now on
        return started;
      }
      return job({ id, state: 'PENDING' });
    },
    startServices: async () => services
  };
  const actions: IPanelActions & {
    copied: string[];
    answer: 'graceful' | 'now' | null;
    startOver: boolean;
    asked: string[];
    notes: string[];
  } = {
    copied: [],
    answer: 'graceful',
    startOver: true,
    asked: [],
    notes: [],
    async confirmStop() {
      return this.answer;
    },
    async confirmStartOver(j) {
      this.asked.push(j.id);
      return this.startOver;
    },
    copy(text) {
      this.copied.push(text);
    },
    notify(message) {
      this.notes.push(message);
    }
  };
  const model = new JobsModel(api, () => false);
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

  it('asks before a resume starts over a job that saved no checkpoint, and says so after', async () => {
    const { model, panel, calls, actions } = setup([
      job({ id: 'tf-00000001', state: 'STOPPED', checkpoint_step: 100 }),
      job({ id: 'tf-00000002', state: 'STOPPED', checkpoint_step: null })
    ]);
    await model.refresh();
    const resume = (id: string) =>
      panel.node.querySelector(
        `tr[data-job-id="${id}"] [data-action="resume"]`
      ) as HTMLButtonElement;
    expect(resume('tf-00000002').title).toContain('saved no checkpoint');
    resume('tf-00000001').click(); // a checkpoint: no question
    await flush();
    expect(actions.asked).toEqual([]);
    expect(actions.notes).toEqual(['Resuming tf-00000001']);
    actions.startOver = false; // cancelled: nothing is asked of the server
    resume('tf-00000002').click();
    await flush();
    expect(actions.asked).toEqual(['tf-00000002']);
    expect(calls).toEqual(['resume tf-00000001']);
    actions.startOver = true;
    resume('tf-00000002').click();
    await flush();
    await flush();
    expect(calls).toEqual(['resume tf-00000001', 'resume tf-00000002']);
    expect(actions.notes[1]).toBe('tf-00000002 started over as tf-0000beef');
    // the new job shows beside the old one, newest first
    expect(model.jobs.map(j => j.id)).toEqual([
      'tf-0000beef',
      'tf-00000001',
      'tf-00000002'
    ]);
    expect(
      panel.node.querySelector('tr[data-job-id="tf-0000beef"]')
    ).not.toBeNull();
  });

  it('says under a PENDING job what it waits for, the full reason in its tooltip', async () => {
    const reason =
      'waiting for resources: 2 workers x (1 CPU), placement pack; free now 0 of 2 CPU;' +
      ' held by job tf-00000001 (2 CPU)';
    const { model, panel } = setup([
      job({ id: 'tf-00000001', state: 'RUNNING' }),
      job({
        id: 'tf-00000002',
        state: 'PENDING',
        step: null,
        detail: reason,
        waiting: '0 of 2 CPU free; held by job tf-00000001'
      })
    ]);
    await model.refresh();
    const line = panel.node.querySelector(
      'tr[data-job-id="tf-00000002"] .jp-tf-col-state .jp-tf-waiting'
    ) as HTMLElement;
    expect(line.textContent).toBe('0 of 2 CPU free; held by job tf-00000001');
    expect(line.title).toBe(reason);
    expect(
      panel.node.querySelector('tr[data-job-id="tf-00000001"] .jp-tf-waiting')
    ).toBeNull();
  });

  it("says after a stop what happens next, by the job's state and checkpoints", () => {
    const pending = job({
      state: 'PENDING',
      step: null,
      checkpoint_step: null
    });
    expect(stopMessage(pending, 'graceful')).toBe(
      'Stopping tf-0123abcd: it had not started training'
    );
    expect(stopMessage(job(), 'graceful')).toBe(
      'tf-0123abcd stops after its next checkpoint'
    );
    expect(stopMessage(job({ checkpoint_step: null }), 'graceful')).toContain(
      'should_stop()'
    );
    expect(stopMessage(job(), 'now')).toBe('Stopping tf-0123abcd now');
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

  it("opens a sweep's row into its trials, best first, and closes it", async () => {
    const trial = (index: number, value: number | null, reason = '') => ({
      index,
      params: `lr=${index / 100}`,
      state: reason ? ('STOPPED' as const) : ('RUNNING' as const),
      reason,
      metric: 'val_loss',
      value,
      step: value === null ? null : 40 + index,
      cost_usd: 0.0012,
      run_id: `run${index}`
    });
    const { model, panel } = setup([
      job({
        id: 'tf-00000001',
        trials: [trial(1, 0.25), trial(3, 0.5, 'early-stop'), trial(2, null)],
        trials_total: 4
      }),
      job({ id: 'tf-00000002' })
    ]);
    await model.refresh();
    const trials = () =>
      Array.from(panel.node.querySelectorAll<HTMLElement>('tr.jp-tf-trial'));
    const button = () =>
      panel.node.querySelector<HTMLButtonElement>(
        'tr[data-job-id="tf-00000001"] .jp-tf-expand'
      )!;
    expect(trials()).toHaveLength(0);
    expect(button().textContent).toBe('\u25B8 3/4 trials'); // one not started yet
    expect(
      panel.node.querySelector('tr[data-job-id="tf-00000002"] .jp-tf-expand')
    ).toBeNull(); // a job has no trials to show
    button().click();
    expect(trials().map(r => r.dataset.trial)).toEqual(['1', '3', '2']);
    expect(button().getAttribute('aria-expanded')).toBe('true');
    const [first, second] = trials();
    expect(first.textContent).toContain('lr=0.01');
    expect(first.textContent).toContain('val_loss 0.25');
    expect(first.querySelector('td.jp-tf-col-step')!.textContent).toBe('41');
    expect(second.querySelector('.jp-tf-state')!.textContent).toBe(
      'EARLY STOP'
    );
    // the rows sit between the sweep's row and the next job's, and stay open on refresh
    const ids = Array.from(
      panel.node.querySelectorAll<HTMLElement>('tbody tr')
    ).map(r => r.dataset.trial ?? r.dataset.jobId);
    expect(ids).toEqual(['tf-00000001', '1', '3', '2', 'tf-00000002']);
    await model.refresh();
    expect(trials()).toHaveLength(3);
    button().click();
    expect(trials()).toHaveLength(0);
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

  it('marks every cell with its column and level, the actions last', async () => {
    const { model, panel } = setup([job({ id: 'tf-00000001' })]);
    await model.refresh();
    const heads = Array.from(panel.node.querySelectorAll('th'));
    expect(heads.map(th => th.dataset.column)).toEqual(COLUMNS.map(c => c.key));
    const cells = Array.from(panel.node.querySelectorAll('tr[data-job-id] td'));
    expect(
      cells.map(td => td.className.split(' ').slice(0, 2).join(' '))
    ).toEqual(COLUMNS.map(c => columnClass(c.key)));
    const always = COLUMNS.filter(c => c.level === 0).map(c => c.key);
    expect(always).toEqual(['job', 'state', 'actions']);
    // Where the step column is hidden, the step shows under the state.
    expect(
      panel.node.querySelector('.jp-tf-col-state .jp-tf-step-under')!
        .textContent
    ).toBe('step 120');
    expect(COLUMNS[COLUMNS.length - 1].key).toBe('actions');
  });

  it('gives each action an icon, a label for its accessible name and a title', async () => {
    const { model, panel } = setup([
      job({ id: 'tf-00000001', state: 'RUNNING' }),
      job({ id: 'tf-00000002', state: 'FAILED' })
    ]);
    await model.refresh();
    for (const action of ['stop', 'resume', 'mlflow', 'copy']) {
      const control = panel.node.querySelector<HTMLElement>(
        `.jp-tf-col-actions [data-action="${action}"]`
      )!;
      expect(control.querySelector('svg path.jp-icon3')).not.toBeNull();
      expect(control.getAttribute('aria-label')).toBe(
        control.querySelector('.jp-tf-label')!.textContent
      );
      expect(control.title).not.toBe('');
    }
  });

  it('shows each column level only from its width of the panel (style/index.css)', () => {
    const css = readFileSync(
      join(__dirname, '..', 'style', 'index.css'),
      'utf8'
    );
    expect(css).toMatch(/container:\s*jp-tf-panel\s*\/\s*inline-size/);
    const widths: number[] = [];
    for (let level = 1; level <= MAX_LEVEL; level++) {
      const rule = new RegExp(
        `@container jp-tf-panel \\(width < (\\d+)px\\) \\{\\s*\\.jp-tf-level-${level} \\{\\s*display: none;`
      ).exec(css);
      expect(rule).not.toBeNull();
      widths.push(Number(rule![1]));
    }
    // Wider for each level; the first extra column comes beyond the sidebar's 300 px.
    expect([...widths].sort((a, b) => a - b)).toEqual(widths);
    expect(widths[0]).toBeGreaterThan(300);
    expect(css).not.toMatch(/\.jp-tf-level-0\b/);
    expect(css).toMatch(
      /\.jp-tf-col-actions \{\s*position: sticky;\s*right: 0;/
    );
    expect(css).toMatch(/\.jp-tf-button\[hidden\] \{\s*display: none;/);
  });

  it('offers "open in the main area" only once it is wired', async () => {
    const { panel } = setup([]);
    const open = panel.node.querySelector<HTMLButtonElement>(
      '[data-action="open-main"]'
    )!;
    expect(open.hidden).toBe(true);
    let opened = 0;
    panel.openInMain = () => opened++;
    expect(open.hidden).toBe(false);
    open.click();
    expect(opened).toBe(1);
  });

  it('shares one model between two panels: filter, visibility, closing', async () => {
    const { model, panel } = setup([
      job({ id: 'tf-00000001', state: 'RUNNING' }),
      job({ id: 'tf-00000002', state: 'FAILED' })
    ]);
    await model.refresh();
    const second = new JobsPanel(model, panel.actions);
    second.title.closable = true;
    Widget.attach(second, document.body);
    expect(model.anyVisible).toBe(true);
    const select = second.node.querySelector<HTMLSelectElement>(
      'select[data-filter="state"]'
    )!;
    select.value = 'FAILED';
    select.dispatchEvent(new Event('change'));
    expect(
      panel.node.querySelector<HTMLSelectElement>(
        'select[data-filter="state"]'
      )!.value
    ).toBe('FAILED');
    expect(panel.node.querySelectorAll('tr[data-job-id]')).toHaveLength(1);
    panel.hide();
    expect(model.anyVisible).toBe(true); // the second panel is shown
    second.close();
    expect(second.isDisposed).toBe(true);
    expect(model.anyVisible).toBe(false);
    panel.close(); // the sidebar's panel is not closable: it stays
    expect(panel.isDisposed).toBe(false);
  });
});
