// A tape: dispatches recorded as the words ck_encode_tape takes (metal-shim/include/
// cherenkov_tape.h), so a recorded step is encoded again with one native call instead of
// the TypeScript that produced it. `live` marks the ranges whose dispatches depend on the
// step's position: a replay runs their encode functions again (recorded-step.ts).
import { Buffer, dim, packBindings, type Bindings, type Dims, type Pipeline } from "../shim.ts";
import type { EncodeContext } from "./dispatch.ts";

/** Words of a command's header (CK_TAPE_HEADER_WORDS). */
const HEADER = 11;

/** What a live range depends on: the position of the step's first row (and a draft step's draws). */
export interface StepVars {
  readonly pos0: number;
  /**
   * A draft step's sampling (draft.ts): draws draft j from the MTP logits row just computed.
   * Its seed, penalties and positions change from call to call, so it is a var, encoded live.
   */
  readonly draw?: (ctx: EncodeContext, j: number) => void;
}

/** Encodes the dispatches of a live range for the step `vars` (again, at each replay). */
export type LiveEncode = (ctx: EncodeContext, vars: StepVars) => void;

/** A live range of the tape: words [start, end), commands [firstCommand, endCommand). */
export interface LiveRange {
  readonly start: number;
  readonly end: number;
  readonly firstCommand: number;
  readonly endCommand: number;
  readonly encode: LiveEncode;
}

export class Tape {
  #words = new Uint32Array(1 << 14);
  #bytes = new Uint8Array(this.#words.buffer);
  /** Words recorded. */
  length = 0;
  /** Commands recorded. */
  commands = 0;
  /** Every buffer a command binds (a replay refuses a tape whose buffers were released). */
  readonly buffers = new Set<Buffer>();
  readonly live: LiveRange[] = [];
  /** Kernel names of the commands recorded by dispatch() (diagnostics). */
  readonly #kernels: string[] = [];
  #liveStart: { start: number; firstCommand: number } | null = null;
  /** Rows the live ranges being recorded lie past the step's pos0 (shifted()). */
  #shift = 0;

  /** The recorded words (a view: valid until the next record). */
  get words(): Uint32Array {
    return this.#words.subarray(0, this.length);
  }

  /** Records a dispatch as CommandBuffer.dispatch / dispatchThreads would encode it. */
  dispatch(pipeline: Pipeline, grid: Dims, tg: Dims, bindings: Bindings, params: Uint8Array | undefined, first: number, byThreads = false): void {
    const count = first + bindings.length;
    const paramBytes = params?.byteLength ?? 0;
    const paramWords = (paramBytes + 3) >> 2;
    const at = this.#reserve(HEADER + 4 * count + paramWords);
    const w = this.#words;
    w[at] = byThreads ? 1 : 0;
    w[at + 1] = count;
    w[at + 2] = paramBytes;
    w[at + 3] = pipeline.handleLo;
    w[at + 4] = pipeline.handleHi;
    w[at + 5] = dim(grid, 0);
    w[at + 6] = dim(grid, 1);
    w[at + 7] = dim(grid, 2);
    w[at + 8] = dim(tg, 0);
    w[at + 9] = dim(tg, 1);
    w[at + 10] = dim(tg, 2);
    packBindings(w, at + HEADER, bindings, first);
    for (const b of bindings) if (b) this.buffers.add(b instanceof Buffer ? b : b.buffer);
    const p = at + HEADER + 4 * count;
    if (params) {
      w[p + paramWords - 1] = 0; // the padding bytes
      this.#bytes.set(params, 4 * p);
    }
    this.length = p + paramWords;
    this.commands++;
    this.#kernels.push(pipeline.name);
  }

  /** The kernel of command `index` when dispatch() recorded it. */
  kernelName(index: number): string | undefined {
    return this.#kernels[index];
  }

  /** Appends words [from, to) of `src` holding `commands` commands (a replay into a tape). */
  append(src: Tape, from: number, to: number, commands: number): void {
    const at = this.#reserve(to - from);
    this.#words.set(src.#words.subarray(from, to), at);
    this.length = at + to - from;
    this.commands += commands;
    for (const b of src.buffers) this.buffers.add(b);
  }

  /**
   * Records what `encode` dispatches for `vars` as a live range. Inside shifted(delta), vars
   * are the shifted ones (pos0 = the step's pos0 + delta): a replay passes them shifted too.
   */
  recordLive(ctx: EncodeContext, vars: StepVars, encode: LiveEncode): void {
    if (this.#liveStart) throw new Error("tape: a live range inside another");
    this.#liveStart = { start: this.length, firstCommand: this.commands };
    const delta = this.#shift;
    try {
      encode(ctx, vars);
    } finally {
      const { start, firstCommand } = this.#liveStart;
      this.#liveStart = null;
      const replayed: LiveEncode = delta === 0 ? encode : (ctx, v) => encode(ctx, { ...v, pos0: v.pos0 + delta });
      this.live.push({ start, end: this.length, firstCommand, endCommand: this.commands, encode: replayed });
    }
  }

  /** Runs `fn` with the live ranges it records `delta` rows past the step's pos0 (a draft step's MTP rows). */
  shifted(delta: number, fn: () => void): void {
    const outer = this.#shift;
    this.#shift = outer + delta;
    try {
      fn();
    } finally {
      this.#shift = outer;
    }
  }

  /** The first buffer a command binds that was released since, or null. */
  releasedBuffer(): Buffer | null {
    for (const b of this.buffers) if (b.released) return b;
    return null;
  }

  /** Index of the first word where `other` differs (or the shorter length), or -1 when equal. */
  firstDifference(other: Tape): number {
    const n = Math.min(this.length, other.length);
    const a = this.#words, b = other.#words;
    for (let i = 0; i < n; i++) if (a[i] !== b[i]) return i;
    return this.length === other.length ? -1 : n;
  }

  /** Start word and index of the command that holds word `word`. */
  commandAt(word: number): { index: number; start: number } {
    let at = 0;
    for (let i = 0; at < this.length; i++) {
      const next = at + HEADER + 4 * this.#words[at + 1]! + ((this.#words[at + 2]! + 3) >> 2);
      if (word < next) return { index: i, start: at };
      at = next;
    }
    return { index: this.commands, start: this.length };
  }

  #reserve(n: number): number {
    const at = this.length;
    if (at + n > this.#words.length) {
      const grown = new Uint32Array(Math.max(2 * this.#words.length, at + n));
      grown.set(this.#words.subarray(0, at));
      this.#words = grown;
      this.#bytes = new Uint8Array(grown.buffer);
    }
    return at;
  }
}
