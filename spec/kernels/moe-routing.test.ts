// The router's forms (kernels/moe.metal router_route): registers for up to 128 and up to 512
// experts, the general form beyond, pinned to the same bits, and the reference's routing for
// expert counts past the first form. Then the router folded into a decode step's gate and
// up (moe_gate_up_pairs_routed): the same ids, weights, h and layer output bits as
// router_topk_f32 + moe_gate_up_pairs.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeRouterLogits, encodeRouterTopK, encodeRoutedExperts, encodeSharedExpert, fusesDownCombine, routedGateUpKernel, type ExpertPool } from "../../lib/gpu/experts.ts";
import { encodeMatvec } from "../../lib/gpu/projections.ts";
import { hcMixCount } from "../../lib/gpu/hyperconnection.ts";
import { PART_ALIGN } from "../../lib/model/manifest.ts";
import { tensorBytes } from "../../lib/model/tensors.ts";
import { routerTopK } from "../../lib/reference/moe.ts";
import type { Binding, Buffer } from "../../lib/shim.ts";
import {
  expectClose,
  expectExact,
  hostTensor,
  openDevice,
  outputF32,
  outputI32,
  randomF32,
  readF32,
  readI32,
  recordingNames,
  rng,
  rows,
  run,
  uploadF32,
  uploadI32,
  uploadWeight,
  uploadWeights,
} from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

/** Experts the two register forms hold (32 * ROUTER_FAST_SLOTS, 32 * ROUTER_WIDE_SLOTS in kernels/moe.metal). */
const FAST_EXPERTS = 128;
const WIDE_EXPERTS = 512;

/** Logits on a grid of 1/8 (ties are common: ranks take the lower id). */
function gridLogits(n: number, seed: number): Float32Array {
  const r = rng(seed, "routing-logits");
  return Float32Array.from({ length: n }, () => Math.round(r.symmetric() * 24) / 8);
}

/** router_topk_f32 over nb rows of E logits: ids and the weights' bits. */
function route(logits: Float32Array, nb: number, E: number, k: number, norm: boolean) {
  const ids = outputI32(dev, nb * k);
  const weights = outputF32(dev, nb * k);
  run(dev, (ctx) => encodeRouterTopK(ctx, rows(uploadF32(dev, logits), E), { ids, weights }, nb, { experts: E, top_k: k, norm_topk_prob: norm }));
  const w = readF32(weights, nb * k);
  return { ids: [...readI32(ids, nb * k)], weights: w, bits: [...new Uint32Array(Float32Array.from(w).buffer)] };
}

describe("router_topk_f32: the register forms = the general form", () => {
  // E experts take the smallest form that holds them; the same rows padded to `to` experts
  // with -inf logits take a larger form and must give the same bits: a -inf expert adds
  // exp(-inf) = 0 to the softmax sum and is never among the top k.
  const general = WIDE_EXPERTS + 32 + 3; // past both register forms
  const wide = FAST_EXPERTS + 32 + 3; // the wide register form
  test.each([
    [FAST_EXPERTS, 8, true, 1, wide],
    [FAST_EXPERTS, 8, true, 1, general],
    [FAST_EXPERTS, 8, false, 1, general],
    [FAST_EXPERTS, 32, true, 1, general],
    [FAST_EXPERTS, 10, true, 5, wide],
    [100, 10, false, 5, general],
    [64, 4, true, 3, general],
    [8, 2, true, 7, wide],
    [WIDE_EXPERTS, 10, true, 3, general],
    [300, 10, false, 2, general],
    [WIDE_EXPERTS, 32, true, 1, general],
  ] as const)("E = %i, k = %i, norm_topk_prob %p, nb = %i: the same bits padded to %i experts", (E, k, norm, nb, to) => {
    const logits = gridLogits(nb * E, E * 31 + k);
    const padded = new Float32Array(nb * to).fill(-Infinity);
    for (let r = 0; r < nb; r++) padded.set(logits.subarray(r * E, (r + 1) * E), r * to);
    const small = route(logits, nb, E, k, norm);
    const large = route(padded, nb, to, k, norm);
    expect(small.ids).toEqual(large.ids);
    expect(small.bits).toEqual(large.bits);
    // ... and both are the router's routing.
    for (let r = 0; r < nb; r++) {
      const want = routerTopK(logits.subarray(r * E, (r + 1) * E), k, norm);
      expectExact(small.ids.slice(r * k, (r + 1) * k), want.experts, `router ids row ${r}`);
      expectClose(small.weights.subarray(r * k, (r + 1) * k), want.weights, { rel: 2e-6, abs: 1e-7 }, `router weights row ${r}`);
    }
  });

  test.each([
    [129, 8, true],
    [512, 10, true],
    [513, 10, true],
    [1024, 32, false],
  ] as const)("wide and general forms, E = %i, k = %i: the reference's routing", (E, k, norm) => {
    const nb = 3;
    const logits = gridLogits(nb * E, E + k);
    const got = route(logits, nb, E, k, norm);
    for (let r = 0; r < nb; r++) {
      const want = routerTopK(logits.subarray(r * E, (r + 1) * E), k, norm);
      expectExact(got.ids.slice(r * k, (r + 1) * k), want.experts, `router ids E=${E} row ${r}`);
      expectClose(got.weights.subarray(r * k, (r + 1) * k), want.weights, { rel: 2e-6, abs: 1e-7 }, `router weights E=${E} row ${r}`);
    }
  });
});

