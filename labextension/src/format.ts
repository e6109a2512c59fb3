/** Pure formatting of job fields for the table: numbers with units, "-" when not recorded. */

import { IJob, IJobFilter } from './types';

export const MISSING = '-';

/** `1234.5` -> `1.23k`: three significant digits with an SI suffix. */
export function formatNumber(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return MISSING;
  }
  const abs = Math.abs(value);
  for (const [size, suffix] of [
    [1e9, 'G'],
    [1e6, 'M'],
    [1e3, 'k']
  ] as Array<[number, string]>) {
    if (abs >= size) {
      return `${(value / size).toPrecision(3)}${suffix}`;
    }
  }
  if (abs === 0) {
    return '0';
  }
  return abs >= 100 ? value.toFixed(0) : value.toPrecision(3);
}

/** A count such as a step: `12,345` ("-" when not recorded). */
export function formatCount(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return MISSING;
  }
  return Math.round(value).toLocaleString('en-US');
}

/** Throughput with its unit: `1.23k samples/s`. */
export function formatRate(value: number | null, unit: string): string {
  const number = formatNumber(value);
  return number === MISSING ? MISSING : `${number} ${unit}`.trim();
}

/** A percentage (0..100) as `45 %`. */
export function formatPercent(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return MISSING;
  }
  return `${Math.round(value)} %`;
}

/** ETTR (a ratio 0..1) as a percentage. */
export function formatEttr(ettr: number | null): string {
  return ettr === null ? MISSING : formatPercent(ettr * 100);
}

/** US dollars: `$12.50`, below a dollar `$0.042`, below a cent `<$0.01`. */
export function formatCost(usd: number | null): string {
  if (usd === null || !Number.isFinite(usd)) {
    return MISSING;
  }
  if (usd > 0 && usd < 0.01) {
    return '<$0.01';
  }
  return usd < 1 && usd > 0 ? `$${usd.toPrecision(2)}` : `$${usd.toFixed(2)}`;
}

/** Elapsed time between two epoch times (s), `now` for a running job: `45 s`, `3m 05s`, `2h 01m`. */
export function formatDuration(
  started: number | null,
  ended: number | null,
  now: number = Date.now() / 1000
): string {
  if (started === null) {
    return MISSING;
  }
  const s = Math.max(0, Math.round((ended ?? now) - started));
  if (s < 60) {
    return `${s} s`;
  }
  const pad = (n: number) => String(n).padStart(2, '0');
  if (s < 3600) {
    return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  }
  return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
}

/** Local date and time of an epoch time (s). */
export function formatTime(epoch: number | null): string {
  if (epoch === null) {
    return MISSING;
  }
  const d = new Date(epoch * 1000);
  const pad = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

/** The notebook line that rebuilds the job's dashboard. */
export function attachCommand(id: string): string {
  return `%train attach ${id}`;
}

/** Whether the job still runs (it can be stopped) or ended (a STOPPED or FAILED one can be resumed). */
export function canStop(job: IJob): boolean {
  return ['PENDING', 'RUNNING', 'RESTARTING'].includes(job.state);
}

export function canResume(job: IJob): boolean {
  return job.state === 'STOPPED' || job.state === 'FAILED';
}

/** Jobs matching the filter: substrings (any case) of experiment and owner, and the exact state. */
export function filterJobs(jobs: IJob[], filter: IJobFilter): IJob[] {
  const experiment = filter.experiment.trim().toLowerCase();
  const owner = filter.owner.trim().toLowerCase();
  return jobs.filter(
    job =>
      (!experiment || job.experiment.toLowerCase().includes(experiment)) &&
      (!owner || job.owner.toLowerCase().includes(owner)) &&
      (!filter.state || job.state === filter.state)
  );
}

/** SVG polyline points of `values` scaled into a `width` x `height` box ('' under two values). */
export function sparklinePoints(
  values: Array<number | null>,
  width: number,
  height: number
): string {
  const known = values.filter(
    (v): v is number => v !== null && Number.isFinite(v)
  );
  if (known.length < 2) {
    return '';
  }
  const max = Math.max(...known);
  const min = Math.min(0, ...known);
  const span = max - min || 1;
  const step = width / (known.length - 1);
  return known
    .map((v, i) => {
      const x = i * step;
      const y = height - ((v - min) / span) * height;
      return `${+x.toFixed(1)},${+y.toFixed(1)}`;
    })
    .join(' ');
}

/**
 * A Resume of `job` trains from the start: it saved no checkpoint (a sweep resumes its
 * search whatever its trials saved). The server then starts it over as a new job.
 */
export function startsOver(job: IJob): boolean {
  return job.checkpoint_step === null && !job.trials_total;
}

/** What Resume does to a job that saved no checkpoint, said before it happens. */
export function startOverText(job: IJob): string {
  return (
    `${job.name || job.id} (${job.id}) saved no checkpoint, so there is nothing to ` +
    'resume from. "Start over" trains it again from the first step as a new job, ' +
    `with its own MLflow run linked to this one; ${job.id}'s record stays as it is.`
  );
}
