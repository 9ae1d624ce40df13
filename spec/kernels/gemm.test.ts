// The tile API (kernels/tile.h) and the tiled projections built on it (kernels/gemm.metal), on
// whichever backend CHERENKOV_BACKEND selects (cpu by default; the same file runs on cuda).
//  - gemm_plain_f32_f32 (one bf16 tile product per step) at odd sizes (tails in every
//    dimension) against a reference that rounds both operands to bf16 first: then only f32
//    summation order differs, so a misplaced element of a fragment fails by far more than the
//    tolerance; and against the unrounded reference within the bf16 operand bound.
//  - gemm_f32_f32 (split operands, three products: numeric rule R7) at the same sizes against
//    the f32 reference within the split bound, 64 times tighter than bf16's.
//  - gemm_q4_f32 at nb = 1, 7, 32, 100 against lib/reference on the dequantized weights and
//    against the matvec kernel, within the split bound; gemm_plain_q4_f32 within bf16's.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeGemm, GEMM_MIN_ROWS, gemmMinRows, usesGemm } from "../../lib/gpu/gemm.ts";
import { MAX_SNAP } from "../../lib/gpu/limits.ts";
import { encodeMatvec } from "../../lib/gpu/projections.ts";
import { bf16ToF32, f32ToBf16 } from "../../lib/model/dtype.ts";
import { matmulRows } from "../../lib/reference/ops.ts";
import type { DType } from "../../lib/model/config.ts";
import type { Buffer } from "../../lib/shim.ts";
import { expectClose, expectGuard, openDevice, outputF32, randomF32, readF32, run, uploadF32, uploadWeight } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

/** Rounds every value to bf16 (what the tile API's operands hold). */
const toBf16 = (v: Float32Array) => bf16ToF32(f32ToBf16(v));

/** Row stride in floats for a width: rows must start 16-byte aligned. */
const pitch = (width: number) => Math.ceil(width / 4) * 4;

/** x [nb][inDim] copied into rows of `pitch(inDim)` floats. */
function uploadRows(x: Float32Array, nb: number, inDim: number): Buffer {
  const p = pitch(inDim);
  const padded = new Float32Array(nb * p);
  for (let r = 0; r < nb; r++) padded.set(x.subarray(r * inDim, (r + 1) * inDim), r * p);
  return uploadF32(dev, padded);
}

/** sum_k |W[o][k]| |x[r][k]| per output: the scale of each result's rounding error. */
function absDots(w: Float32Array, x: Float32Array, nb: number, out: number, inDim: number): Float64Array {
  const s = new Float64Array(nb * out);
  for (let r = 0; r < nb; r++)
    for (let o = 0; o < out; o++) {
      let t = 0;
      for (let k = 0; k < inDim; k++) t += Math.abs(w[o * inDim + k]!) * Math.abs(x[r * inDim + k]!);
      s[r * out + o] = t;
    }
  return s;
}

/**
 * Fails unless |got - want| <= rel * scale[i] for every element: with bf16 operands each
 * product is off by at most 2^-8 of |w x| (two roundings of 2^-9), plus f32 summation.
 */
function expectWithinScale(got: Float32Array, want: Float32Array, scale: Float64Array, rel: number, label: string, width: number): void {
  let worst = -1;
  let excess = 0;
  let failures = 0;
  for (let i = 0; i < want.length; i++) {
    const err = Math.abs(got[i]! - want[i]!);
    const over = err - rel * scale[i]! - 1e-30;
    if (!(over <= 0)) {
      failures++;
      if (worst < 0 || !(over <= excess)) (worst = i), (excess = over);
    }
  }
  if (failures > 0)
    throw new Error(
      `${label}: ${failures} of ${want.length} values off by more than ${rel} of sum |w x|; worst at row ${Math.floor(worst / width)} ` +
        `col ${worst % width}: got ${got[worst]}, expected ${want[worst]} (scale ${scale[worst]})`,
    );
  expect(failures).toBe(0);
}

/** The bf16 operand bound of rule R7, with room for f32 summation of up to a few thousand terms. */
const BF16_PRODUCT = 2 ** -8 + 1e-5;
/**
 * The split bound of rule R7: x = hi + lo to 2^-17 of x (each a bf16), the lo lo product left
 * out (2^-18), so about 2^-16 of |w x| per product; plus f32 summation.
 */
const SPLIT_PRODUCT = 2 ** -15 + 1e-5;

