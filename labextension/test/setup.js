// jsdom has no DragEvent, which @lumino/dragdrop subclasses at import time.
if (typeof globalThis.DragEvent === 'undefined') {
  globalThis.DragEvent = class DragEvent extends MouseEvent {};
}
