/** JobsPanel: the "Training jobs" side panel, a Lumino widget rendering a JobsModel. */

import { Widget } from '@lumino/widgets';

import { IPanelActions } from './actions';
import {
  attachCommand,
  canResume,
  canStop,
  formatCost,
  formatCount,
  formatDuration,
  formatEttr,
  formatPercent,
  formatRate,
  formatTime,
  MISSING
} from './format';
import { JobsModel, messageOf } from './model';
import { sparkline } from './sparkline';
import { IJob, IServices } from './types';

const STATES = [
  'PENDING',
  'RUNNING',
  'RESTARTING',
  'SUCCEEDED',
  'FAILED',
  'STOPPED'
];
const COLUMNS = [
  'Job',
  'State',
  'Step',
  'Throughput',
  'Util.',
  'Cost',
  'ETTR',
  'Checkpoint',
  'Restarts',
  'Owner',
  'Experiment',
  'Started',
  'Elapsed',
  ''
];

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

export class JobsPanel extends Widget {
  constructor(
    readonly model: JobsModel,
    private readonly actions: IPanelActions
  ) {
    super();
    this.addClass('jp-tf-panel');
    this.title.caption = 'Training jobs';
    this.node.append(
      this._header(),
      this._filters(),
      this._message,
      this._tableBox
    );
    this._tableBox.className = 'jp-tf-table-box';
    model.changed.connect(this._render, this);
    this._render();
  }

  protected onAfterShow(): void {
    this.model.refreshSoon();
  }

  private _header(): HTMLElement {
    const header = el('div', 'jp-tf-header');
    const top = el('div', 'jp-tf-header-top');
    const refresh = el('button', 'jp-tf-button', 'Refresh');
    refresh.title = 'Read the jobs again now';
    refresh.onclick = () => this.model.refreshSoon();
    top.append(el('h2', 'jp-tf-title', 'Training jobs'), refresh);
    header.append(top, this._servicesLine);
    this._servicesLine.className = 'jp-tf-services';
    return header;
  }

  private _filters(): HTMLElement {
    const box = el('div', 'jp-tf-filters');
    const input = (key: 'experiment' | 'owner', list: HTMLDataListElement) => {
      const field = el('input', 'jp-tf-filter');
      field.placeholder = key;
      field.setAttribute('aria-label', `Filter by ${key}`);
      field.dataset.filter = key;
      field.setAttribute('list', list.id);
      field.oninput = () => {
        this.model.filter = { ...this.model.filter, [key]: field.value };
      };
      return field;
    };
    this._experiments.id = `jp-tf-experiments-${Private.nextId()}`;
    this._owners.id = `jp-tf-owners-${Private.nextId()}`;
    const state = el('select', 'jp-tf-filter');
    state.dataset.filter = 'state';
    state.setAttribute('aria-label', 'Filter by state');
    for (const value of ['', ...STATES]) {
      const option = el('option', '', value || 'any state');
      option.value = value;
      state.append(option);
    }
    state.onchange = () => {
      this.model.filter = { ...this.model.filter, state: state.value };
    };
    const everyone = el('label', 'jp-tf-everyone');
    const box2 = el('input');
    box2.type = 'checkbox';
    box2.onchange = () => {
      this.model.allUsers = box2.checked;
    };
    everyone.append(box2, document.createTextNode(" everyone's"));
    box.append(
      input('experiment', this._experiments),
      input('owner', this._owners),
      state,
      everyone,
      this._experiments,
      this._owners
    );
    return box;
  }

  private _render(): void {
    const model = this.model;
    this._renderServices(model.services);
    this._fillList(this._experiments, model.experiments);
    this._fillList(this._owners, model.owners);
    this._message.className = 'jp-tf-message';
    this._message.textContent = '';
    if (model.error) {
      this._message.classList.add('jp-tf-error');
      this._message.textContent = model.error;
    } else if (!model.loaded) {
      this._message.textContent = 'Loading training jobs…';
    } else if (model.jobs.length === 0) {
      this._message.classList.add('jp-tf-empty');
      this._message.textContent = model.allUsers
        ? 'No training jobs yet. Start one from a notebook with %train launch.'
        : 'You have no training jobs yet. Start one from a notebook with %train launch.';
    } else if (model.visibleJobs.length === 0) {
      this._message.classList.add('jp-tf-empty');
      this._message.textContent = 'No job matches the filter.';
    }
    this._renderTable(model.visibleJobs);
  }

  private _renderServices(services: IServices | null): void {
    const line = this._servicesLine;
    line.replaceChildren();
    if (!services) {
      return;
    }
    for (const s of services.services) {
      const item = el('span', `jp-tf-service jp-tf-service-${s.state}`);
      item.title = `${s.service}: ${s.state}${s.address && s.address !== '-' ? ` at ${s.address}` : ''}`;
      item.append(el('span', 'jp-tf-dot'));
      if (s.state === 'stopped') {
        item.append(document.createTextNode(`${s.service} stopped`));
      } else {
        const link = el(
          'a',
          'jp-tf-link',
          s.name === 'ray' ? 'Ray dashboard' : 'MLflow UI'
        );
        link.href = s.link;
        link.target = '_blank';
        link.rel = 'noopener';
        item.append(link);
      }
      line.append(item);
    }
    if (!services.running && services.embedded) {
      const start = el(
        'button',
        'jp-tf-button jp-mod-accept',
        'Start services'
      );
      start.dataset.action = 'start-services';
      start.onclick = async () => {
        start.disabled = true;
        start.textContent = 'Starting…';
        try {
          await this.model.startServices();
        } catch (error) {
          this.actions.notify(messageOf(error), 'error');
          start.disabled = false;
          start.textContent = 'Start services';
        }
      };
      line.append(start);
    }
  }