/** Reads an output of rows `pitch(out)` floats apart back as [nb][out]. */
function readRows(y: Buffer, nb: number, out: number): Float32Array {
  const p = pitch(out);
  const all = readF32(y, nb * p);
  const r = new Float32Array(nb * out);
  for (let i = 0; i < nb; i++) r.set(all.subarray(i * p, i * p + out), i * out);
  return r;
}

function runGemm(dtype: DType, nb: number, out: number, inDim: number, seed: number, accumulateOnto?: Float32Array, precision: "split" | "plain" = "split") {
  const { ref, host } = uploadWeight(dev, dtype, [out, inDim], seed);
  const x = randomF32(nb * inDim, seed + 1, 1, `gemm-x-${dtype}`);
  const xb = uploadRows(x, nb, inDim);
  let y: Buffer;
  if (accumulateOnto) {
    const padded = new Float32Array(nb * pitch(out));
    for (let r = 0; r < nb; r++) padded.set(accumulateOnto.subarray(r * out, (r + 1) * out), r * pitch(out));
    y = uploadF32(dev, padded, 64);
  } else {
    y = outputF32(dev, nb * pitch(out));
  }
  run(dev, (ctx) =>
    encodeGemm(ctx, ref, { buffer: xb, offset: 0, stride: pitch(inDim) * 4 }, { buffer: y, offset: 0, stride: pitch(out) * 4 }, nb, {
      accumulate: accumulateOnto !== undefined,
      precision,
    }),
  );
  return { ref, host, x, xb, y, got: readRows(y, nb, out) };
}

describe("tile API: gemm_plain_f32_f32 and gemm_f32_f32", () => {
  // [nb, out, in]: one element; under one tile; exact threadgroup blocks; tails everywhere.
  const SHAPES: [number, number, number][] = [
    [1, 1, 1],
    [3, 5, 7],
    [16, 16, 16],
    [64, 64, 32],
    [37, 70, 50],
    [65, 129, 97],
    [100, 33, 200],
  ];
  test.each(SHAPES)("plain: nb %i, out %i, in %i", (nb, out, inDim) => {
    const { host, x, y, got } = runGemm("f32", nb, out, inDim, 3 * nb + out, undefined, "plain");
    const wr = toBf16(host.values);
    const xr = toBf16(x);
    // Same bf16 operands: only the order of f32 sums differs (values in [-1, 1)).
    expectClose(got, matmulRows(wr, xr, nb, out, inDim), { abs: 4e-7 * inDim }, `gemm_plain_f32_f32 ${nb}x${out}x${inDim} (bf16 operands)`, out);
    // Against the f32 operands: the bf16 bound.
    expectWithinScale(got, matmulRows(host.values, x, nb, out, inDim), absDots(host.values, x, nb, out, inDim), BF16_PRODUCT, `gemm_plain_f32_f32 ${nb}x${out}x${inDim}`, out);
    // Rows past nb untouched (the buffer has exactly nb rows plus a NaN guard).
    expectGuard(y, nb * pitch(out));
  });

  test.each(SHAPES)("split: nb %i, out %i, in %i", (nb, out, inDim) => {
    const { host, x, y, got } = runGemm("f32", nb, out, inDim, 3 * nb + out);
    expectWithinScale(got, matmulRows(host.values, x, nb, out, inDim), absDots(host.values, x, nb, out, inDim), SPLIT_PRODUCT, `gemm_f32_f32 ${nb}x${out}x${inDim}`, out);
    expectGuard(y, nb * pitch(out));
  });

  test("the bf16-operand reference is sharp: the f32 product differs from it by more than the tolerance", () => {
    // Guards the test above against a tolerance so loose that it could not tell bf16 from f32.
    const [nb, out, inDim] = [37, 70, 50];
    const w = randomF32(out * inDim, 3 * nb + out, 1, `weight-${out}x${inDim}`);
    const x = randomF32(nb * inDim, 3 * nb + out + 1, 1, "gemm-x-f32");
    const exact = matmulRows(w, x, nb, out, inDim);
    const rounded = matmulRows(toBf16(w), toBf16(x), nb, out, inDim);
    let maxDiff = 0;
    for (let i = 0; i < exact.length; i++) maxDiff = Math.max(maxDiff, Math.abs(exact[i]! - rounded[i]!));
    expect(maxDiff).toBeGreaterThan(10 * 4e-7 * inDim);
  });

  test("accumulates into y", () => {
    const [nb, out, inDim] = [9, 21, 40];
    const y0 = randomF32(nb * out, 4, 1, "gemm-acc-y");
    const { host, x, got } = runGemm("f32", nb, out, inDim, 5, y0, "plain");
    const want = matmulRows(toBf16(host.values), toBf16(x), nb, out, inDim).map((v, i) => v + y0[i]!);
    expectClose(got, want, { abs: 4e-7 * inDim + 1e-6 }, "gemm_plain_f32_f32 accumulate", out);
  });

  test("bf16 and f16 weights", () => {
    for (const dtype of ["bf16", "f16"] as const) {
      const [nb, out, inDim] = [33, 40, 72];
      const { host, x, got } = runGemm(dtype, nb, out, inDim, 8);
      expectWithinScale(got, matmulRows(host.values, x, nb, out, inDim), absDots(host.values, x, nb, out, inDim), SPLIT_PRODUCT, `gemm_${dtype}_f32`, out);
    }
  });
});

