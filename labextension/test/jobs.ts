/** Test data: a job as the server sends it, with overrides. */

import { IJob } from '../src/types';

export function job(overrides: Partial<IJob> = {}): IJob {
  return {
    id: 'tf-0123abcd',
    name: 'digits',
    owner: 'alice',
    experiment: 'mnist',
    state: 'RUNNING',
    step: 120,
    throughput: 1520.4,
    throughput_unit: 'samples/s',
    utilization: 63.6,
    utilization_kind: 'CPU',
    cost_usd: null,
    cost: '',
    ettr: 0.934,
    checkpoint_step: 100,
    restarts: 0,
    resumes: 0,
    started: 1000,
    ended: null,
    run_url: 'http://127.0.0.1:5000/#/experiments/1/runs/abc',
    run_link: '/trainfactory/proxy/mlflow/#/experiments/1/runs/abc',
    detail: '',
    waiting: '',
    history: [],
    ...overrides
  };
}
