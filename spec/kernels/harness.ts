// Shared helpers of the per-kernel tests (spec/kernels/*.test.ts): seeded data, weights
// stored in every dtype the format has (with the values the reference must see), device
// buffers, one-shot runs and tolerance checks that say where and by how much a kernel is off.
//
// Stable API (other kernel families import it): NB_CASES, rng, randomF32, randomTokens,
// openDevice, hostTensor, uploadWeights, uploadWeight, uploadF32, uploadI32, outputF32,
// outputI32, readF32, readI32, run, expectClose, compareClose, expectExact, rows, worstErrors.
import { afterEach, expect } from "bun:test";
import { appendFileSync } from "node:fs";

import type { DType } from "../../lib/model/config.ts";
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from "../../lib/model/dtype.ts";
import { dequantizeQ4, quantizeQ4 } from "../../lib/model/q4.ts";
import { Rng } from "../../lib/model/rng.ts";
import { tensorBytes } from "../../lib/model/tensors.ts";
import { runNow, type EncodeContext, type RowsRef, type TensorRef } from "../../lib/gpu/dispatch.ts";
import { MAX_NB } from "../../lib/gpu/limits.ts";
import { Device, type Buffer } from "../../lib/shim.ts";

/** The row counts every kernel runs at: decode, tiny batches, an odd batch, the largest step. */
export const NB_CASES = [1, 2, 5, MAX_NB] as const;

/** A seeded generator; the same (seed, stream) gives the same numbers on every machine. */
export const rng = (seed: number, stream = "") => new Rng(seed, stream);

/** n values uniform in [-scale, scale). */
export function randomF32(n: number, seed: number, scale = 1, stream = "f32"): Float32Array {
  const r = rng(seed, stream);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = r.symmetric() * scale;
  return out;
}

/** n token ids in [0, vocab). */
export function randomTokens(n: number, vocab: number, seed: number): Int32Array {
  const r = rng(seed, "tokens");
  return Int32Array.from({ length: n }, () => r.int(vocab));
}

/** The device the tests run on (CHERENKOV_BACKEND, default cpu off macOS). Close it in afterAll. */
export function openDevice(): Device {
  return Device.open();
}

// ---- weights -------------------------------------------------------------------------

/** A weight as stored on disk, and the f32 values the reference computes with (dequantized). */
export interface HostTensor {
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly bytes: Uint8Array;
  /** The stored values read back as f32: what the reference must use to be comparable. */
  readonly values: Float32Array;
}

/** Stores `values` as `dtype` (q4: affine g32 along the last dim; bf16/f16: rounded). */
export function hostTensor(values: Float32Array, dtype: DType, shape: readonly number[]): HostTensor {
  const n = shape.reduce((a, b) => a * b, 1);
  if (values.length !== n) throw new Error(`hostTensor: ${values.length} values for shape [${shape.join(", ")}]`);
  switch (dtype) {
    case "f32":
      return { dtype, shape, bytes: new Uint8Array(values.slice().buffer), values: values.slice() };
    case "bf16": {
      const bits = f32ToBf16(values);
      return { dtype, shape, bytes: new Uint8Array(bits.buffer), values: bf16ToF32(bits) };
    }
    case "f16": {
      const bits = f32ToF16(values);
      return { dtype, shape, bytes: new Uint8Array(bits.buffer), values: f16ToF32(bits) };
    }
    case "q4": {
      const bytes = quantizeQ4(values);
      return { dtype, shape, bytes, values: dequantizeQ4(bytes, n) };
    }
  }
}

/**
 * Packs tensors into one buffer as dense.bin holds them (each at an aligned offset, the
 * first one not at 0 so offsets are exercised) and returns a TensorRef per name.
 */
export function uploadWeights<K extends string>(
  dev: Device,
  tensors: Record<K, HostTensor>,
  align = 256,
): { buffer: Buffer; refs: Record<K, TensorRef> } {
  const up = (x: number) => Math.ceil(x / align) * align;
  let end = align;
  const offsets = {} as Record<K, number>;
  for (const name of Object.keys(tensors) as K[]) {
    const t = tensors[name];
    if (t.bytes.byteLength !== tensorBytes(t.shape, t.dtype)) throw new Error(`uploadWeights: ${name} has a wrong byte length`);
    offsets[name] = end;
    end = up(end + t.bytes.byteLength);
  }
  const buffer = dev.buffer(end + align);
  const refs = {} as Record<K, TensorRef>;
  for (const name of Object.keys(tensors) as K[]) {
    const t = tensors[name];
    buffer.bytes.set(t.bytes, offsets[name]);
    refs[name] = { buffer, offset: offsets[name], dtype: t.dtype, shape: t.shape };
  }
  return { buffer, refs };
}

