/** el: the one way the panel's modules create an element with a class and a text. */

/**
 * A new element.
 *
 * @param tag - the element's tag name.
 * @param className - its class attribute; left unset when ''.
 * @param text - its text content; left unset when ''.
 */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}