describe("gemm_q4_f32 (q4 weight tiles dequantized in threadgroup memory)", () => {
  // out with a tail in the 64-row block; in of 5 q4 groups: an odd number of K steps.
  const [out, inDim] = [133, 160];
  test.each([1, 7, 32, 100])("nb = %i: the reference and the matvec kernel", (nb) => {
    const { ref, host, x, xb, got } = runGemm("q4", nb, out, inDim, 40 + nb);
    const scale = absDots(host.values, x, nb, out, inDim);
    const want = matmulRows(host.values, x, nb, out, inDim);
    expectWithinScale(got, want, scale, SPLIT_PRODUCT, `gemm_q4_f32 nb=${nb} vs reference`, out);
    const mv = outputF32(dev, nb * pitch(out));
    run(dev, (ctx) => encodeMatvec(ctx, ref, { buffer: xb, offset: 0, stride: pitch(inDim) * 4 }, { buffer: mv, offset: 0, stride: pitch(out) * 4 }, nb, { form: "rows" }));
    expectWithinScale(got, readRows(mv, nb, out), scale, SPLIT_PRODUCT, `gemm_q4_f32 nb=${nb} vs matvec_q4_f32`, out);
    const plain = runGemm("q4", nb, out, inDim, 40 + nb, undefined, "plain").got;
    expectWithinScale(plain, want, scale, BF16_PRODUCT, `gemm_plain_q4_f32 nb=${nb} vs reference`, out);
  });

  test("the split bound is sharp: the plain (one bf16 product) form falls outside it", () => {
    const nb = 32;
    const { host, x, got } = runGemm("q4", nb, out, inDim, 72, undefined, "plain");
    expect(() =>
      expectWithinScale(got, matmulRows(host.values, x, nb, out, inDim), absDots(host.values, x, nb, out, inDim), SPLIT_PRODUCT, "plain vs split bound", out),
    ).toThrow(/off by more than/);
  });

  test("reads and writes rows at offsets and strides inside larger buffers", () => {
    const [nb, o, k, xs, ys] = [5, 20, 64, 72, 28];
    const { ref, host } = uploadWeight(dev, "q4", [o, k], 2);
    const data = randomF32(nb * xs + 16, 9);
    const xb = uploadF32(dev, data);
    const y = outputF32(dev, 4 + nb * ys);
    run(dev, (ctx) => encodeGemm(ctx, ref, { buffer: xb, offset: 64, stride: xs * 4 }, { buffer: y, offset: 16, stride: ys * 4 }, nb));
    const x = new Float32Array(nb * k);
    for (let r = 0; r < nb; r++) x.set(data.subarray(16 + r * xs, 16 + r * xs + k), r * k);
    const want = matmulRows(host.values, x, nb, o, k);
    const all = readF32(y, 4 + nb * ys);
    const got = new Float32Array(nb * o);
    for (let r = 0; r < nb; r++) {
      got.set(all.subarray(4 + r * ys, 4 + r * ys + o), r * o);
      // Between rows: untouched.
      for (let c = o; c < ys; c++) expect(Number.isNaN(all[4 + r * ys + c]!)).toBe(true);
    }
    expectWithinScale(got, want, absDots(host.values, x, nb, o, k), BF16_PRODUCT, "gemm_q4_f32 strided", o);
  });

  test("a q4 input width that is not a multiple of 32 is refused", () => {
    const { ref } = uploadWeight(dev, "f32", [4, 48], 1);
    const q4 = { ...ref, dtype: "q4" as const };
    const xb = uploadF32(dev, new Float32Array(48));
    const y = outputF32(dev, 4);
    expect(() => run(dev, (ctx) => encodeGemm(ctx, q4, { buffer: xb, offset: 0, stride: 192 }, { buffer: y, offset: 0, stride: 16 }, 1))).toThrow(
      /multiple of 32/,
    );
  });
});

