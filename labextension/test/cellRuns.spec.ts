import { Signal } from '@lumino/signaling';

import { ICommandExecuted, refreshAfterCellRuns } from '../src/cellRuns';

/** A command registry's `commandExecuted` alone. */
class FakeCommands {
  readonly commandExecuted = new Signal<unknown, ICommandExecuted>(this);
  run(id: string, result: Promise<unknown>): void {
    this.commandExecuted.emit({ id, result });
  }
}

/** Counts the refreshes asked for. */
class FakeModel {
  anyVisible = true;
  refreshes = 0;
  refreshSoon(): void {
    this.refreshes += 1;
  }
}

const settled = () => new Promise(resolve => setTimeout(resolve, 0));

describe('refreshAfterCellRuns', () => {
  it('reads the jobs again once a cell has run, not before', async () => {
    const commands = new FakeCommands();
    const model = new FakeModel();
    refreshAfterCellRuns(commands, model);
    let done: (value: unknown) => void = () => undefined;
    commands.run(
      'notebook:run-cell-and-select-next',
      new Promise(resolve => (done = resolve))
    );
    await settled();
    expect(model.refreshes).toBe(0); // the cell (a %train launch) still runs
    done(true);
    await settled();
    expect(model.refreshes).toBe(1);
  });

  it('also after a failed cell and a console run, never after other commands', async () => {
    const commands = new FakeCommands();
    const model = new FakeModel();
    refreshAfterCellRuns(commands, model);
    commands.run('notebook:run-all-cells', Promise.reject(new Error('boom')));
    commands.run('console:run-forced', Promise.resolve(true));
    commands.run('docmanager:save', Promise.resolve(true));
    commands.run('trainfactory:open-jobs', Promise.resolve(true));
    await settled();
    expect(model.refreshes).toBe(2);
  });

  it('asks nothing while the panel is hidden, and nothing once stopped', async () => {
    const commands = new FakeCommands();
    const model = new FakeModel();
    const stop = refreshAfterCellRuns(commands, model);
    model.anyVisible = false;
    commands.run('notebook:run-cell', Promise.resolve(true));
    await settled();
    expect(model.refreshes).toBe(0);
    model.anyVisible = true;
    stop();
    commands.run('notebook:run-cell', Promise.resolve(true));
    await settled();
    expect(model.refreshes).toBe(0);
  });
});
