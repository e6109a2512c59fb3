/** JobsPanel: the "Training jobs" side panel, a Lumino widget rendering a JobsModel. */

import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { IPanelActions } from './actions';
import { el } from './dom';
import { JobFilters } from './filters';
import { iconOf } from './glyphs';
import { IExpansion, jobTable } from './jobTable';
import { JobsModel, messageOf, RELIABILITY_SINCE } from './model';
import { renderReliability } from './reliabilityLine';
import { RowActions } from './rowActions';
import { renderServices } from './servicesLine';

export class JobsPanel extends Widget {
  /**
   * @param model - the jobs; several panels (the sidebar's, one in the main area) can
   *   share one model, its filter and its poll.
   * @param actions - the dialogs, clipboard and notifications.
   */
  constructor(
    readonly model: JobsModel,
    readonly actions: IPanelActions
  ) {
    super();
    this.addClass('jp-tf-panel');
    this.title.caption = 'Training jobs';
    this._rowActions = new RowActions(model, actions);
    const header = this._header();
    this._filters = new JobFilters(model);
    this.node.append(
      header,
      this._filters.node,
      this._message,
      this._tableBox,
      this._reliabilityLine
    );
    this._tableBox.className = 'jp-tf-table-box';
    this._removeView = model.addView(() => this.isVisible);
    model.changed.connect(this._render, this);
    this._render();
  }

  /**
   * What the header's "open in the main area" button does; the button shows only while
   * this is set (commands.ts sets it on the sidebar's panel).
   */
  get openInMain(): (() => void) | null {
    return this._openInMain;
  }

  set openInMain(run: (() => void) | null) {
    this._openInMain = run;
    this._expand.hidden = !run;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._removeView();
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  /** A closable panel (the main area's) is disposed when closed, a sidebar one stays. */
  protected onCloseRequest(msg: Message): void {
    super.onCloseRequest(msg);
    if (this.title.closable) {
      this.dispose();
    }
  }

  protected onAfterShow(): void {
    this.model.refreshSoon();
  }

  /** The title, the "open in the main area" and refresh buttons, and the services line. */
  private _header(): HTMLElement {
    const header = el('div', 'jp-tf-header');
    const top = el('div', 'jp-tf-header-top');
    const refresh = el('button', 'jp-tf-button jp-tf-icon-button');
    refresh.append(iconOf('refresh'));
    refresh.title = 'Read the jobs again now';
    refresh.setAttribute('aria-label', 'Refresh');
    refresh.dataset.action = 'refresh';
    refresh.onclick = () => this.model.refreshSoon();
    const expand = this._expand;
    expand.className = 'jp-tf-button jp-tf-icon-button';
    expand.append(iconOf('open'));
    expand.title = 'Open Training Jobs in the main area, with every column';
    expand.setAttribute('aria-label', 'Open in the main area');
    expand.dataset.action = 'open-main';
    expand.hidden = true;
    expand.onclick = () => this._openInMain?.();
    const tools = el('div', 'jp-tf-tools');
    tools.append(expand, refresh);
    top.append(el('h2', 'jp-tf-title', 'Training jobs'), tools);
    header.append(top, this._servicesLine);
    this._servicesLine.className = 'jp-tf-services';
    return header;
  }

  private _render(): void {
    const model = this.model;
    renderServices(
      this._servicesLine,
      model.services,
      () => model.startServices(),
      error => this.actions.notify(messageOf(error), 'error')
    );
    this._filters.show();
    this._message.className = 'jp-tf-message';
    this._message.textContent = '';
    if (model.error) {
      this._message.classList.add('jp-tf-error');
      this._message.textContent = model.error;
    } else if (!model.loaded) {
      this._message.textContent = 'Loading training jobs…';
    } else if (model.jobs.length === 0) {
      this._message.classList.add('jp-tf-empty');
      this._message.textContent = model.allUsers
        ? 'No training jobs yet. Start one from a notebook with %train launch.'
        : 'You have no training jobs yet. Start one from a notebook with %train launch.';
    } else if (model.visibleJobs.length === 0) {
      this._message.classList.add('jp-tf-empty');
      this._message.textContent = 'No job matches the filter.';
    }
    const table = jobTable(
      model.visibleJobs,
      job => this._rowActions.cell(job),
      this._expansion
    );
    this._tableBox.replaceChildren(...(table ? [table] : []));
    renderReliability(
      this._reliabilityLine,
      !!model.services?.running,
      RELIABILITY_SINCE,
      model.reliability,
      model.reliabilityError
    );
  }

  /** The sweeps whose trials show, kept across renders. */
  private _open = new Set<string>();
  private _expansion: IExpansion = {
    isOpen: id => this._open.has(id),
    toggle: id => {
      if (!this._open.delete(id)) {
        this._open.add(id);
      }
      this._render();
    }
  };
  private _servicesLine = el('div');
  private _message = el('div', 'jp-tf-message');
  private _tableBox = el('div');
  private _reliabilityLine = el('div', 'jp-tf-reliability');
  private _expand = el('button');
  private _openInMain: (() => void) | null = null;
  private _filters: JobFilters;
  private _rowActions: RowActions;
  private _removeView: () => void;
}
