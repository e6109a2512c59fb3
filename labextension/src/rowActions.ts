/** RowActions: a job row's stop, resume, MLflow and copy controls, and what each click does. */

import { IPanelActions } from './actions';
import { columnCell } from './columns';
import { attachCommand, canResume, canStop, startsOver } from './format';
import { actionControl, Glyph } from './glyphs';
import { JobsModel, messageOf } from './model';
import { IJob } from './types';

export class RowActions {
  /**
   * @param model - carries out stop and resume.
   * @param actions - the stop dialog, the clipboard and the notifications.
   */
  constructor(
    readonly model: JobsModel,
    readonly actions: IPanelActions
  ) {}

  /**
   * The `actions` cell of `job`'s row: Stop where it can stop, Resume where it can
   * resume, a link to its MLflow run where it has one, and Copy (its attach line).
   */
  cell(job: IJob): HTMLTableCellElement {
    const cell = columnCell('actions');
    const button = (
      action: string,
      label: string,
      title: string,
      icon: Glyph,
      run: () => unknown
    ) => {
      const b = actionControl('button', action, label, title, icon);
      b.onclick = () => void run();
      cell.append(b);
    };
    if (canStop(job)) {
      button('stop', 'Stop', 'Stop this job (asks first)', 'stop', () =>
        this.stop(job)
      );
    }
    if (canResume(job)) {
      button(
        'resume',
        'Resume',
        startsOver(job)
          ? 'It saved no checkpoint: start it over as a new job (asks first)'
          : 'Resume this job from its latest checkpoint',
        'resume',
        () => this.resume(job)
      );
    }
    if (job.run_link) {
      const link = actionControl(
        'a',
        'mlflow',
        'MLflow',
        `Open the MLflow run (${job.run_url || 'through this server'})`,
        'open'
      );
      link.href = job.run_link;
      link.target = '_blank';
      link.rel = 'noopener';
      cell.append(link);
    }
    button(
      'copy',
      'Copy',
      `Copy "${attachCommand(job.id)}" for a notebook`,
      'copy',
      () => this.copy(job)
    );
    return cell;
  }

  /** Ask how (the dialog), then stop the job gracefully or now; nothing when cancelled. */
  async stop(job: IJob): Promise<void> {
    const how = await this.actions.confirmStop(job);
    if (how === null) {
      return;
    }
    await this._do(
      () => this.model.stop(job.id, how === 'now'),
      stopMessage(job, how)
    );
  }

  /**
   * Resume the job from its latest checkpoint; one that saved none starts over as a new
   * job, asked first (nothing when cancelled).
   */
  async resume(job: IJob): Promise<void> {
    if (startsOver(job) && !(await this.actions.confirmStartOver(job))) {
      return;
    }
    try {
      const now = await this.model.resume(job.id);
      this.actions.notify(
        now.id === job.id
          ? `Resuming ${job.id}`
          : `${job.id} started over as ${now.id}`,
        'success'
      );
    } catch (error) {
      this.actions.notify(messageOf(error), 'error');
    }
  }

  /** Copy the job's `%train attach` line to the clipboard, and say so. */
  copy(job: IJob): void {
    this.actions.copy(attachCommand(job.id));
    this.actions.notify(`Copied: ${attachCommand(job.id)}`, 'info');
  }

  /** Run `call`; notify `message` on success, the error's message on failure. */
  private async _do(call: () => Promise<IJob>, message: string): Promise<void> {
    try {
      await call();
      this.actions.notify(message, 'success');
    } catch (error) {
      this.actions.notify(messageOf(error), 'error');
    }
  }
}

/** What the toast says once a stop was asked. */
export function stopMessage(job: IJob, how: 'graceful' | 'now'): string {
  if (how === 'now') {
    return `Stopping ${job.id} now`;
  }
  if (job.state === 'PENDING') {
    return `Stopping ${job.id}: it had not started training`;
  }
  return job.checkpoint_step === null
    ? `${job.id} stops at its next checkpoint, or when its loop checks should_stop()`
    : `${job.id} stops after its next checkpoint`;
}
