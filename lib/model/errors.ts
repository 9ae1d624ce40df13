// The one error a bad model directory raises. The message always starts with the file and,
// where it applies, the tensor or field, so a user knows exactly what to look at.

export interface ModelFormatErrorInfo {
  /** The file (or directory) at fault, e.g. "dense.bin" or "cherenkov.json". */
  file: string;
  /** The tensor, expert record or table concerned, when there is one. */
  tensor?: string;
  /** The manifest or config field concerned, e.g. "config.attention.head_dim". */
  field?: string;
}

export class ModelFormatError extends Error {
  override name = "ModelFormatError";
  readonly file: string;
  readonly tensor?: string;
  readonly field?: string;
  constructor(message: string, info: ModelFormatErrorInfo) {
    super(message);
    this.file = info.file;
    this.tensor = info.tensor;
    this.field = info.field;
  }
}
