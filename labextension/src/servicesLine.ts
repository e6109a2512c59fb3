/** The header's services line: a dot and a link per service, and "Start services" where they are ours to start. */

import { el } from './dom';
import { IServices } from './types';

/**
 * Fill `line` with `services` (empty while they are not known yet).
 *
 * @param start - starts the embedded services; the button shows only when they are
 *   embedded and not running, and comes back when `start` rejects.
 * @param onError - told the error when `start` rejects.
 */
export function renderServices(
  line: HTMLElement,
  services: IServices | null,
  start: () => Promise<unknown>,
  onError: (error: unknown) => void
): void {
  line.replaceChildren();
  if (!services) {
    return;
  }
  for (const s of services.services) {
    const item = el('span', `jp-tf-service jp-tf-service-${s.state}`);
    item.title = `${s.service}: ${s.state}${s.address && s.address !== '-' ? ` at ${s.address}` : ''}`;
    item.append(el('span', 'jp-tf-dot'));
    if (s.state === 'stopped') {
      item.append(document.createTextNode(`${s.service} stopped`));
    } else {
      const link = el(
        'a',
        'jp-tf-link',
        s.name === 'ray' ? 'Ray dashboard' : 'MLflow UI'
      );
      link.href = s.link;
      link.target = '_blank';
      link.rel = 'noopener';
      item.append(link);
    }
    line.append(item);
  }
  if (!services.running && services.embedded) {
    line.append(startButton(start, onError));
  }
}

/** "Start services": disabled and "Starting…" while `start` runs. */
function startButton(
  start: () => Promise<unknown>,
  onError: (error: unknown) => void
): HTMLButtonElement {
  const button = el('button', 'jp-tf-button jp-mod-accept', 'Start services');
  button.dataset.action = 'start-services';
  button.onclick = async () => {
    button.disabled = true;
    button.textContent = 'Starting…';
    try {
      await start();
    } catch (error) {
      onError(error);
      button.disabled = false;
      button.textContent = 'Start services';
    }
  };
  return button;
}
