/** JobsPanel: the "Training jobs" side panel, a Lumino widget rendering a JobsModel. */

import type { Message } from '@lumino/messaging';
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

/**
 * The table's columns, in order. A column of `level` 0 shows at any width; the others
 * show from the panel width that style/index.css gives their level (a container query
 * on the panel), so the sidebar at its default width (250 px) shows Job, State (with
 * the step beneath it) and the actions, and a wide sidebar or the main area shows them all.
 */
export interface IColumn {
  key: string;
  label: string;
  /** 0 (always) to MAX_LEVEL (the widest panel only). */
  level: number;
  title?: string;
}

export const MAX_LEVEL = 4;

export const COLUMNS: IColumn[] = [
  { key: 'job', label: 'Job', level: 0 },
  { key: 'state', label: 'State', level: 0 },
  // Below level 1 the step shows under the state (.jp-tf-step-under).
  { key: 'step', label: 'Step', level: 1, title: 'latest reported step' },
  { key: 'throughput', label: 'Throughput', level: 1 },
  {
    key: 'util',
    label: 'Util.',
    level: 2,
    title: 'mean accelerator (GPU or CPU) utilization'
  },
  { key: 'cost', label: 'Cost', level: 3 },
  {
    key: 'ettr',
    label: 'ETTR',
    level: 3,
    title: 'effective training time ratio'
  },
  {
    key: 'checkpoint',
    label: 'Checkpoint',
    level: 2,
    title: 'step of the latest checkpoint'
  },
  { key: 'restarts', label: 'Restarts', level: 4 },
  { key: 'owner', label: 'Owner', level: 4 },
  { key: 'experiment', label: 'Experiment', level: 4 },
  { key: 'started', label: 'Started', level: 4 },
  { key: 'elapsed', label: 'Elapsed', level: 3 },
  { key: 'actions', label: '', level: 0 }
];

/** The class of a column's header and cells: its key and its level. */
export function columnClass(key: string): string {
  const column = COLUMNS.find(c => c.key === key);
  if (!column) {
    throw new Error(`No column ${key}.`);
  }
  return `jp-tf-col-${key} jp-tf-level-${column.level}`;
}

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

type Glyph = keyof typeof GLYPHS;

