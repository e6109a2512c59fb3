import {
  attachCommand,
  canResume,
  canStop,
  filterJobs,
  formatCost,
  formatCount,
  formatDuration,
  formatEttr,
  formatNumber,
  formatPercent,
  formatRate,
  sparklinePoints
} from '../src/format';
import { job } from './jobs';

describe('numbers with units', () => {
  it('uses three significant digits and SI suffixes', () => {
    expect(formatNumber(1520.4)).toBe('1.52k');
    expect(formatNumber(2.5e6)).toBe('2.50M');
    expect(formatNumber(512)).toBe('512');
    expect(formatNumber(3.14159)).toBe('3.14');
    expect(formatNumber(0)).toBe('0');
  });

  it('shows "-" for what was not recorded, never a fake 0', () => {
    expect(formatNumber(null)).toBe('-');
    expect(formatNumber(NaN)).toBe('-');
    expect(formatRate(null, 'samples/s')).toBe('-');
    expect(formatPercent(null)).toBe('-');
    expect(formatEttr(null)).toBe('-');
    expect(formatCost(null)).toBe('-');
  });

  it('shows steps as whole numbers', () => {
    expect(formatCount(40)).toBe('40');
    expect(formatCount(12345)).toBe('12,345');
    expect(formatCount(null)).toBe('-');
  });

  it('formats throughput, utilization, ETTR and cost', () => {
    expect(formatRate(1520.4, 'samples/s')).toBe('1.52k samples/s');
    expect(formatPercent(63.6)).toBe('64 %');
    expect(formatEttr(0.934)).toBe('93 %');
    expect(formatCost(12.5)).toBe('$12.50');
    expect(formatCost(0.0421)).toBe('$0.042');
    expect(formatCost(0.00009)).toBe('<$0.01');
    expect(formatCost(0)).toBe('$0.00');
  });

  it('formats elapsed time of running and ended jobs', () => {
    expect(formatDuration(1000, null, 1045)).toBe('45 s');
    expect(formatDuration(1000, 1185, 99999)).toBe('3m 05s');
    expect(formatDuration(1000, 1000 + 7260)).toBe('2h 01m');
    expect(formatDuration(null, null)).toBe('-');
  });
});

describe('job actions', () => {
  it('offers stop to live jobs and resume to stopped or failed ones', () => {
    expect(canStop(job({ state: 'RUNNING' }))).toBe(true);
    expect(canStop(job({ state: 'PENDING' }))).toBe(true);
    expect(canStop(job({ state: 'STOPPED' }))).toBe(false);
    expect(canResume(job({ state: 'STOPPED' }))).toBe(true);
    expect(canResume(job({ state: 'FAILED' }))).toBe(true);
    expect(canResume(job({ state: 'SUCCEEDED' }))).toBe(false);
    expect(canResume(job({ state: 'RUNNING' }))).toBe(false);
  });

  it('builds the notebook line that attaches to a job', () => {
    expect(attachCommand('tf-0123abcd')).toBe('%train attach tf-0123abcd');
  });
});

describe('filterJobs', () => {
  const jobs = [
    job({
      id: 'tf-00000001',
      experiment: 'mnist',
      owner: 'alice',
      state: 'RUNNING'
    }),
    job({
      id: 'tf-00000002',
      experiment: 'tiny-gpt',
      owner: 'bob',
      state: 'STOPPED'
    }),
    job({
      id: 'tf-00000003',
      experiment: 'tiny-gpt',
      owner: 'alice',
      state: 'FAILED'
    })
  ];
  const ids = (filter: {
    experiment?: string;
    owner?: string;
    state?: string;
  }) =>
    filterJobs(jobs, { experiment: '', owner: '', state: '', ...filter }).map(
      j => j.id
    );

  it('matches experiment and owner by substring, any case, and the exact state', () => {
    expect(ids({})).toEqual(['tf-00000001', 'tf-00000002', 'tf-00000003']);
    expect(ids({ experiment: 'GPT' })).toEqual(['tf-00000002', 'tf-00000003']);
    expect(ids({ owner: 'ali' })).toEqual(['tf-00000001', 'tf-00000003']);
    expect(ids({ experiment: 'gpt', owner: 'alice' })).toEqual(['tf-00000003']);
    expect(ids({ state: 'STOPPED' })).toEqual(['tf-00000002']);
    expect(ids({ state: 'RUN' })).toEqual([]);
  });
});

describe('sparklinePoints', () => {
  it('scales values into the box, from zero up to the maximum', () => {
    expect(sparklinePoints([0, 5, 10], 20, 10)).toBe('0,10 10,5 20,0');
  });

  it('skips missing values and needs two points', () => {
    expect(sparklinePoints([null, 4, null, 8], 10, 10)).toBe('0,5 10,0');
    expect(sparklinePoints([3], 10, 10)).toBe('');
    expect(sparklinePoints([], 10, 10)).toBe('');
  });
});
