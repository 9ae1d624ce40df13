// Counts what the LM head computes, seen from the command buffers themselves (not from the
// engine's own bookkeeping): every matvec or GEMM dispatch of a [vocab, d] weight (the LM head,
// or the tied embedding read as one; no other projection has that shape), with its batch rows,
// counted when its command buffer is committed (a step the engine prepared ahead and never
// committed ran nothing). Params.Matvec and Params.Gemm both begin with the i32s rows, in_dim,
// out_dim. A recorded step's dispatches reach a tape first (lib/gpu/recorded-step.ts); a tape's
// count moves to the command buffer the whole tape is encoded into (its first encode); later
// replays encode the LM head again in a live range, directly.
import { Tape } from "../../lib/gpu/tape.ts";
import { CommandBuffer, type Pipeline } from "../../lib/shim.ts";

export interface LmHeadCount {
  dispatches: number;
  rows: number;
}

/** Records LM-head dispatches until stop(), which restores the patched methods. */
export function countLmHead(shape: { vocab: number; d: number }): { count: LmHeadCount; stop(): LmHeadCount } {
  const count: LmHeadCount = { dispatches: 0, rows: 0 };
  const pending = new WeakMap<object, LmHeadCount>();
  const tapes = new WeakMap<ArrayBufferLike, Tape>();
  const add = (to: object, c: LmHeadCount) => {
    const p = pending.get(to) ?? { dispatches: 0, rows: 0 };
    p.dispatches += c.dispatches;
    p.rows += c.rows;
    pending.set(to, p);
  };
  const see = (to: object, pipeline: Pipeline | string, params: Uint8Array | undefined) => {
    const name = typeof pipeline === "string" ? pipeline : pipeline.name;
    if (/^(matvec|gemm)/.test(name) && !name.includes("multi") && params && params.byteLength >= 12) {
      const p = new DataView(params.buffer, params.byteOffset, 12);
      if (p.getInt32(4, true) === shape.d && p.getInt32(8, true) === shape.vocab) add(to, { dispatches: 1, rows: p.getInt32(0, true) });
    }
  };
  const { dispatch, encodeTape, commit } = CommandBuffer.prototype;
  const tapeDispatch = Tape.prototype.dispatch;
  CommandBuffer.prototype.dispatch = function (this: CommandBuffer, pipeline, grid, threadgroup, bindings, params, first = 0) {
    see(this, pipeline, params);
    return dispatch.call(this, pipeline, grid, threadgroup, bindings, params, first);
  };
  Tape.prototype.dispatch = function (this: Tape, pipeline, grid, threadgroup, bindings, params, first, byThreads) {
    see(this, pipeline, params);
    tapeDispatch.call(this, pipeline, grid, threadgroup, bindings, params, first, byThreads);
    tapes.set(this.words.buffer, this);
  };
  CommandBuffer.prototype.encodeTape = function (this: CommandBuffer, words, commands) {
    const tape = tapes.get(words.buffer);
    if (tape && words.byteOffset === 0 && words.length === tape.length) {
      const p = pending.get(tape);
      if (p) add(this, p);
      pending.delete(tape);
    }
    return encodeTape.call(this, words, commands);
  };
  CommandBuffer.prototype.commit = function (this: CommandBuffer) {
    const p = pending.get(this);
    if (p) {
      count.dispatches += p.dispatches;
      count.rows += p.rows;
      pending.delete(this);
    }
    return commit.call(this);
  };
  return {
    count,
    stop() {
      Object.assign(CommandBuffer.prototype, { dispatch, encodeTape, commit });
      Tape.prototype.dispatch = tapeDispatch;
      return count;
    },
  };
}
