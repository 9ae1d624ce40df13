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

/**
 * Bytes read from a model file do not match their checksum in cherenkov.json: the file was
 * corrupted or changed after it was written. Names the file, the tensor, and for an expert
 * record its layer and expert.
 */
export class ChecksumMismatchError extends ModelFormatError {
  override name = "ChecksumMismatchError";
  readonly layer?: number;
  readonly expert?: number;
  constructor(message: string, info: ModelFormatErrorInfo & { layer?: number; expert?: number }) {
    super(message, info);
    this.layer = info.layer;
    this.expert = info.expert;
  }
}

/**
 * NaN or infinity reached a point where the model's result depends on it (a router, the
 * logits): the weights or activations of that layer (or an earlier one) are not finite.
 * Raised by both backends instead of a bogus expert id or a silent token 0.
 */
export class NonFiniteError extends Error {
  override name = "NonFiniteError";
  constructor(
    message: string,
    /** The layer where it was detected (num_layers: the MTP head), or null for the output logits. */
    readonly layer: number | null,
  ) {
    super(message);
  }
}
