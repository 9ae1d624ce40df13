// The grouped GEMM of routed experts (kernels/gemm.metal moe_gemm_gate_up_q4_f32 and
// moe_gemm_down_q4_f32, picked by encodeRoutedExperts from the GEMM row threshold on), and the
// shared expert's fused gate_up (gemm_gate_up_q4_f32, encodeSharedExpert): per
// pair q = r * k + j, h[q] = SiLU(gate_e x[r]) * up_e x[r] and o[q] = down_e h[q] with e the
// pair's expert, read through the slot table. Checked against a reference on the dequantized
// weights and against the matvec kernels (moe_gate_up / moe_down) within the split bound of
// numeric rule R7, with experts of 1 to over GEMM_TILE.rows pairs and a missing slot.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeExpertLists, encodeRoutedExperts, encodeSharedExpert, type ExpertPool } from "../../lib/gpu/experts.ts";
import { GEMM_TILE } from "../../lib/gpu/gemm.ts";
import { PART_ALIGN } from "../../lib/model/manifest.ts";
import type { Buffer } from "../../lib/shim.ts";
import { hostTensor, openDevice, outputF32, outputI32, randomF32, readF32, rows, run, uploadF32, uploadI32, uploadWeights, type HostTensor } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

/** The split bound of rule R7 per product (spec/kernels/gemm.test.ts), f32 sums included. */
const SPLIT_PRODUCT = 2 ** -15 + 1e-5;

const [d, I, E, k] = [96, 96, 6, 3];
const PARTS = { gate: [I, d], up: [I, d], down: [d, I] } as const;
type PartName = keyof typeof PARTS;

/** q4 expert records in a pool of E + 2 slots (slots are not expert ids); expert `missing` has none. */
function buildPool(missing: number | undefined) {
  const experts = Array.from({ length: E }, (_, e) => {
    const t = {} as Record<PartName, HostTensor>;
    for (const [name, shape] of Object.entries(PARTS) as [PartName, readonly number[]][])
      t[name] = hostTensor(randomF32(shape[0]! * shape[1]!, 300 + e, 0.3, `moe-gemm-${name}`), "q4", shape);
    return t;
  });
  const align = (x: number) => Math.ceil(x / PART_ALIGN) * PART_ALIGN;
  let cursor = 0;
  const parts = (Object.keys(PARTS) as PartName[]).map((name) => {
    const offset = align(cursor);
    cursor = offset + experts[0]![name].bytes.byteLength;
    return { name, dtype: "q4" as const, shape: PARTS[name], offset };
  });
  const stride = align(cursor);
  const slots = E + 2;
  const slotOf = Array.from({ length: E }, (_, e) => (e === missing ? -1 : (e * 5 + 1) % slots));
  const buffer: Buffer = dev.buffer(stride * slots);
  buffer.bytes.fill(0xff); // unmapped slots hold garbage: only mapped ones may be read
  slotOf.forEach((s, e) => {
    if (s >= 0) for (const p of parts) buffer.bytes.set(experts[e]![p.name].bytes, s * stride + p.offset);
  });
  const pool: ExpertPool = { buffers: [buffer], slotsPerBuffer: slots, slots, stride, parts };
  return { pool, experts, slotOf };
}

/** Pair q's expert: choice 0 is expert 0 for most rows (over GEMM_TILE.rows pairs at nb = 100), the rest spread. */
const expertOf = (r: number, j: number) => (j === 0 ? (r % 7 === 3 ? 1 : 0) : (r * 2 + j * 3 + (r >> 2)) % E);

