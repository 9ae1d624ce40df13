// The one place the engine's encode functions talk to the shim: every dispatch goes through
// `dispatch()` with ggml's fixed steps (params, pipeline, slot 0, buffers 1.., geometry).
import type { DType } from "../model/config.ts";
import type { Binding, Buffer, CommandBuffer, Device, Dims } from "../shim.ts";
import { writeParams, type ParamStruct, type ParamValues } from "./params.ts";
import type { LiveEncode, StepVars, Tape } from "./tape.ts";

/** What an encode function needs: the device and the command buffer being recorded. */
export interface EncodeContext {
  readonly device: Device;
  readonly cb: CommandBuffer;
  /** When set, dispatches are recorded on this tape instead of into cb (recorded-step.ts). */
  readonly tape?: Tape;
}

/**
 * Encodes the dispatches of `encode` that depend on the step's position (`vars.pos0`): at
 * once, and, when a step is being recorded, again at each replay with that step's vars.
 * `encode` must take the position from its `vars` argument only (a replay's check compares
 * it with a fresh encode: recorded-step.ts).
 */
export function live(ctx: EncodeContext, vars: StepVars, encode: LiveEncode): void {
  if (ctx.tape) ctx.tape.recordLive(ctx, vars, encode);
  else encode(ctx, vars);
}

/**
 * Encodes `encode`, whose live() calls take positions `delta` rows past the step's pos0
 * (vars.pos0 + delta): on a tape, each replay shifts the step's vars the same way.
 */
export function shiftedLive(ctx: EncodeContext, delta: number, encode: () => void): void {
  if (ctx.tape) ctx.tape.shifted(delta, encode);
  else encode();
}

/** A weight tensor inside a bound buffer (usually the wrapped dense.bin). */
export interface TensorRef {
  readonly buffer: Buffer;
  /** Byte offset of the tensor's first byte in `buffer`. For q4: the nibbles; scales and
   * biases follow (see docs/format.md). */
  readonly offset: number;
  readonly dtype: DType;
  /** [out, in] for matrices, [n] for vectors. */
  readonly shape: readonly number[];
}

/** A region of an activation buffer: rows of `stride` bytes starting at `offset`. */
export interface RowsRef {
  readonly buffer: Buffer;
  readonly offset: number;
  /** Bytes between consecutive rows. */
  readonly stride: number;
}

export const bind = (buffer: Buffer, offset = 0): Binding => (offset === 0 ? buffer : { buffer, offset });

/** Kernel name suffix of a storage dtype ("matvec_q4" etc.). */
export const dtypeSuffix = (d: DType) => d;

/**
 * Records one dispatch: packs `values` into `struct`'s bytes (bound at [[buffer(0)]]),
 * looks the pipeline up by name (cached by the device), binds `buffers` at indices 1..,
 * and dispatches `grid` threadgroups of `threadgroup` threads.
 */
export function dispatch<S extends ParamStruct>(
  ctx: EncodeContext,
  kernel: string,
  struct: S,
  values: ParamValues<S>,
  buffers: readonly Binding[],
  grid: Dims,
  threadgroup: Dims,
): void {
  // Every backend copies the params when the dispatch is encoded, so one buffer per struct
  // size serves every dispatch (no allocation per command).
  const scratch = paramScratch(struct.size);
  writeParams(struct, values, scratch.bytes, scratch.view);
  const pipeline = ctx.device.pipeline(kernel);
  if (ctx.tape) ctx.tape.dispatch(pipeline, grid, threadgroup, buffers, scratch.bytes, 1);
  else ctx.cb.dispatch(pipeline, grid, threadgroup, buffers, scratch.bytes, 1);
}

const scratchBySize = new Map<number, { bytes: Uint8Array; view: DataView }>();
function paramScratch(size: number): { bytes: Uint8Array; view: DataView } {
  let s = scratchBySize.get(size);
  if (!s) {
    const buffer = new ArrayBuffer(size);
    s = { bytes: new Uint8Array(buffer), view: new DataView(buffer) };
    scratchBySize.set(size, s);
  }
  return s;
}

/** One encode-commit-wait round trip, for tests and one-off transfers. */
export function runNow(device: Device, encode: (ctx: EncodeContext) => void, timeoutMs = 60_000): void {
  const cb = device.commandBuffer();
  try {
    encode({ device, cb });
    cb.commit().waitUntilCompleted(timeoutMs);
  } finally {
    cb.release();
  }
}
