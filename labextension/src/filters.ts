/** JobFilters: the filter bar (experiment, owner, state, everyone's jobs) that reads and sets a JobsModel's filter. */

import { el } from './dom';
import { JobsModel } from './model';

/** The states the state filter offers, after "any state". */
const STATES = [
  'PENDING',
  'RUNNING',
  'RESTARTING',
  'SUCCEEDED',
  'FAILED',
  'STOPPED'
];

type TextFilter = 'experiment' | 'owner';

export class JobFilters {
  /** The bar, `div.jp-tf-filters`: its fields carry `data-filter`. */
  readonly node: HTMLElement;

  /** @param model - whose filter and `allUsers` the fields set. */
  constructor(readonly model: JobsModel) {
    this._experiments.id = `jp-tf-experiments-${Private.nextId()}`;
    this._owners.id = `jp-tf-owners-${Private.nextId()}`;
    const state = this._stateFilter;
    state.className = 'jp-tf-filter';
    state.dataset.filter = 'state';
    state.setAttribute('aria-label', 'Filter by state');
    for (const value of ['', ...STATES]) {
      const option = el('option', '', value || 'any state');
      option.value = value;
      state.append(option);
    }
    state.onchange = () => {
      this.model.filter = { ...this.model.filter, state: state.value };
    };
    const everyone = el('label', 'jp-tf-everyone');
    this._everyone.type = 'checkbox';
    this._everyone.onchange = () => {
      this.model.allUsers = this._everyone.checked;
    };
    everyone.append(this._everyone, document.createTextNode(" everyone's"));
    this._fields = [
      this._textField('experiment', this._experiments),
      this._textField('owner', this._owners)
    ];
    this.node = el('div', 'jp-tf-filters');
    this.node.append(
      ...this._fields,
      state,
      everyone,
      this._experiments,
      this._owners
    );
  }

  /**
   * Offer the model's experiments and owners as choices and show its filter in the
   * fields (another panel of the model may have set it); a field being typed in keeps
   * its text.
   */
  show(): void {
    const model = this.model;
    fillList(this._experiments, model.experiments);
    fillList(this._owners, model.owners);
    const filter = model.filter;
    for (const field of this._fields) {
      const value = filter[field.dataset.filter as TextFilter];
      if (field.value !== value && document.activeElement !== field) {
        field.value = value;
      }
    }
    if (this._stateFilter.value !== filter.state) {
      this._stateFilter.value = filter.state;
    }
    this._everyone.checked = model.allUsers;
  }

  /** A text field for `key`, its choices from `list`. */
  private _textField(key: TextFilter, list: HTMLDataListElement) {
    const field = el('input', 'jp-tf-filter');
    field.placeholder = key;
    field.setAttribute('aria-label', `Filter by ${key}`);
    field.dataset.filter = key;
    field.setAttribute('list', list.id);
    field.oninput = () => {
      this.model.filter = { ...this.model.filter, [key]: field.value };
    };
    return field;
  }

  private _experiments = el('datalist');
  private _owners = el('datalist');
  private _fields: HTMLInputElement[];
  private _stateFilter = el('select');
  private _everyone = el('input');
}

/** Replace `list`'s options with `values`. */
function fillList(list: HTMLDataListElement, values: string[]): void {
  list.replaceChildren(
    ...values.map(v => {
      const option = el('option');
      option.value = v;
      return option;
    })
  );
}

namespace Private {
  let id = 0;
  export function nextId(): number {
    return ++id;
  }
}