/** Runs encodeRoutedExperts at the given GEMM threshold; returns h and o per pair. */
function runExperts(nb: number, minRows: string, missing?: number) {
  const { pool, experts, slotOf } = buildPool(missing);
  const x = randomF32(nb * d, 77 + nb, 1.5, "moe-gemm-x");
  const ids = Array.from({ length: nb * k }, (_, q) => expertOf(Math.floor(q / k), q % k));
  const lists = { offsets: outputI32(dev, E + 1), pairs: outputI32(dev, nb * k), active: outputI32(dev, E + 1) };
  const h = outputF32(dev, nb * k * I);
  const o = outputF32(dev, nb * k * d);
  const saved = process.env.CHERENKOV_GEMM_MIN_ROWS;
  process.env.CHERENKOV_GEMM_MIN_ROWS = minRows;
  try {
    run(dev, (ctx) => {
      encodeExpertLists(ctx, uploadI32(dev, ids), lists, nb, k, E);
      encodeRoutedExperts(ctx, pool, uploadI32(dev, slotOf), lists, rows(uploadF32(dev, x), d), { h: rows(h, I), o: rows(o, d) }, nb, k, E);
    });
  } finally {
    if (saved === undefined) delete process.env.CHERENKOV_GEMM_MIN_ROWS;
    else process.env.CHERENKOV_GEMM_MIN_ROWS = saved;
  }
  return { x, ids, experts, h: readF32(h, nb * k * I), o: readF32(o, nb * k * d) };
}

const dot = (w: Float32Array, row: number, v: ArrayLike<number>, n: number) => {
  let s = 0;
  let a = 0;
  for (let c = 0; c < n; c++) (s += w[row * n + c]! * v[c]!), (a += Math.abs(w[row * n + c]! * v[c]!));
  return [s, a] as const;
};
const silu = (g: number) => g / (1 + Math.exp(-g));

/** Fails unless |got - want| <= bound elementwise (NaN fails), naming the worst pair and column. */
function expectWithin(got: Float32Array, want: Float64Array, bound: Float64Array, width: number, label: string): void {
  let worst = -1;
  let excess = 0;
  for (let i = 0; i < want.length; i++) {
    const over = Math.abs(got[i]! - want[i]!) - bound[i]!;
    if (!(over <= 0) && (worst < 0 || !(over <= excess))) (worst = i), (excess = over);
  }
  if (worst >= 0)
    throw new Error(`${label}: pair ${Math.floor(worst / width)} col ${worst % width}: got ${got[worst]}, expected ${want[worst]} (bound ${bound[worst]})`);
  expect(worst).toBe(-1);
}

/**
 * Reference h for every pair with its error bound (gate and up each within SPLIT_PRODUCT of
 * their sum |w x|, carried through SiLU(g) u), and reference o = down h of the given h (the
 * kernel's own, so the down GEMM is checked alone) with its bound.
 */
function reference(r: ReturnType<typeof runExperts>, nb: number, hIn: Float32Array) {
  const h = new Float64Array(nb * k * I);
  const hBound = new Float64Array(nb * k * I);
  const o = new Float64Array(nb * k * d);
  const oBound = new Float64Array(nb * k * d);
  for (let q = 0; q < nb * k; q++) {
    const ex = r.experts[r.ids[q]!]!;
    const xr = r.x.subarray(Math.floor(q / k) * d, Math.floor(q / k) * d + d);
    for (let i = 0; i < I; i++) {
      const [g, ga] = dot(ex.gate.values, i, xr, d);
      const [u, ua] = dot(ex.up.values, i, xr, d);
      h[q * I + i] = silu(g) * u;
      hBound[q * I + i] = SPLIT_PRODUCT * (1.1 * ga * Math.abs(u) + Math.abs(silu(g)) * ua) + 1e-6;
    }
    const hr = hIn.subarray(q * I, q * I + I);
    for (let c = 0; c < d; c++) {
      const [v, va] = dot(ex.down.values, c, hr, I);
      o[q * d + c] = v;
      oBound[q * d + c] = SPLIT_PRODUCT * va + 1e-6;
    }
  }
  return { h, hBound, o, oBound };
}