  private _fillList(list: HTMLDataListElement, values: string[]): void {
    list.replaceChildren(
      ...values.map(v => {
        const option = el('option');
        option.value = v;
        return option;
      })
    );
  }

  private _renderTable(jobs: IJob[]): void {
    this._tableBox.replaceChildren();
    if (jobs.length === 0) {
      return;
    }
    const table = el('table', 'jp-tf-table');
    const head = el('tr');
    head.append(...COLUMNS.map(c => el('th', '', c)));
    table.append(el('thead'), el('tbody'));
    table.tHead!.append(head);
    table.tBodies[0].append(...jobs.map(job => this._row(job)));
    this._tableBox.append(table);
  }

  private _row(job: IJob): HTMLTableRowElement {
    const row = el('tr', 'jp-tf-row');
    row.dataset.jobId = job.id;
    const name = el('td', 'jp-tf-job');
    name.append(
      el('div', 'jp-tf-name', job.name || job.id),
      el('div', 'jp-tf-id', job.id)
    );
    if (job.detail) {
      name.title = job.detail;
    }
    const state = el('td');
    const badge = el(
      'span',
      `jp-tf-state jp-tf-state-${job.state.toLowerCase()}`,
      job.state
    );
    badge.title = job.detail || job.state;
    state.append(badge);
    const history = job.history || [];
    row.append(
      name,
      state,
      el('td', 'jp-tf-num', formatCount(job.step)),
      this._withSpark(
        formatRate(job.throughput, job.throughput_unit),
        history.map(p => p[1]),
        'throughput'
      ),
      this._withSpark(
        job.utilization_kind
          ? `${job.utilization_kind} ${formatPercent(job.utilization)}`
          : MISSING,
        history.map(p => p[2]),
        'utilization'
      ),
      this._cell(formatCost(job.cost_usd), job.cost),
      this._cell(formatEttr(job.ettr), 'effective training time ratio'),
      this._cell(
        job.checkpoint_step === null ? MISSING : `step ${job.checkpoint_step}`
      ),
      this._cell(String(job.restarts ?? 0)),
      this._cell(job.owner || MISSING),
      this._cell(job.experiment || MISSING),
      this._cell(formatTime(job.started)),
      this._cell(formatDuration(job.started, job.ended)),
      this._actions(job)
    );
    return row;
  }

  private _cell(text: string, title = ''): HTMLTableCellElement {
    const cell = el('td', '', text);
    if (title) {
      cell.title = title;
    }
    return cell;
  }

  private _withSpark(
    text: string,
    values: Array<number | null>,
    what: string
  ): HTMLTableCellElement {
    const cell = el('td', 'jp-tf-num', text);
    const spark = sparkline(values, `recent ${what}`);
    if (spark) {
      cell.append(spark);
    }
    return cell;
  }

  private _actions(job: IJob): HTMLTableCellElement {
    const cell = el('td', 'jp-tf-actions');
    const button = (
      action: string,
      label: string,
      title: string,
      run: () => unknown
    ) => {
      const b = el('button', 'jp-tf-button', label);
      b.dataset.action = action;
      b.title = title;
      b.onclick = () => void run();
      cell.append(b);
      return b;
    };
    if (canStop(job)) {
      button('stop', 'Stop', 'Stop this job (asks first)', () =>
        this._stop(job)
      );
    }
    if (canResume(job)) {
      button('resume', 'Resume', 'Continue from the latest checkpoint', () =>
        this._do(() => this.model.resume(job.id), `Resuming ${job.id}`)
      );
    }
    if (job.run_link) {
      const link = el('a', 'jp-tf-button', 'MLflow');
      link.dataset.action = 'mlflow';
      link.href = job.run_link;
      link.target = '_blank';
      link.rel = 'noopener';
      link.title = `Open the MLflow run (${job.run_url || 'through this server'})`;
      cell.append(link);
    }
    button(
      'copy',
      'Copy',
      `Copy "${attachCommand(job.id)}" for a notebook`,
      () => {
        this.actions.copy(attachCommand(job.id));
        this.actions.notify(`Copied: ${attachCommand(job.id)}`, 'info');
      }
    );
    return cell;
  }

  private async _stop(job: IJob): Promise<void> {
    const how = await this.actions.confirmStop(job);
    if (how === null) {
      return;
    }
    await this._do(
      () => this.model.stop(job.id, how === 'now'),
      how === 'now'
        ? `Stopping ${job.id} now`
        : `${job.id} stops after its next checkpoint`
    );
  }

  private async _do(call: () => Promise<IJob>, message: string): Promise<void> {
    try {
      await call();
      this.actions.notify(message, 'success');
    } catch (error) {
      this.actions.notify(messageOf(error), 'error');
    }
  }

  private _servicesLine = el('div');
  private _message = el('div', 'jp-tf-message');
  private _tableBox = el('div');
  private _experiments = el('datalist');
  private _owners = el('datalist');
}

namespace Private {
  let id = 0;
  export function nextId(): number {
    return ++id;
  }
}
