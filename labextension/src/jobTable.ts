/** The job table: its header and one row per job, a cell per column (panel.ts supplies the actions cell). */

import { COLUMNS, columnCell, headerRow } from './columns';
import { el } from './dom';
import {
  formatCost,
  formatCount,
  formatDuration,
  formatEttr,
  formatNumber,
  formatPercent,
  formatRate,
  formatTime,
  MISSING
} from './format';
import { sparkline } from './sparkline';
import { IJob, ITrial } from './types';

/** The cell of the `actions` column for one job. */
export type ActionsCell = (job: IJob) => HTMLTableCellElement;

/** Which sweeps show their trials' rows, and the click that opens or closes one. */
export interface IExpansion {
  isOpen(id: string): boolean;
  toggle(id: string): void;
}

/**
 * A `table.jp-tf-table` of `jobs`, in their order, or null when there are none.
 *
 * @param actionsOf - builds each row's last cell (its stop, resume, MLflow and copy).
 * @param expansion - which sweeps show a `tr.jp-tf-trial` per trial under their row.
 */
export function jobTable(
  jobs: IJob[],
  actionsOf: ActionsCell,
  expansion?: IExpansion
): HTMLTableElement | null {
  if (jobs.length === 0) {
    return null;
  }
  const table = el('table', 'jp-tf-table');
  table.append(el('thead'), el('tbody'));
  table.tHead!.append(headerRow());
  table.tBodies[0].append(
    ...jobs.flatMap(job => {
      const row = jobRow(job, actionsOf, expansion);
      const open = job.trials && expansion?.isOpen(job.id);
      return open ? [row, ...job.trials!.map(t => trialRow(job, t))] : [row];
    })
  );
  return table;
}

/** One `tr.jp-tf-row` with its `data-job-id`: a cell per column, in COLUMNS' order. */
export function jobRow(
  job: IJob,
  actionsOf: ActionsCell,
  expansion?: IExpansion
): HTMLTableRowElement {
  const row = el('tr', 'jp-tf-row');
  row.dataset.jobId = job.id;
  const history = job.history || [];
  row.append(
    nameCell(job, expansion),
    stateCell(job),
    columnCell('step', formatCount(job.step)),
    withSpark(
      'throughput',
      formatRate(job.throughput, job.throughput_unit),
      history.map(p => p[1])
    ),
    withSpark(
      'util',
      job.utilization_kind
        ? `${job.utilization_kind} ${formatPercent(job.utilization)}`
        : MISSING,
      history.map(p => p[2])
    ),
    columnCell('cost', formatCost(job.cost_usd), job.cost),
    columnCell('ettr', formatEttr(job.ettr), 'effective training time ratio'),
    columnCell(
      'checkpoint',
      job.checkpoint_step === null ? MISSING : `step ${job.checkpoint_step}`
    ),
    columnCell('restarts', String(job.restarts ?? 0)),
    columnCell('owner', job.owner || MISSING),
    columnCell('experiment', job.experiment || MISSING),
    columnCell('started', formatTime(job.started)),
    columnCell('elapsed', formatDuration(job.started, job.ended)),
    actionsOf(job)
  );
  return row;
}

/**
 * The job's name above its id; the tooltip is its detail, else both. A sweep's also
 * has the `button.jp-tf-expand` that shows or hides its trials.
 */
function nameCell(job: IJob, expansion?: IExpansion): HTMLTableCellElement {
  const name = columnCell('job');
  name.append(
    el('div', 'jp-tf-name', job.name || job.id),
    el('div', 'jp-tf-id', job.id)
  );
  name.title = job.detail || `${job.name || job.id} (${job.id})`;
  if (job.trials && expansion) {
    const open = expansion.isOpen(job.id);
    const n = job.trials.length;
    const total = job.trials_total ?? n;
    const count = total > n ? `${n}/${total}` : String(n);
    const button = el(
      'button',
      'jp-tf-button jp-tf-expand',
      `${open ? '\u25BE' : '\u25B8'} ${count} trial${total === 1 ? '' : 's'}`
    );
    button.setAttribute('aria-expanded', String(open));
    button.title = open ? "Hide the sweep's trials" : "Show the sweep's trials";
    button.onclick = () => expansion.toggle(job.id);
    name.append(button);
  }
  return name;
}

/**
 * One `tr.jp-tf-trial` under its sweep's row (`data-job-id` the sweep's, `data-trial`
 * its index): the trial and its params, its state with the metric's latest value under
 * it, that value and its cost in their columns; stop and resume are the sweep's.
 */
export function trialRow(job: IJob, trial: ITrial): HTMLTableRowElement {
  const row = el('tr', 'jp-tf-row jp-tf-trial');
  row.dataset.jobId = job.id;
  row.dataset.trial = String(trial.index);
  const value = `${trial.metric} ${formatNumber(trial.value)}`;
  const name = columnCell('job');
  name.append(
    el('div', 'jp-tf-name', `trial ${trial.index}`),
    el('div', 'jp-tf-id', trial.params)
  );
  const state = columnCell('state');
  const early = trial.reason === 'early-stop';
  const badge = el(
    'span',
    `jp-tf-state jp-tf-state-${trial.state.toLowerCase()}`,
    early ? 'EARLY STOP' : trial.state
  );
  badge.title = early ? 'stopped early by the scheduler' : trial.reason;
  state.append(badge, el('div', 'jp-tf-step-under', value));
  const cells: Record<string, HTMLTableCellElement> = {
    job: name,
    state,
    step: columnCell('step', formatCount(trial.step ?? null)),
    throughput: columnCell('throughput', value),
    cost: columnCell('cost', formatCost(trial.cost_usd))
  };
  row.append(...COLUMNS.map(c => cells[c.key] ?? columnCell(c.key)));
  return row;
}

/**
 * The state's badge; under it what a PENDING job waits for, and for narrow panels where
 * the step column hides, the step.
 */
function stateCell(job: IJob): HTMLTableCellElement {
  const state = columnCell('state');
  const badge = el(
    'span',
    `jp-tf-state jp-tf-state-${job.state.toLowerCase()}`,
    job.state
  );
  badge.title = job.detail || job.state;
  state.append(badge);
  if (job.waiting) {
    const waiting = el('div', 'jp-tf-waiting');
    // a job id wraps as a whole, not at its hyphen
    for (const part of job.waiting.split(/(tf-[0-9a-f]{8})/)) {
      waiting.append(
        /^tf-/.test(part) ? el('span', 'jp-tf-nowrap', part) : part
      );
    }
    waiting.title = job.detail;
    state.append(waiting);
  }
  if (job.step !== null) {
    state.append(
      el('div', 'jp-tf-step-under', `step ${formatCount(job.step)}`)
    );
  }
  return state;
}

/** A numeric cell with a sparkline of its recent `values` (none when too few). */
function withSpark(
  key: string,
  text: string,
  values: Array<number | null>
): HTMLTableCellElement {
  const cell = columnCell(key, text);
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