/** A 14 px icon for a button or link. */
function iconOf(glyph: Glyph): HTMLElement {
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
 */
function actionControl<K extends 'button' | 'a'>(
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

export class JobsPanel extends Widget {
  /**
   * @param model - the jobs; several panels (the sidebar's, one in the main area) can
   *   share one model, its filter and its poll.
   * @param actions - the dialogs, clipboard and notifications.
   */
  constructor(
    readonly model: JobsModel,
    readonly actions: IPanelActions
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
    this._removeView = model.addView(() => this.isVisible);
    model.changed.connect(this._render, this);
    this._render();
  }

  /**
   * What the header's "open in the main area" button does; the button shows only while
   * this is set (commands.ts sets it on the sidebar's panel).
   */
  get openInMain(): (() => void) | null {
    return this._openInMain;
  }

  set openInMain(run: (() => void) | null) {
    this._openInMain = run;
    this._expand.hidden = !run;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._removeView();
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  /** A closable panel (the main area's) is disposed when closed, a sidebar one stays. */
  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    if (this.title.closable) {
      this.dispose();
    }
  }

  protected onAfterShow(): void {
    this.model.refreshSoon();
  }

  private _header(): HTMLElement {
    const header = el('div', 'jp-tf-header');
    const top = el('div', 'jp-tf-header-top');
    const refresh = el('button', 'jp-tf-button jp-tf-icon-button');
    refresh.append(iconOf('refresh'));
    refresh.title = 'Read the jobs again now';
    refresh.setAttribute('aria-label', 'Refresh');
    refresh.dataset.action = 'refresh';
    refresh.onclick = () => this.model.refreshSoon();
    const expand = this._expand;
    expand.className = 'jp-tf-button jp-tf-icon-button';
    expand.append(iconOf('open'));
    expand.title = 'Open Training Jobs in the main area, with every column';
    expand.setAttribute('aria-label', 'Open in the main area');
    expand.dataset.action = 'open-main';
    expand.hidden = true;
    expand.onclick = () => this._openInMain?.();
    const tools = el('div', 'jp-tf-tools');
    tools.append(expand, refresh);
    top.append(el('h2', 'jp-tf-title', 'Training jobs'), tools);
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
    const state = this._stateFilter;
    state.className = 'jp-tf-filter';
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
    this._everyone.type = 'checkbox';
    this._everyone.onchange = () => {
      this.model.allUsers = this._everyone.checked;
    };
    everyone.append(this._everyone, document.createTextNode(" everyone's"));
    this._fields = [
      input('experiment', this._experiments),
      input('owner', this._owners)
    ];
    box.append(
      ...this._fields,
      state,
      everyone,
      this._experiments,
      this._owners
    );
    return box;
  }

  /** Show the model's filter in the fields (another panel of the model may have set it). */
  private _syncFilters(): void {
    const filter = this.model.filter;
    for (const field of this._fields) {
      const value = filter[field.dataset.filter as 'experiment' | 'owner'];
      if (field.value !== value && document.activeElement !== field) {
        field.value = value;
      }
    }
    if (this._stateFilter.value !== filter.state) {
      this._stateFilter.value = filter.state;
    }
    this._everyone.checked = this.model.allUsers;
  }

  private _render(): void {
    const model = this.model;
    this._renderServices(model.services);
    this._fillList(this._experiments, model.experiments);
    this._fillList(this._owners, model.owners);
    this._syncFilters();
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
    head.append(
      ...COLUMNS.map(c => {
        const th = el('th', columnClass(c.key), c.label);
        th.dataset.column = c.key;
        if (c.title) {
          th.title = c.title;
        }
        return th;
      })
    );
    table.append(el('thead'), el('tbody'));
    table.tHead!.append(head);
    table.tBodies[0].append(...jobs.map(job => this._row(job)));
    this._tableBox.append(table);
  }

  private _row(job: IJob): HTMLTableRowElement {
    const row = el('tr', 'jp-tf-row');
    row.dataset.jobId = job.id;
    const name = this._cell('job');
    name.append(
      el('div', 'jp-tf-name', job.name || job.id),
      el('div', 'jp-tf-id', job.id)
    );
    name.title = job.detail || `${job.name || job.id} (${job.id})`;
    const state = this._cell('state');
    const badge = el(
      'span',
      `jp-tf-state jp-tf-state-${job.state.toLowerCase()}`,
      job.state
    );
    badge.title = job.detail || job.state;
    state.append(badge);
    if (job.step !== null) {
      state.append(
        el('div', 'jp-tf-step-under', `step ${formatCount(job.step)}`)
      );
    }
    const history = job.history || [];
    row.append(
      name,
      state,
      this._cell('step', formatCount(job.step)),
      this._withSpark(
        'throughput',
        formatRate(job.throughput, job.throughput_unit),
        history.map(p => p[1])
      ),
      this._withSpark(
        'util',
        job.utilization_kind
          ? `${job.utilization_kind} ${formatPercent(job.utilization)}`
          : MISSING,
        history.map(p => p[2])
      ),
      this._cell('cost', formatCost(job.cost_usd), job.cost),
      this._cell('ettr', formatEttr(job.ettr), 'effective training time ratio'),
      this._cell(
        'checkpoint',
        job.checkpoint_step === null ? MISSING : `step ${job.checkpoint_step}`
      ),
      this._cell('restarts', String(job.restarts ?? 0)),
      this._cell('owner', job.owner || MISSING),
      this._cell('experiment', job.experiment || MISSING),
      this._cell('started', formatTime(job.started)),
      this._cell('elapsed', formatDuration(job.started, job.ended)),
      this._actions(job)
    );
    return row;
  }

  private _cell(key: string, text = '', title = ''): HTMLTableCellElement {
    const cell = el('td', columnClass(key), text);
    if (key === 'step') {
      cell.classList.add('jp-tf-num');
    }
    if (title) {
      cell.title = title;
    }
    return cell;
  }

  private _withSpark(
    key: string,
    text: string,
    values: Array<number | null>
  ): HTMLTableCellElement {
    const cell = this._cell(key, text);
    cell.classList.add('jp-tf-num');
    const spark = sparkline(
      values,
      `recent ${key === 'util' ? 'utilization' : key}`
    );
    if (spark) {
      cell.append(spark);
    }
    return cell;
  }

  private _actions(job: IJob): HTMLTableCellElement {
    const cell = this._cell('actions');
    const button = (
      action: string,
      label: string,
      title: string,
      icon: Glyph,
      run: () => unknown
    ) => {
      const b = actionControl('button', action, label, title, icon);
      b.onclick = () => void run();
      cell.append(b);
    };
    if (canStop(job)) {
      button('stop', 'Stop', 'Stop this job (asks first)', 'stop', () =>
        this._stop(job)
      );
    }
    if (canResume(job)) {
      button(
        'resume',
        'Resume',
        'Resume this job from its latest checkpoint',
        'resume',
        () => this._do(() => this.model.resume(job.id), `Resuming ${job.id}`)
      );
    }
    if (job.run_link) {
      const link = actionControl(
        'a',
        'mlflow',
        'MLflow',
        `Open the MLflow run (${job.run_url || 'through this server'})`,
        'open'
      );
      link.href = job.run_link;
      link.target = '_blank';
      link.rel = 'noopener';
      cell.append(link);
    }
    button(
      'copy',
      'Copy',
      `Copy "${attachCommand(job.id)}" for a notebook`,
      'copy',
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
  private _fields: HTMLInputElement[] = [];
  private _stateFilter = el('select');
  private _everyone = el('input');
  private _expand = el('button');
  private _openInMain: (() => void) | null = null;
  private _removeView: () => void;
}

namespace Private {
  let id = 0;
  export function nextId(): number {
    return ++id;
  }
}