/** A one-buffer pool of q4 expert records (gate | up | down), expert e in slot slotOf[e] (-1: none). */
function q4Pool(d: number, I: number, E: number, slotOf: readonly number[], slots: number): ExpertPool {
  const shapes = { gate: [I, d], up: [I, d], down: [d, I] } as const;
  const align = (x: number) => Math.ceil(x / PART_ALIGN) * PART_ALIGN;
  let cursor = 0;
  const parts = (Object.keys(shapes) as (keyof typeof shapes)[]).map((name) => {
    const offset = align(cursor);
    cursor = offset + tensorBytes(shapes[name], "q4");
    return { name, dtype: "q4" as const, shape: shapes[name], offset };
  });
  const stride = align(cursor);
  const buffer: Buffer = dev.buffer(stride * slots);
  buffer.bytes.fill(0xff); // unmapped slots hold garbage: only mapped ones may be read
  for (let e = 0; e < E; e++) {
    const s = slotOf[e]!;
    if (s < 0) continue;
    for (const p of parts) {
      const [rowsN, cols] = p.shape;
      const t = hostTensor(randomF32(rowsN * cols, 500 + e, 0.3, `expert-${p.name}`), "q4", p.shape);
      buffer.bytes.set(t.bytes, s * stride + p.offset);
    }
  }
  return { buffers: [buffer], slotsPerBuffer: slots, slots, stride, parts };
}

interface FoldCase {
  what: string;
  E: number;
  k: number;
  norm: boolean;
  /** Streams the layer writes into (n > 1: with hyper-connection coefficients), or 0: plain y. */
  streams: number;
  shared: boolean;
  missing?: number;
}

/**
 * One decode MoE layer from given router logits, with router_topk_f32 + moe_gate_up_pairs
 * (folded false) or moe_gate_up_pairs_routed (folded true), both ending in moe_down_combine:
 * ids, weights, h and the output, as bits.
 */
function decodeLayer(c: FoldCase, logits: Float32Array, folded: boolean) {
  const [d, I, SI] = [64, 96, 64];
  const { E, k } = c;
  const slots = E + 3;
  const slotOf = [...Array(E).keys()].map((e) => (e === c.missing ? -1 : (e * 7 + 3) % slots));
  const pool = q4Pool(d, I, E, slotOf, slots);
  expect(fusesDownCombine(pool, 1)).toBe(true);
  const sharedW = {
    gate: hostTensor(randomF32(SI * d, 8, 0.3, "sg"), "q4", [SI, d]),
    up: hostTensor(randomF32(SI * d, 9, 0.3, "su"), "q4", [SI, d]),
    down: hostTensor(randomF32(d * SI, 10, 0.3, "sd"), "q4", [d, SI]),
    expertGate: hostTensor(randomF32(d, 11, 0.5, "seg"), "bf16", [1, d]),
  };
  const { refs } = uploadWeights(dev, sharedW);
  const x = rows(uploadF32(dev, randomF32(d, 12, 1.5, "moe-x")), d);
  const lg = rows(uploadF32(dev, logits), E);
  // Outputs start as garbage: the folded form must write every id and weight itself.
  const ids = uploadI32(dev, Array.from({ length: k + 4 }, () => 12345));
  const weights = uploadF32(dev, new Float32Array(k + 4).fill(777));
  const h = rows(outputF32(dev, k * I), I);
  const routed = { h, o: rows(outputF32(dev, k * d), d) };
  const sharedS = { h: rows(outputF32(dev, SI), SI), s: rows(outputF32(dev, d), d), sg: rows(outputF32(dev, 1), 1) };
  const y = outputF32(dev, d);
  const n = c.streams;
  const X = n > 0 ? uploadF32(dev, randomF32(n * d, 13 + n, 2, "streams")) : null;
  const coeffs = n > 1 ? uploadF32(dev, randomF32(hcMixCount(n), 14 + n, 1.5, "coeffs")) : null;
  const table: Binding = uploadI32(dev, slotOf);
  run(dev, (ctx) => {
    if (!folded) encodeRouterTopK(ctx, lg, { ids, weights }, 1, { experts: E, top_k: k, norm_topk_prob: c.norm });
    if (c.shared) encodeSharedExpert(ctx, refs, x, sharedS, 1);
    const into = X ? { X: rows(X, n * d), coeffs: coeffs && rows(coeffs, hcMixCount(n)), streams: n, d } : undefined;
    const route = folded ? { logits: lg, norm_topk_prob: c.norm } : undefined;
    encodeRoutedExperts(ctx, pool, table, null, x, routed, 1, k, E, { ids, weights, y: rows(y, d), shared: c.shared ? sharedS : undefined, into, route });
  });
  const bits = (b: Buffer, count: number) => [...new Uint32Array(b.bytes.buffer, b.bytes.byteOffset, count)];
  return {
    ids: [...readI32(ids, k + 4)],
    weights: bits(weights, k + 4),
    h: bits(h.buffer, k * I),
    out: X ? bits(X, n * d) : bits(y, d),
  };
}

