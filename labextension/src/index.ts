/** jupyter-trainfactory: the "Training jobs" side panel and the BokehJS loader (plugin activation only). */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';

import { labActions } from './actions';
import { bokehPlugin } from './bokeh';
import { refreshAfterCellRuns } from './cellRuns';
import { addOpenInMainCommand } from './commands';
import { serverAPI } from './api';
import { trainfactoryIcon } from './icon';
import { JobsModel } from './model';
import { JobsPanel } from './panel';

/** Command that shows the panel. */
export const OPEN_COMMAND = 'trainfactory:open-jobs';
const PANEL_ID = 'jupyter-trainfactory-jobs';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-trainfactory:plugin',
  description:
    'Every training job at a glance, with stop, resume and the way to MLflow.',
  autoStart: true,
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    let panel: JobsPanel | null = null;
    const model = new JobsModel(serverAPI, () => !!panel?.isVisible);
    panel = new JobsPanel(model, labActions);
    panel.id = PANEL_ID;
    panel.title.icon = trainfactoryIcon;
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, PANEL_ID);
    addOpenInMainCommand(app, panel, palette, restorer);
    app.commands.addCommand(OPEN_COMMAND, {
      label: 'Show Training Jobs',
      caption: 'Open the side panel of training jobs',
      icon: trainfactoryIcon,
      execute: () => app.shell.activateById(PANEL_ID)
    });
    palette?.addItem({ command: OPEN_COMMAND, category: 'Training' });
    model.start();
    refreshAfterCellRuns(app.commands, model);
  }
};

export default [plugin, bokehPlugin];
