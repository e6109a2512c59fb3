/** The command that opens Training Jobs in the main area, where every column shows. */

import { ILayoutRestorer, JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette, WidgetTracker } from '@jupyterlab/apputils';

import { trainfactoryIcon } from './icon';
import { JobsPanel } from './panel';

export const OPEN_MAIN_COMMAND = 'trainfactory:open-jobs-main';
export const MAIN_PANEL_ID = 'jupyter-trainfactory-jobs-main';

/**
 * Add "Open Training Jobs in the main area": a second, closable panel of the sidebar
 * panel's model (the same jobs, filter and poll) in a main-area tab, restored after a
 * reload. The sidebar panel gets a header button that runs it.
 *
 * @param app - the application.
 * @param sidebar - the sidebar's panel, whose model and actions the new panel shares.
 * @param palette - where the command is listed, if present.
 * @param restorer - restores an open main-area panel after a reload, if present.
 */
export function addOpenInMainCommand(
  app: JupyterFrontEnd,
  sidebar: JobsPanel,
  palette: ICommandPalette | null,
  restorer: ILayoutRestorer | null
): void {
  const tracker = new WidgetTracker<JobsPanel>({
    namespace: 'jupyter-trainfactory-main'
  });
  app.commands.addCommand(OPEN_MAIN_COMMAND, {
    label: 'Open Training Jobs in the main area',
    caption: 'Every training job, with every column, in a main-area tab',
    icon: trainfactoryIcon,
    execute: () => {
      let panel = tracker.find(() => true);
      if (!panel) {
        panel = new JobsPanel(sidebar.model, sidebar.actions);
        panel.id = MAIN_PANEL_ID;
        panel.title.label = 'Training jobs';
        panel.title.icon = trainfactoryIcon;
        panel.title.closable = true;
        void tracker.add(panel);
        app.shell.add(panel, 'main');
      }
      app.shell.activateById(panel.id);
      return panel;
    }
  });
  palette?.addItem({ command: OPEN_MAIN_COMMAND, category: 'Training' });
  sidebar.openInMain = () => void app.commands.execute(OPEN_MAIN_COMMAND);
  if (restorer) {
    void restorer.restore(tracker, {
      command: OPEN_MAIN_COMMAND,
      name: () => 'jobs'
    });
  }
}
