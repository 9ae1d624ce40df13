// Shared by the spec/native tests: deterministic data and small run helpers.
import { Params, packParams, type ParamValues } from "../../lib/gpu/params.ts";
import type { Bindings, Device, Dims } from "../../lib/shim.ts";

/** Deterministic pseudo-random numbers in [0, 1) (xorshift32). */
export function random(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 2 ** 32;
  };
}

export function selftestParams(values: Partial<ParamValues<typeof Params.Selftest>>): Uint8Array {
  return packParams(Params.Selftest, { n: 0, cols: 0, scale: 1, row_stride: 0, ...values });
}

/** One dispatch in its own command buffer, waited for. */
export function runOnce(dev: Device, kernel: string, grid: Dims, tg: Dims, bindings: Bindings, params?: Uint8Array): void {
  const cb = dev.commandBuffer();
  try {
    cb.dispatch(kernel, grid, tg, bindings, params).commit().waitUntilCompleted(30_000);
  } finally {
    cb.release();
  }
}

/** Same, with dispatchThreads semantics (grid counts threads). */
export function runThreads(dev: Device, kernel: string, threads: Dims, tg: Dims, bindings: Bindings, params?: Uint8Array): void {
  const cb = dev.commandBuffer();
  try {
    cb.dispatchThreads(kernel, threads, tg, bindings, params).commit().waitUntilCompleted(30_000);
  } finally {
    cb.release();
  }
}