describe("GEMM or matvec by row count", () => {
  test("the default threshold is above a verify batch (1 + MAX_SNAP rows): verify rows compute as decode does", () => {
    expect(GEMM_MIN_ROWS).toBeGreaterThan(1 + MAX_SNAP);
  });

  test("only q4 weights, from the row threshold on", () => {
    expect(usesGemm("q4", GEMM_MIN_ROWS, GEMM_MIN_ROWS)).toBe(true);
    expect(usesGemm("q4", GEMM_MIN_ROWS - 1, GEMM_MIN_ROWS)).toBe(false);
    expect(usesGemm("q4", 1, 1)).toBe(true);
    expect(usesGemm("f32", 1024, 1)).toBe(false);
    expect(usesGemm("bf16", 1024, 1)).toBe(false);
  });

  test("GEMM_MIN_ROWS on a GPU, never on the CPU backend; CHERENKOV_GEMM_MIN_ROWS overrides both; a bad value is refused by name", () => {
    const saved = process.env.CHERENKOV_GEMM_MIN_ROWS;
    try {
      delete process.env.CHERENKOV_GEMM_MIN_ROWS;
      expect(gemmMinRows("cuda")).toBe(GEMM_MIN_ROWS);
      expect(gemmMinRows("metal")).toBe(GEMM_MIN_ROWS);
      expect(gemmMinRows("cpu")).toBe(Infinity);
      process.env.CHERENKOV_GEMM_MIN_ROWS = "7";
      expect(gemmMinRows("cuda")).toBe(7);
      expect(gemmMinRows("cpu")).toBe(7);
      process.env.CHERENKOV_GEMM_MIN_ROWS = "0";
      expect(() => gemmMinRows("cuda")).toThrow(/CHERENKOV_GEMM_MIN_ROWS=0/);
    } finally {
      if (saved === undefined) delete process.env.CHERENKOV_GEMM_MIN_ROWS;
      else process.env.CHERENKOV_GEMM_MIN_ROWS = saved;
    }
  });

  test("encodeMatvec sends a q4 projection of at least the threshold's rows to the GEMM (and gemm: false keeps the matvec)", () => {
    // The GEMM's result differs from the f32 matvec's in its last bits (split operands, another
    // summation order): which path ran is visible.
    const nb = 5;
    const [out, inDim] = [24, 96];
    const { ref } = uploadWeight(dev, "q4", [out, inDim], 12);
    const xb = uploadF32(dev, randomF32(nb * inDim, 13));
    const auto = outputF32(dev, nb * out);
    const viaGemm = outputF32(dev, nb * out);
    const viaMatvec = outputF32(dev, nb * out);
    const below = outputF32(dev, nb * out);
    const optedOut = outputF32(dev, nb * out);
    const saved = process.env.CHERENKOV_GEMM_MIN_ROWS;
    const x = { buffer: xb, offset: 0, stride: inDim * 4 };
    const at = (b: Buffer) => ({ buffer: b, offset: 0, stride: out * 4 });
    try {
      process.env.CHERENKOV_GEMM_MIN_ROWS = String(nb);
      run(dev, (ctx) => {
        encodeMatvec(ctx, ref, x, at(auto), nb);
        encodeGemm(ctx, ref, x, at(viaGemm), nb);
        encodeMatvec(ctx, ref, x, at(viaMatvec), nb, { form: "rows" });
        encodeMatvec(ctx, ref, x, at(optedOut), nb, { gemm: false });
      });
      process.env.CHERENKOV_GEMM_MIN_ROWS = String(nb + 1);
      run(dev, (ctx) => encodeMatvec(ctx, ref, x, at(below), nb));
    } finally {
      if (saved === undefined) delete process.env.CHERENKOV_GEMM_MIN_ROWS;
      else process.env.CHERENKOV_GEMM_MIN_ROWS = saved;
    }
    const values = (b: Buffer) => Array.from(readF32(b, nb * out));
    expect(values(auto)).toEqual(values(viaGemm));
    expect(values(auto)).not.toEqual(values(viaMatvec));
    // Below the threshold, or opted out: the matvec in its default form (the same kernel both times).
    expect(values(below)).toEqual(values(optedOut));
    expect(values(below)).not.toEqual(values(viaGemm));
  });
});
