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
  /** Recent `[t (s), throughput, utilization]` points. */
  history: Array<[number, number | null, number | null]>;
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
}
