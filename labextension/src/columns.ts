/** The job table's columns, the level (panel width) from which each shows, and their header and cells. */

import { el } from './dom';

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

/**
 * The class of a column's header and cells: its key and its level.
 *
 * @throws Error when no column has that key.
 */
export function columnClass(key: string): string {
  const column = COLUMNS.find(c => c.key === key);
  if (!column) {
    throw new Error(`No column ${key}.`);
  }
  return `jp-tf-col-${key} jp-tf-level-${column.level}`;
}

/** The header row: one `th` per column, with its `data-column` and title. */
export function headerRow(): HTMLTableRowElement {
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
  return head;
}

/**
 * A cell of column `key` (the step's is numeric, `jp-tf-num`).
 *
 * @param text - its text; none when ''.
 * @param title - its tooltip; none when ''.
 */
export function columnCell(
  key: string,
  text = '',
  title = ''
): HTMLTableCellElement {
  const cell = el('td', columnClass(key), text);
  if (key === 'step') {
    cell.classList.add('jp-tf-num');
  }
  if (title) {
    cell.title = title;
  }
  return cell;
}
