/** The panel's reliability line: ETTR, failures and MTTR of the fleet over a period, per unit in its tooltip. */

import { formatNumber } from './format';
import { IReliability, IReliabilityUnit } from './types';

/**
 * Fill `line` with the reliability `summary`, or a short muted `error` (the whole message
 * in the tooltip); hidden while `shown` is false (the services are not running).
 *
 * @param since - the period asked (`30d`), named while the first answer is awaited.
 */
export function renderReliability(
  line: HTMLElement,
  shown: boolean,
  since: string,
  summary: IReliability | null,
  error: string
): void {
  line.hidden = !shown;
  line.classList.toggle('jp-tf-reliability-error', !!error);
  const period = periodText(summary?.since_text ?? since);
  if (error) {
    line.textContent = `reliability, ${period}: not available (${error})`;
    line.title = error;
  } else if (!summary) {
    line.textContent = `reliability, ${period}: reading…`;
    line.title = 'Reading every job run of the period from MLflow';
  } else {
    line.textContent = `reliability, ${period}: ${summary.text}`;
    line.title = reliabilityTooltip(summary);
  }
}

/** `30d` -> `last 30 days`, `1h` -> `last hour`, '' -> `all time`, a date -> `since <date>`. */
export function periodText(since: string): string {
  const match = /^(\d+)([dh])$/.exec(since.trim());
  if (!match) {
    return since.trim() ? `since ${since.trim()}` : 'all time';
  }
  const n = Number(match[1]);
  const word = match[2] === 'd' ? 'day' : 'hour';
  return n === 1 ? `last ${word}` : `last ${n} ${word}s`;
}

/** One line per unit: its failure rate's text, its exposure, planned stops and drills; then the lemon nodes. */
export function reliabilityTooltip(summary: IReliability): string {
  const lines = summary.units.map(unitLine);
  if (summary.lemons.length) {
    lines.push(`lemon nodes: ${summary.lemons.join(', ')}`);
  }
  const jobs = `${summary.jobs} job${summary.jobs === 1 ? '' : 's'} started in the period`;
  return [jobs, ...lines].join('\n');
}

function unitLine(u: IReliabilityUnit): string {
  const exposure = `exposure ${formatNumber(u.exposure_days)} ${u.unit}-days`;
  const stops = u.stops
    ? `, ${u.stops} planned stop${u.stops === 1 ? '' : 's'}`
    : '';
  const drills = u.drills
    ? `, ${u.drills} drill${u.drills === 1 ? '' : 's'} (injected: not in the rate)`
    : '';
  return `${u.unit}: ${u.rate}; ${exposure}${stops}${drills}`;
}
