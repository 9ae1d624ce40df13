// Helpers of the sequence-family kernel tests (deltanet, attention, ple) beyond harness.ts.
import { allocateKvCache, type KvCacheRef } from "../../lib/gpu/attention.ts";
import { KvCache } from "../../lib/reference/kvcache.ts";
import type { Buffer, Device } from "../../lib/shim.ts";
import { randomF32, worstErrors } from "./harness.ts";

/** With CHERENKOV_KERNEL_ERRORS=1, prints the largest error seen per kernel label (call in afterAll). */
export function printWorstErrors(): void {
  if (process.env.CHERENKOV_KERNEL_ERRORS !== "1") return;
  for (const [k, v] of [...worstErrors()].sort())
    console.log(`[kernel-error] ${k}\tmax abs ${v.maxAbs.toExponential(2)}\tmax rel ${v.maxRel.toExponential(2)}`);
}

/** A reference cache of `length` random positions (values in [-scale, scale)). */
export function randomKvCache(kind: "q8" | "f32", heads: number, dim: number, length: number, seed: number, scale = 1): KvCache {
  const c = new KvCache(kind, heads, dim);
  const x = randomF32(length * heads * dim, seed, scale, "cache");
  for (let p = 0; p < length; p++) c.append(x.subarray(p * heads * dim, (p + 1) * heads * dim));
  return c;
}

/** A reference KvCache's content in a device cache of the same kind and shape, room for `capacity` positions. */
export function uploadKvCache(dev: Device, ref: KvCache, capacity = ref.length): KvCacheRef {
  const c = allocateKvCache(dev, ref.kind, ref.heads, ref.dim, capacity);
  const n = ref.length * ref.heads * ref.dim;
  if (ref.kind === "q8") {
    (c.data as Buffer).bytes.set(new Uint8Array(ref.codes.buffer, 0, n));
    (c.scales as Buffer).f32.set(ref.scales.subarray(0, ref.length * ref.heads));
  } else {
    (c.data as Buffer).f32.set(ref.values.subarray(0, n));
  }
  return c;
}
