/** JobsModel: the panel's data, refreshed by a Poll that backs off on errors and stands by when hidden. */

import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { TrainfactoryError } from './errors';
import { filterJobs } from './format';
import {
  IJob,
  IJobFilter,
  IReliability,
  IServices,
  ITrainfactoryAPI
} from './types';

/** Refresh interval (ms) while all is well, and the longest backoff after errors. */
export const REFRESH_MS = 3000;
export const MAX_BACKOFF_MS = 60000;
/** The reliability line's period (`chargeback.parse_since`'s text) and how often (ms) at
 * most it is read: the server reads every run of the period for it. */
export const RELIABILITY_SINCE = '30d';
export const RELIABILITY_MS = 30000;

export class JobsModel {
  /**
   * @param api - the server calls (the real server, or a fake in tests).
   * @param isVisible - whether the panel is shown; the poll stands by while it is not.
   */
  constructor(
    private readonly api: ITrainfactoryAPI,
    private readonly isVisible: () => boolean = () => true
  ) {}

  /** Emitted after every refresh or filter change. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** All jobs of the last refresh, newest first. */
  get jobs(): IJob[] {
    return this._jobs;
  }

  /** The jobs the filter lets through. */
  get visibleJobs(): IJob[] {
    return filterJobs(this._jobs, this._filter);
  }

  get services(): IServices | null {
    return this._services;
  }

  /** The last refresh's error message ('' when it succeeded). */
  get error(): string {
    return this._error;
  }

  /** The last reliability summary read (null until one is). */
  get reliability(): IReliability | null {
    return this._reliability;
  }

  /** The last reliability read's error message ('' when it succeeded). */
  get reliabilityError(): string {
    return this._reliabilityError;
  }

  /** Whether at least one refresh has finished (until then the panel says "Loading"). */
  get loaded(): boolean {
    return this._loaded;
  }

  get filter(): IJobFilter {
    return { ...this._filter };
  }

  set filter(filter: IJobFilter) {
    this._filter = { ...filter };
    this._changed.emit();
  }

  /** Everyone's jobs instead of the current user's. */
  get allUsers(): boolean {
    return this._allUsers;
  }

  set allUsers(value: boolean) {
    this._allUsers = value;
    void this.refresh();
  }

  /** Distinct values for the filter's choices. */
  get experiments(): string[] {
    return [...new Set(this._jobs.map(j => j.experiment))].sort();
  }

  get owners(): string[] {
    return [...new Set(this._jobs.map(j => j.owner))].sort();
  }

  /**
   * Whether a view of this model is shown: the `isVisible` of the constructor or one
   * registered with `addView` (the sidebar panel and one opened in the main area).
   */
  get anyVisible(): boolean {
    return this.isVisible() || [...this._views].some(v => v());
  }

  /**
   * Count a view's visibility in `anyVisible` (the poll runs while one is shown).
   * @returns a function that removes the view again.
   */
  addView(isVisible: () => boolean): () => void {
    this._views.add(isVisible);
    return () => {
      this._views.delete(isVisible);
    };
  }

  /** Start polling (idempotent). */
  start(): void {
    if (this._poll) {
      return;
    }
    this._poll = new Poll({
      factory: () => this.refresh(true),
      frequency: { interval: REFRESH_MS, backoff: true, max: MAX_BACKOFF_MS },
      standby: () => (this.anyVisible ? 'when-hidden' : true),
      name: 'jupyter-trainfactory:jobs'
    });
  }

  /** Refresh now, ahead of the poll's schedule. */
  refreshSoon(): void {
    if (this._poll) {
      void this._poll.refresh();
    } else {
      void this.refresh();
    }
  }

  /**
   * Read services and jobs once. With `rethrow` a failure rejects (so the poll backs
   * off); either way the error is kept for the panel to show.
   */
  async refresh(rethrow = false): Promise<void> {
    try {
      const services = await this.api.services();
      this._services = services;
      this._jobs = services.running ? await this.api.jobs(this._allUsers) : [];
      this._error = services.running
        ? ''
        : 'The local Ray head or MLflow server is not running.';
      if (services.running) {
        this._readReliability();
      }
    } catch (error) {
      this._error = messageOf(error);
      if (rethrow) {
        this._loaded = true;
        this._changed.emit();
        throw error;
      }
    }
    this._loaded = true;
    this._changed.emit();
  }

  /** Stop a job (after its next checkpoint, or `now`); returns the job after the request. */
  async stop(id: string, now: boolean): Promise<IJob> {
    return this._act(() => this.api.stop(id, now));
  }

  /**
   * Resume a STOPPED or FAILED job from its latest checkpoint; returns the job after the
   * request: a new one (another id) when it saved none and started over.
   */
  async resume(id: string): Promise<IJob> {
    return this._act(() => this.api.resume(id));
  }

  async startServices(): Promise<void> {
    this._services = await this.api.startServices();
    await this.refresh();
  }

  dispose(): void {
    this._poll?.dispose();
    this._poll = null;
    Signal.clearData(this);
  }

  /**
   * Read the reliability summary in the background when the last read began at least
   * RELIABILITY_MS ago and none is in flight; its answer or error arrives with `changed`
   * and never holds up the jobs.
   */
  private _readReliability(): void {
    const now = Date.now();
    if (
      !this.api.reliability ||
      this._reliabilityInFlight ||
      now - this._reliabilityAt < RELIABILITY_MS
    ) {
      return;
    }
    this._reliabilityAt = now;
    this._reliabilityInFlight = true;
    this.api
      .reliability(RELIABILITY_SINCE)
      .then(
        summary => {
          this._reliability = summary;
          this._reliabilityError = '';
        },
        error => {
          this._reliabilityError = messageOf(error);
        }
      )
      .finally(() => {
        this._reliabilityInFlight = false;
        this._changed.emit();
      });
  }

  private async _act(call: () => Promise<IJob>): Promise<IJob> {
    const job = await call();
    const known = this._jobs.some(j => j.id === job.id);
    this._jobs = known
      ? this._jobs.map(j => (j.id === job.id ? job : j))
      : [job, ...this._jobs]; // a job started over: newest first, as the server lists

    this._changed.emit();
    this.refreshSoon();
    return job;
  }

  private _changed = new Signal<this, void>(this);
  private _jobs: IJob[] = [];
  private _services: IServices | null = null;
  private _error = '';
  private _loaded = false;
  private _allUsers = false;
  private _filter: IJobFilter = { experiment: '', owner: '', state: '' };
  private _poll: Poll | null = null;
  private _reliability: IReliability | null = null;
  private _reliabilityError = '';
  private _reliabilityAt = -Infinity;
  private _reliabilityInFlight = false;
  private _views = new Set<() => boolean>();
}

/** A one-line message for the panel from any error. */
export function messageOf(error: unknown): string {
  if (error instanceof TrainfactoryError) {
    return error.status === 503
      ? `Ray or MLflow cannot be reached: ${error.message}`
      : error.message;
  }
  return error instanceof Error ? error.message : String(error);
}
