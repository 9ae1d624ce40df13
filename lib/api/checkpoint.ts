// Prefix checkpoints (DESIGN.md "Sequence state"): a compact copy of a session's state (no
// weights, pool slots or event counters) from which new sessions continue without running
// the prefix again. Opaque: only the model (and backend) that made it can resume it.
import type { BackendCheckpoint } from "./backend.ts";

export class Checkpoint {
  /** @internal */
  constructor(
    /** @internal The Model that made it (a checkpoint resumes only there). */
    readonly owner: object,
    /** @internal Where it was made, for error messages. */
    readonly origin: string,
    /** Every token of the session when it was made (a frozen copy: the checkpoint cannot be changed through it). */
    tokens: readonly number[],
    /** @internal The greedy next token after the last row, when the session knew it. */
    readonly prediction: number | null,
    /** @internal The backend's copy of the sequence state. */
    readonly state: BackendCheckpoint,
    /** @internal Where the assistant turn still open begins (the session's), or -1. */
    readonly openTurn: number = -1,
  ) {
    this.tokens = Object.freeze(tokens.slice());
  }

  /** Every token of the session when it was made (frozen). */
  readonly tokens: readonly number[];

  /** Tokens the checkpoint covers. */
  get length(): number {
    return this.tokens.length;
  }

  /** Bytes it holds: the backend's state copy plus the token ids. */
  get bytes(): number {
    return this.state.bytes + 4 * this.tokens.length;
  }
}
