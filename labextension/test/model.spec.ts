import { TrainfactoryError } from '../src/errors';
import { JobsModel, messageOf } from '../src/model';
import { IJob, IServices, ITrainfactoryAPI } from '../src/types';
import { job } from './jobs';

const running: IServices = {
  services: [],
  running: true,
  embedded: true,
  state_dir: '/tmp/tf'
};

/** A fake server: answers from `jobs`, or fails with `failure`; records the calls. */
class FakeAPI implements ITrainfactoryAPI {
  jobsList: IJob[] = [];
  services_: IServices = running;
  failure: Error | null = null;
  calls: string[] = [];

  async jobs(all: boolean): Promise<IJob[]> {
    this.calls.push(`jobs all=${all}`);
    if (this.failure) {
      throw this.failure;
    }
    return this.jobsList;
  }
  async services(): Promise<IServices> {
    this.calls.push('services');
    if (this.failure) {
      throw this.failure;
    }
    return this.services_;
  }
  async stop(id: string, now: boolean): Promise<IJob> {
    this.calls.push(`stop ${id} now=${now}`);
    return this._update(job({ id, state: now ? 'STOPPED' : 'RUNNING' }));
  }
  async resume(id: string): Promise<IJob> {
    this.calls.push(`resume ${id}`);
    return this._update(job({ id, state: 'PENDING', resumes: 1 }));
  }
  private _update(changed: IJob): IJob {
    this.jobsList = this.jobsList.map(j => (j.id === changed.id ? changed : j));
    return changed;
  }
  async startServices(): Promise<IServices> {
    this.calls.push('start');
    this.services_ = running;
    return running;
  }
}

describe('JobsModel', () => {
  it('loads services and jobs, and signals the change', async () => {
    const api = new FakeAPI();
    api.jobsList = [
      job({ id: 'tf-00000001' }),
      job({ id: 'tf-00000002', owner: 'bob' })
    ];
    const model = new JobsModel(api);
    let changes = 0;
    model.changed.connect(() => changes++);
    expect(model.loaded).toBe(false);
    await model.refresh();
    expect(model.loaded).toBe(true);
    expect(model.error).toBe('');
    expect(model.jobs.map(j => j.id)).toEqual(['tf-00000001', 'tf-00000002']);
    expect(model.owners).toEqual(['alice', 'bob']);
    expect(changes).toBe(1);
    expect(api.calls).toEqual(['services', 'jobs all=false']);
  });

  it("asks for everyone's jobs when told to", async () => {
    const api = new FakeAPI();
    const model = new JobsModel(api);
    model.allUsers = true;
    await model.refresh();
    expect(api.calls).toContain('jobs all=true');
  });

  it('filters without asking the server again', async () => {
    const api = new FakeAPI();
    api.jobsList = [
      job({ id: 'tf-00000001', state: 'RUNNING' }),
      job({ id: 'tf-00000002', state: 'STOPPED' })
    ];
    const model = new JobsModel(api);
    await model.refresh();
    const before = api.calls.length;
    model.filter = { experiment: '', owner: '', state: 'STOPPED' };
    expect(model.visibleJobs.map(j => j.id)).toEqual(['tf-00000002']);
    expect(api.calls.length).toBe(before);
  });

  it('keeps a readable error when Ray or MLflow is away, and rejects for the backoff', async () => {
    const api = new FakeAPI();
    api.jobsList = [job()];
    const model = new JobsModel(api);
    await model.refresh();
    api.failure = new TrainfactoryError(
      503,
      'Cannot reach MLflow at http://127.0.0.1:1: refused'
    );
    await expect(model.refresh(true)).rejects.toThrow('Cannot reach MLflow');
    expect(model.error).toBe(
      'Ray or MLflow cannot be reached: Cannot reach MLflow at http://127.0.0.1:1: refused'
    );
    expect(model.jobs).toHaveLength(1); // the last answer stays visible
    api.failure = null;
    await model.refresh(true);
    expect(model.error).toBe('');
  });

  it('says when the services are not running instead of listing nothing', async () => {
    const api = new FakeAPI();
    api.services_ = { ...running, running: false };
    const model = new JobsModel(api);
    await model.refresh();
    expect(model.error).toMatch(/not running/);
    expect(api.calls).toEqual(['services']);
    await model.startServices();
    expect(model.error).toBe('');
    expect(api.calls).toContain('start');
  });

  it('stops and resumes through the server and shows the answer at once', async () => {
    const api = new FakeAPI();
    api.jobsList = [job({ id: 'tf-00000001', state: 'RUNNING' })];
    const model = new JobsModel(api);
    await model.refresh();
    const stopped = await model.stop('tf-00000001', true);
    expect(stopped.state).toBe('STOPPED');
    expect(model.jobs[0].state).toBe('STOPPED');
    const resumed = await model.resume('tf-00000001');
    expect(resumed.resumes).toBe(1);
    expect(model.jobs[0].state).toBe('PENDING');
    expect(api.calls).toContain('stop tf-00000001 now=true');
    expect(api.calls).toContain('resume tf-00000001');
    model.dispose();
  });

  it('polls while visible and stands by while hidden', async () => {
    const api = new FakeAPI();
    let visible = false;
    const model = new JobsModel(api, () => visible);
    model.start();
    await new Promise(resolve => setTimeout(resolve, 50));
    expect(api.calls).toEqual([]); // hidden: standby, no request
    visible = true;
    model.refreshSoon();
    await new Promise(resolve => setTimeout(resolve, 50));
    expect(api.calls).toContain('services');
    model.dispose();
  });
});

describe('messageOf', () => {
  it('gives one line for any error', () => {
    expect(
      messageOf(new TrainfactoryError(404, 'No job tf-1 is recorded'))
    ).toBe('No job tf-1 is recorded');
    expect(messageOf(new Error('boom'))).toBe('boom');
    expect(messageOf('text')).toBe('text');
  });
});