/** One weight in its own buffer: random values in [-scale, scale) stored as `dtype`. */
export function uploadWeight(
  dev: Device,
  dtype: DType,
  shape: readonly number[],
  seed: number,
  scale = 1,
): { ref: TensorRef; host: HostTensor } {
  const n = shape.reduce((a, b) => a * b, 1);
  const host = hostTensor(randomF32(n, seed, scale, `weight-${shape.join("x")}`), dtype, shape);
  const { refs } = uploadWeights(dev, { w: host });
  return { ref: refs.w, host };
}

// ---- activations ---------------------------------------------------------------------

/** A shared buffer holding `data` (padded with `padBytes` of NaN-free zeros). */
export function uploadF32(dev: Device, data: Float32Array, padBytes = 0): Buffer {
  const b = dev.buffer(Math.max(4, data.byteLength + padBytes));
  b.f32.set(data);
  return b;
}

export function uploadI32(dev: Device, data: Int32Array | readonly number[]): Buffer {
  const b = dev.buffer(Math.max(4, data.length * 4));
  b.i32.set(data);
  return b;
}

/**
 * An output buffer of n floats pre-filled with NaN, plus `guard` NaN floats after it:
 * an element the kernel forgets to write stays NaN and fails the comparison, and
 * expectGuard() checks nothing was written past the end.
 */
export function outputF32(dev: Device, n: number, guard = 16): Buffer {
  const b = dev.buffer((n + guard) * 4);
  b.f32.fill(Number.NaN);
  return b;
}

/** An i32 output pre-filled with -7 (an id no kernel writes). */
export function outputI32(dev: Device, n: number, guard = 16): Buffer {
  const b = dev.buffer((n + guard) * 4);
  b.i32.fill(-7);
  return b;
}

/** Throws unless the `guard` floats after the first n are still NaN (nothing written past the end). */
export function expectGuard(b: Buffer, n: number, guard = 16): void {
  for (let i = n; i < n + guard; i++) if (!Number.isNaN(b.f32[i]!)) throw new Error(`wrote past the end: element ${i} = ${b.f32[i]}`);
}

/** A copy of n floats from `offset` floats into the buffer. */
export const readF32 = (b: Buffer, n: number, offset = 0) => b.f32.slice(offset, offset + n);
/** The bit patterns of `count` 32-bit words of `b` from byte `offset` (bit-for-bit comparisons). */
export const bitsOf = (b: Buffer, count: number, offset = 0) => [...new Uint32Array(b.bytes.buffer, b.bytes.byteOffset + offset, count)];

/** Puts each of these environment variables back as it was when the file loaded, after every test (the tests set them). */
export function restoreEnvAfterEach(...names: string[]): void {
  const saved = Object.fromEntries(names.map((k) => [k, process.env[k]]));
  afterEach(() => {
    for (const k of names) {
      if (saved[k] === undefined) delete process.env[k];
      else process.env[k] = saved[k];
    }
  });
}
export const readI32 = (b: Buffer, n: number, offset = 0) => b.i32.slice(offset, offset + n);

/** A RowsRef over a contiguous [nb][width] f32 region of `buffer`. */
export const rows = (buffer: Buffer, width: number, offset = 0): RowsRef => ({ buffer, offset, stride: width * 4 });

/** Encodes, commits and waits (errors from the command buffer are thrown). */
export function run(dev: Device, encode: (ctx: EncodeContext) => void): void {
  runNow(dev, encode, 120_000);
}

export { recordingNames } from "../dispatch-names.ts";

// ---- comparison ----------------------------------------------------------------------

/**
 * Tolerance of one comparison: element i passes when |a - e| <= abs + rel * |e| +
 * relMax * max|e| (relMax scales with the largest expected value: for sums whose terms
 * cancel, where a per-element relative bound would be unfair).
 */
