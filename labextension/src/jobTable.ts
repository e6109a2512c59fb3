/** The job table: its header and one row per job, a cell per column (panel.ts supplies the actions cell). */

import { columnCell, headerRow } from './columns';
import { el } from './dom';
import {
  formatCost,
  formatCount,
  formatDuration,
  formatEttr,
  formatPercent,
  formatRate,
  formatTime,
  MISSING
} from './format';
import { sparkline } from './sparkline';
import { IJob } from './types';

/** The cell of the `actions` column for one job. */
export type ActionsCell = (job: IJob) => HTMLTableCellElement;

/**
 * A `table.jp-tf-table` of `jobs`, in their order, or null when there are none.
 *
 * @param actionsOf - builds each row's last cell (its stop, resume, MLflow and copy).
 */
export function jobTable(
  jobs: IJob[],
  actionsOf: ActionsCell
): HTMLTableElement | null {
  if (jobs.length === 0) {
    return null;
  }
  const table = el('table', 'jp-tf-table');
  table.append(el('thead'), el('tbody'));
  table.tHead!.append(headerRow());
  table.tBodies[0].append(...jobs.map(job => jobRow(job, actionsOf)));
  return table;
}

/** One `tr.jp-tf-row` with its `data-job-id`: a cell per column, in COLUMNS' order. */
export function jobRow(job: IJob, actionsOf: ActionsCell): HTMLTableRowElement {
  const row = el('tr', 'jp-tf-row');
  row.dataset.jobId = job.id;
  const history = job.history || [];
  row.append(
    nameCell(job),
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

/** The job's name above its id; the tooltip is its detail, else both. */
function nameCell(job: IJob): HTMLTableCellElement {
  const name = columnCell('job');
  name.append(
    el('div', 'jp-tf-name', job.name || job.id),
    el('div', 'jp-tf-id', job.id)
  );
  name.title = job.detail || `${job.name || job.id} (${job.id})`;
  return name;
}

/** The state's badge and, for narrow panels where the step column hides, the step under it. */
function stateCell(job: IJob): HTMLTableCellElement {
  const state = columnCell('state');
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
