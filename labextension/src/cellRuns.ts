/** The panel follows the notebook: jobs are read again as soon as a cell has run, so a
 * `%train launch` or `stop` there shows at once, not at the next poll (REFRESH_MS). */

import { ISignal } from '@lumino/signaling';

/** Commands that run code: a notebook's cells (Shift+Enter, the toolbar, the Run menu)
 * and a console's. */
const RUN_COMMAND = /^(notebook:run-|console:run-|runmenu:run)/;

/** What `CommandRegistry.commandExecuted` emits: the command and its result, a promise
 * that settles when a run command's cells have run. */
export interface ICommandExecuted {
  readonly id: string;
  readonly result: Promise<unknown>;
}

/** The part of the application's command registry this needs. */
export interface ICommandsLike {
  readonly commandExecuted: ISignal<unknown, ICommandExecuted>;
}

/** The part of the jobs model this needs. */
export interface IRefreshable {
  readonly anyVisible: boolean;
  refreshSoon(): void;
}

/**
 * Refresh `model` once each run command's cells have run (failed or not), while the
 * panel is shown. Returns the function that stops it.
 */
export function refreshAfterCellRuns(
  commands: ICommandsLike,
  model: IRefreshable
): () => void {
  const onExecuted = (_: unknown, args: ICommandExecuted): void => {
    if (!RUN_COMMAND.test(args.id)) {
      return;
    }
    void Promise.resolve(args.result)
      .catch(() => undefined)
      .then(() => {
        if (model.anyVisible) {
          model.refreshSoon();
        }
      });
  };
  commands.commandExecuted.connect(onExecuted);
  return () => {
    commands.commandExecuted.disconnect(onExecuted);
  };
}
