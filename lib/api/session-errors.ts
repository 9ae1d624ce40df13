// Errors of a session used concurrently or after close. A session is one sequence of tokens:
// two operations at once would interleave their tokens, so the second one is refused (not
// queued: a queued append would silently land inside the first one's answer).

/**
 * An operation was started while another one of the same session still runs (append, generate,
 * stream, checkpoint or reset during a generate or stream that has not finished). Await the
 * first one, break out of its stream, or use another session (`model.session()`).
 */
export class SessionBusyError extends Error {
  override name = "SessionBusyError";
  constructor(
    /** The operation refused. */
    readonly operation: string,
    /** The operation that is running. */
    readonly running: string,
  ) {
    super(`${operation}: the session is busy with ${running} (one operation at a time: await it, break out of its stream, or use another session)`);
  }
}

/** The session (or its model) is closed: every operation fails, and one that was running stops. */
export class SessionClosedError extends Error {
  override name = "SessionClosedError";
}
