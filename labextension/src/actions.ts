/** The panel's interactions with the user: the stop confirmation, the clipboard, notifications. */

import {
  Clipboard,
  Dialog,
  Notification,
  showDialog
} from '@jupyterlab/apputils';

import { startOverText } from './format';
import { IJob } from './types';

/** What the panel asks of JupyterLab; tests and other front ends can pass their own. */
export interface IPanelActions {
  /** 'graceful' (after the next checkpoint), 'now', or null when cancelled. */
  confirmStop(job: IJob): Promise<'graceful' | 'now' | null>;
  /** Whether to start over a job that saved no checkpoint (see `startsOver`). */
  confirmStartOver(job: IJob): Promise<boolean>;
  copy(text: string): void;
  notify(message: string, kind: 'success' | 'error' | 'info'): void;
}

export const STOP_LABEL = 'Stop after checkpoint';
export const START_OVER_LABEL = 'Start over';
export const STOP_NOW_LABEL = 'Stop now';
export const STOP_WAITING_LABEL = 'Stop';

/** A job that has not started training has nothing to save: one stop, no choice. */
async function confirmStopWaiting(job: IJob): Promise<'graceful' | null> {
  const result = await showDialog({
    title: 'Stop training job',
    body:
      `Stop ${job.name || job.id} (${job.id})? It has not started training ` +
      '(nothing to save).',
    buttons: [
      Dialog.cancelButton(),
      Dialog.warnButton({ label: STOP_WAITING_LABEL })
    ]
  });
  return result.button.accept ? 'graceful' : null;
}

export const labActions: IPanelActions = {
  async confirmStop(job) {
    if (job.state === 'PENDING') {
      return confirmStopWaiting(job);
    }
    const graceful =
      job.checkpoint_step === null
        ? `"${STOP_LABEL}" ends it at its first checkpoint, or when its loop checks ` +
          'should_stop() (it has saved none yet: a resume starts over)'
        : `"${STOP_LABEL}" lets it save one more checkpoint (it can be resumed from there)`;
    const body =
      `Stop ${job.name || job.id} (${job.id})? ${graceful}; ` +
      `"${STOP_NOW_LABEL}" ends it at once.`;
    const result = await showDialog({
      title: 'Stop training job',
      body,
      buttons: [
        Dialog.cancelButton(),
        Dialog.warnButton({ label: STOP_NOW_LABEL }),
        Dialog.okButton({ label: STOP_LABEL })
      ]
    });
    if (!result.button.accept) {
      return null;
    }
    return result.button.label === STOP_NOW_LABEL ? 'now' : 'graceful';
  },
  async confirmStartOver(job) {
    const result = await showDialog({
      title: 'Resume training job',
      body: startOverText(job),
      buttons: [
        Dialog.cancelButton(),
        Dialog.okButton({ label: START_OVER_LABEL })
      ]
    });
    return result.button.accept;
  },
  copy(text) {
    Clipboard.copyToSystem(text);
  },
  notify(message, kind) {
    Notification.emit(message, kind, { autoClose: 5000 });
  }
};