describe("moe_gemm_gate_up_q4_f32 / moe_gemm_down_q4_f32 (grouped GEMM of routed experts)", () => {
  test.each([7, 100])("nb = %i: the reference and the matvec kernels", (nb) => {
    const gemm = runExperts(nb, "1");
    const mv = runExperts(nb, "100000");
    // The skewed routing gives expert 0 more pairs than one threadgroup block at nb = 100.
    if (nb === 100) expect(gemm.ids.filter((e) => e === 0).length).toBeGreaterThan(GEMM_TILE.rows);
    const ref = reference(gemm, nb, gemm.h);
    expectWithin(gemm.h, ref.h, ref.hBound, I, `moe_gemm_gate_up nb=${nb} vs reference`);
    expectWithin(gemm.o, ref.o, ref.oBound, d, `moe_gemm_down nb=${nb} vs reference`);
    // Against the matvec kernels: their h (f32) lies inside the same bound around the reference.
    expectWithin(mv.h, ref.h, ref.hBound, I, `moe_gate_up nb=${nb} vs reference`);
    expectWithin(gemm.h, Float64Array.from(mv.h), Float64Array.from(ref.hBound, (b) => 2 * b), I, `moe_gemm_gate_up vs moe_gate_up nb=${nb}`);
    // Which path ran shows in the low bits.
    expect(Array.from(gemm.h)).not.toEqual(Array.from(mv.h));
  });

  test("a missing slot writes NaN for exactly its pairs, reading nothing", () => {
    const nb = 40;
    const missing = 2;
    const r = runExperts(nb, "1", missing);
    const ref = reference(r, nb, r.h);
    let seen = 0;
    for (let q = 0; q < nb * k; q++) {
      const hq = r.h.subarray(q * I, q * I + I);
      const oq = r.o.subarray(q * d, q * d + d);
      if (r.ids[q] === missing) {
        seen++;
        expect(hq.every(Number.isNaN)).toBe(true);
        expect(oq.every(Number.isNaN)).toBe(true);
      } else {
        expectWithin(hq, ref.h.subarray(q * I, q * I + I), ref.hBound.subarray(q * I, q * I + I), I, `pair ${q} beside a missing expert`);
      }
    }
    expect(seen).toBeGreaterThan(0);
  });
});

describe("gemm_gate_up_q4_f32 (the shared expert's gate and up, fused with SiLU)", () => {
  // Three 32-column blocks (q4 keeps SI a multiple of 32: the down projection's input); rows past one 64-row block.
  const [SI, dd] = [96, 64];
  test.each([5, 70])("nb = %i: the reference and ffn_gate_up_q4_f32", (nb) => {
    const w = {
      gate: hostTensor(randomF32(SI * dd, 21, 0.3, "sh-gate"), "q4", [SI, dd]),
      up: hostTensor(randomF32(SI * dd, 22, 0.3, "sh-up"), "q4", [SI, dd]),
      down: hostTensor(randomF32(dd * SI, 23, 0.3, "sh-down"), "q4", [dd, SI]),
      expertGate: hostTensor(randomF32(dd, 24, 0.5, "sh-eg"), "bf16", [1, dd]),
    };
    const { refs } = uploadWeights(dev, w);
    const x = randomF32(nb * dd, 25 + nb, 1.5, "sh-x");
    const xb = uploadF32(dev, x);
    const runShared = (minRows: string) => {
      const h = outputF32(dev, nb * SI);
      const scratch = { h: rows(h, SI), s: rows(outputF32(dev, nb * dd), dd), sg: rows(outputF32(dev, nb), 1) };
      const saved = process.env.CHERENKOV_GEMM_MIN_ROWS;
      process.env.CHERENKOV_GEMM_MIN_ROWS = minRows;
      try {
        run(dev, (ctx) => encodeSharedExpert(ctx, refs, rows(xb, dd), scratch, nb));
      } finally {
        if (saved === undefined) delete process.env.CHERENKOV_GEMM_MIN_ROWS;
        else process.env.CHERENKOV_GEMM_MIN_ROWS = saved;
      }
      return readF32(h, nb * SI);
    };
    const gemm = runShared("1");
    const mv = runShared("100000");
    const want = new Float64Array(nb * SI);
    const bound = new Float64Array(nb * SI);
    for (let r = 0; r < nb; r++) {
      const xr = x.subarray(r * dd, (r + 1) * dd);
      for (let i = 0; i < SI; i++) {
        const [g, ga] = dot(w.gate.values, i, xr, dd);
        const [u, ua] = dot(w.up.values, i, xr, dd);
        want[r * SI + i] = silu(g) * u;
        bound[r * SI + i] = SPLIT_PRODUCT * (1.1 * ga * Math.abs(u) + Math.abs(silu(g)) * ua) + 1e-6;
      }
    }
    expectWithin(gemm, want, bound, SI, `gemm_gate_up_q4_f32 nb=${nb} vs reference`);
    expectWithin(mv, want, bound, SI, `ffn_gate_up_q4_f32 nb=${nb} vs reference`);
    expect(Array.from(gemm)).not.toEqual(Array.from(mv));
  });
});