describe("moe_gate_up_pairs_routed: router_topk folded into the decode gate and up", () => {
  // One kernel per router form: the cases below cover each (128, 160 and 520 experts).
  test("the kernel for an expert count: logits in registers to 128 and 512 experts, re-read past that", () => {
    expect([1, 128, 129, 512, 513, 1024].map(routedGateUpKernel)).toEqual([
      "moe_gate_up_pairs_routed_q4_f32",
      "moe_gate_up_pairs_routed_q4_f32",
      "moe_gate_up_pairs_routed_wide_q4_f32",
      "moe_gate_up_pairs_routed_wide_q4_f32",
      "moe_gate_up_pairs_routed_any_q4_f32",
      "moe_gate_up_pairs_routed_any_q4_f32",
    ]);
  });

  test.each([
    { what: "30b shape: 4 streams, shared expert", E: 128, k: 8, norm: true, streams: 4, shared: true },
    { what: "plain y, no shared expert, p_k unnormalised", E: 128, k: 8, norm: false, streams: 0, shared: false },
    { what: "a residual (one stream), few experts", E: 16, k: 4, norm: true, streams: 1, shared: true },
    { what: "the wide router form (160 experts)", E: 160, k: 10, norm: true, streams: 2, shared: true },
    { what: "the general router form (520 experts)", E: 520, k: 10, norm: true, streams: 1, shared: false },
    { what: "a pick without a slot", E: 128, k: 8, norm: true, streams: 4, shared: true, missing: -2 },
  ] satisfies FoldCase[])("$what (E = $E, k = $k)", (c0) => {
    const logits = gridLogits(c0.E, c0.E + c0.k);
    const before = routerTopK(logits, c0.k, c0.norm);
    // missing -2: the layer's third pick has no slot (its row is NaN in both forms).
    const c: FoldCase = c0.missing === -2 ? { ...c0, missing: before.experts[2]! } : c0;
    const split = decodeLayer(c, logits, false);
    const folded = decodeLayer(c, logits, true);
    expect(folded.ids).toEqual(split.ids);
    expect(folded.weights).toEqual(split.weights);
    expect(folded.h).toEqual(split.h);
    expect(folded.out).toEqual(split.out);
    // The case is what it says: the reference's routing, past the k written nothing.
    expect(split.ids.slice(0, c.k)).toEqual(before.experts);
    expect(split.ids.slice(c.k)).toEqual([12345, 12345, 12345, 12345]);
    const outs = new Float32Array(Uint32Array.from(folded.out).buffer);
    if (c.missing !== undefined) expect(outs.every(Number.isNaN)).toBe(true);
    else expect(outs.every(Number.isFinite)).toBe(true);
  });
});

describe("encodeRouterLogits with the shared expert's gate", () => {
  // The router and the shared expert's gate logit read the same normalised row: one
  // matvec_multi dispatch gives both, the same bits as a matvec each.
  test.each([1, 5])("nb = %i: one dispatch, the same bits as two matvecs", (nb) => {
    const [d, E] = [64, 128];
    const router = uploadWeight(dev, "bf16", [E, d], 61, 0.5).ref;
    const gate = uploadWeight(dev, "bf16", [1, d], 62, 0.5).ref;
    const x = rows(uploadF32(dev, randomF32(nb * d, 63 + nb, 1.5, "router-x")), d);
    const [logits, sg, logits1, sg1] = [E, 1, E, 1].map((n) => outputF32(dev, nb * n));
    const names: string[] = [];
    run(dev, (ctx) => {
      const cfg = { experts: E, top_k: 8, norm_topk_prob: true };
      encodeRouterLogits(recordingNames(ctx, names), router, x, rows(logits!, E), nb, cfg, { w: gate, sg: rows(sg!, 1) });
      encodeMatvec(ctx, router, x, rows(logits1!, E), nb);
      encodeMatvec(ctx, gate, x, rows(sg1!, 1), nb);
    });
    expect(names).toHaveLength(1);
    expect(names[0]).toStartWith("matvec_multi_");
    const bits = (b: Buffer, n: number) => [...new Uint32Array(b.bytes.buffer, b.bytes.byteOffset, n)];
    expect(bits(logits!, nb * E)).toEqual(bits(logits1!, nb * E));
    expect(bits(sg!, nb)).toEqual(bits(sg1!, nb));
  });
});
