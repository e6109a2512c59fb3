/** TrainfactoryError: an error answer of the server extension. */

/** The HTTP status (0: no answer) and the server's one-line message. */
export class TrainfactoryError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}
