/** Shapes of the server extension's JSON (jupyter_trainfactory/server/manager.py). */

/** The state shown to users (design: "Job states"). */
export type JobState =
  | 'PENDING'
  | 'RUNNING'
  | 'RESTARTING'
  | 'SUCCEEDED'
  | 'FAILED'
  | 'STOPPED'
  | 'UNKNOWN';

/** One job, as `GET trainfactory/jobs` lists it; values not recorded are null. */
export interface IJob {
  id: string;
  name: string;
  owner: string;
  experiment: string;
  state: JobState;
  step: number | null;
  /** Latest throughput in `throughput_unit` (samples/s or tokens/s). */
  throughput: number | null;
  throughput_unit: string;
  /** Mean utilization in % of `utilization_kind` (GPU or CPU). */
  utilization: number | null;
  utilization_kind: string;
  cost_usd: number | null;
  cost: string;
  /** Effective training time ratio, 0..1. */
  ettr: number | null;
  checkpoint_step: number | null;
  restarts: number;
  resumes: number;
  /** Seconds since the epoch. */
  started: number | null;
  ended: number | null;
  run_url: string;
  /** The MLflow run through this Jupyter server's proxy. */
  run_link: string;
  detail: string;
  /** A PENDING job's reason in a few words (`0 of 2 CPU free; held by job tf-...`); else empty. */
  waiting: string;
  /** Recent `[t (s), throughput, utilization]` points. */
  history: Array<[number, number | null, number | null]>;
  /** A sweep's trials, best first (null or absent for a job). */
  trials?: ITrial[] | null;
  /** The trials a sweep runs in all, started or not (null or absent for a job). */
  trials_total?: number | null;
}

/** One trial of a sweep (jupyter_trainfactory/sweeps/leaderboard.py `panel_trials`). */
export interface ITrial {
  index: number;
  /** The sampled values as text: `lr=0.01 hidden=64`. */
  params: string;
  state: JobState;
  /** `early-stop` for a trial ASHA stopped; else the stop or failure reason. */
  reason: string;
  /** The sweep's metric and its latest value (null before a report). */
  metric: string;
  value: number | null;
  /** The trial's furthest training step (null before one). */
  step?: number | null;
  cost_usd: number | null;
  run_id: string;
}

/** One service row of `GET trainfactory/services`. */
export interface IService {
  service: string;
  name: 'ray' | 'mlflow';
  state: 'running' | 'stopped' | 'remote';
  address: string;
  ui: string;
  link: string;
}

export interface IServices {
  services: IService[];
  running: boolean;
  embedded: boolean;
  state_dir: string;
}

/** One unit's row of the reliability summary (accelerator- or vCPU-days). */
export interface IReliabilityUnit {
  unit: string;
  exposure_days: number;
  infrastructure_failures: number;
  user_errors: number;
  /** Failures injected on purpose (`%train chaos`, the poc's kill): in no rate. */
  drills: number;
  /** Planned stops (`%train stop`, the panel's Stop, a budget), over the jobs' resumes. */
  stops: number;
  /** The failure rate with its 95 % interval, as text. */
  rate: string;
  mttr_p50_s: number | null;
  /** Goodput over wall time, 0..1. */
  ettr: number | null;
}

/**
 * `GET trainfactory/reliability?since=30d`: the fleet's reliability over the jobs started
 * in the period (jupyter_trainfactory/fleet/report.py `summary()`).
 */
export interface IReliability {
  /** The period as asked (`30d`, `12h`, a date; '' for every job). */
  since_text: string;
  /** Seconds since the epoch (null: since the first job). */
  since: number | null;
  until: number;
  jobs: number;
  units: IReliabilityUnit[];
  lemons: string[];
  /** One line: ETTR, infrastructure failures and MTTR per unit. */
  text: string;
}

/** What the table shows: a substring match on experiment and owner, a state or ''. */
export interface IJobFilter {
  experiment: string;
  owner: string;
  state: string;
}

/** The calls the panel makes (api.ts: the real server; a fake one in unit tests). */
export interface ITrainfactoryAPI {
  jobs(all: boolean): Promise<IJob[]>;
  services(): Promise<IServices>;
  stop(id: string, now: boolean): Promise<IJob>;
  resume(id: string): Promise<IJob>;
  startServices(): Promise<IServices>;
  /** The reliability summary of the jobs started since `since` (absent: no such line). */
  reliability?(since: string): Promise<IReliability>;
}
