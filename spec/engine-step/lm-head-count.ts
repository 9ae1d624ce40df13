// Counts what the LM head computes, seen from the command buffers themselves (not from the
// engine's own bookkeeping): every matvec or GEMM dispatch of a [vocab, d] weight (the LM head,
// or the tied embedding read as one; no other projection has that shape), with its batch rows.
// Params.Matvec and Params.Gemm both begin with the i32s rows, in_dim, out_dim. A recorded
// step's dispatches reach a tape first (lib/gpu/recorded-step.ts): both are counted, once each.
import { Tape } from "../../lib/gpu/tape.ts";
import { CommandBuffer, type Pipeline } from "../../lib/shim.ts";

export interface LmHeadCount {
  dispatches: number;
  rows: number;
}

/** Records LM-head dispatches until stop(), which restores the command buffer's dispatch. */
export function countLmHead(shape: { vocab: number; d: number }): { count: LmHeadCount; stop(): LmHeadCount } {
  const count: LmHeadCount = { dispatches: 0, rows: 0 };
  const see = (pipeline: Pipeline | string, params: Uint8Array | undefined) => {
    const name = typeof pipeline === "string" ? pipeline : pipeline.name;
    if (/^(matvec|gemm)/.test(name) && !name.includes("multi") && params && params.byteLength >= 12) {
      const p = new DataView(params.buffer, params.byteOffset, 12);
      if (p.getInt32(4, true) === shape.d && p.getInt32(8, true) === shape.vocab) {
        count.dispatches++;
        count.rows += p.getInt32(0, true);
      }
    }
  };
  const original = CommandBuffer.prototype.dispatch;
  CommandBuffer.prototype.dispatch = function (this: CommandBuffer, pipeline, grid, threadgroup, bindings, params, first = 0) {
    see(pipeline, params);
    return original.call(this, pipeline, grid, threadgroup, bindings, params, first);
  };
  const originalTape = Tape.prototype.dispatch;
  Tape.prototype.dispatch = function (this: Tape, pipeline, grid, threadgroup, bindings, params, first, byThreads) {
    see(pipeline, params);
    return originalTape.call(this, pipeline, grid, threadgroup, bindings, params, first, byThreads);
  };
  return {
    count,
    stop() {
      CommandBuffer.prototype.dispatch = original;
      Tape.prototype.dispatch = originalTape;
      return count;
    },
  };
}