export interface Tolerance {
  abs?: number;
  rel?: number;
  relMax?: number;
}

export interface Comparison {
  /** Largest |a - e|. */
  maxAbs: number;
  /** Largest |a - e| / max(|e|, 1e-30) over elements whose |e| is at least 1e-3 * max|e|. */
  maxRel: number;
  /** Index of the element furthest outside its tolerance (or of maxAbs when all pass). */
  worst: number;
  failures: number;
}

export function compareClose(actual: ArrayLike<number>, expected: ArrayLike<number>, tol: Tolerance): Comparison {
  if (actual.length < expected.length) throw new Error(`compareClose: ${actual.length} values, expected ${expected.length}`);
  let peak = 0;
  for (let i = 0; i < expected.length; i++) peak = Math.max(peak, Math.abs(expected[i]!));
  const base = (tol.abs ?? 0) + (tol.relMax ?? 0) * peak;
  let maxAbs = 0;
  let maxRel = 0;
  let worst = 0;
  let worstExcess = -Infinity;
  let failures = 0;
  for (let i = 0; i < expected.length; i++) {
    const a = actual[i]!;
    const e = expected[i]!;
    const err = Math.abs(a - e);
    const bound = base + (tol.rel ?? 0) * Math.abs(e);
    const bad = !(err <= bound); // NaN fails
    if (bad) failures++;
    const excess = Number.isNaN(err) ? Infinity : err - bound;
    if (excess > worstExcess) {
      worstExcess = excess;
      worst = i;
    }
    if (!Number.isNaN(err)) {
      maxAbs = Math.max(maxAbs, err);
      if (Math.abs(e) >= 1e-3 * peak && e !== 0) maxRel = Math.max(maxRel, err / Math.abs(e));
    } else maxAbs = Infinity;
  }
  return { maxAbs, maxRel, worst, failures };
}

const worstSeen = new Map<string, { maxAbs: number; maxRel: number }>();

/** Largest errors seen per label in this process. */
export function worstErrors(): ReadonlyMap<string, { maxAbs: number; maxRel: number }> {
  return worstSeen;
}

/** CHERENKOV_KERNEL_ERRORS=<file>: every comparison appends "label, max abs, max rel" to it (for reports). */
const ERROR_LOG = process.env.CHERENKOV_KERNEL_ERRORS;

/**
 * Fails the test with the worst element (index, row and column when `width` is given,
 * actual and expected) unless every element is within `tol`. `label` names the kernel
 * for the error summary (worstErrors). Returns the comparison.
 */
export function expectClose(
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  tol: Tolerance,
  label: string,
  width?: number,
): Comparison {
  const c = compareClose(actual, expected, tol);
  const key = label.split(" ")[0]!;
  const prev = worstSeen.get(key);
  worstSeen.set(key, { maxAbs: Math.max(prev?.maxAbs ?? 0, c.maxAbs), maxRel: Math.max(prev?.maxRel ?? 0, c.maxRel) });
  if (ERROR_LOG) appendFileSync(ERROR_LOG, `${label}\t${c.maxAbs}\t${c.maxRel}\n`);
  if (c.failures > 0) {
    const at = width ? `row ${Math.floor(c.worst / width)} col ${c.worst % width}` : `index ${c.worst}`;
    throw new Error(
      `${label}: ${c.failures} of ${expected.length} values outside tolerance ${JSON.stringify(tol)}; worst at ${at}: ` +
        `got ${actual[c.worst]}, expected ${expected[c.worst]} (max abs err ${c.maxAbs.toExponential(3)})`,
    );
  }
  expect(c.failures).toBe(0);
  return c;
}

/** Fails unless the integers are equal, naming the first difference. */
export function expectExact(actual: ArrayLike<number>, expected: ArrayLike<number>, label: string, width?: number): void {
  for (let i = 0; i < expected.length; i++) {
    if (actual[i] !== expected[i]) {
      const at = width ? `row ${Math.floor(i / width)} col ${i % width}` : `index ${i}`;
      throw new Error(`${label}: at ${at} got ${actual[i]}, expected ${expected[i]}`);
    }
  }
  expect(actual.length).toBeGreaterThanOrEqual(expected.length);
}
