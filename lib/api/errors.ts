// Errors of the public API that are not about a model's files, its config or a session.

/** A method was called on a Model after close() (or the end of its `await using` scope). */
export class ModelClosedError extends Error {
  override name = "ModelClosedError";
}
