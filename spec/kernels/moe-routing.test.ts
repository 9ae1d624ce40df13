// The router's two forms (kernels/moe.metal router_row): the register form for up to 128
// experts and the general one beyond, pinned to the same bits, and the reference's routing for
// expert counts past the register form.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeRouterTopK } from "../../lib/gpu/experts.ts";
import { routerTopK } from "../../lib/reference/moe.ts";
import { expectClose, expectExact, openDevice, outputF32, outputI32, readF32, readI32, rng, rows, run, uploadF32 } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

/** Experts the register form holds (ROUTER_FAST_SLOTS * 32 in kernels/moe.metal). */
const FAST_EXPERTS = 128;

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

describe("router_topk_f32: register form = general form", () => {
  // E experts take the register form; the same rows padded to E + extra experts with -inf
  // logits take the general form and must give the same bits: a -inf expert adds exp(-inf) = 0
  // to the softmax sum and is never among the top k.
  test.each([
    [FAST_EXPERTS, 8, true, 1],
    [FAST_EXPERTS, 8, false, 1],
    [FAST_EXPERTS, 32, true, 1],
    [FAST_EXPERTS, 10, true, 5],
    [100, 10, false, 5],
    [64, 4, true, 3],
    [8, 2, true, 7],
  ] as const)("E = %i, k = %i, norm_topk_prob %p, nb = %i", (E, k, norm, nb) => {
    const wide = FAST_EXPERTS + 32 + 3; // five slots: past the register form
    const logits = gridLogits(nb * E, E * 31 + k);
    const padded = new Float32Array(nb * wide).fill(-Infinity);
    for (let r = 0; r < nb; r++) padded.set(logits.subarray(r * E, (r + 1) * E), r * wide);
    const fast = route(logits, nb, E, k, norm);
    const general = route(padded, nb, wide, k, norm);
    expect(fast.ids).toEqual(general.ids);
    expect(fast.bits).toEqual(general.bits);
    // ... and both are the router's routing.
    for (let r = 0; r < nb; r++) {
      const want = routerTopK(logits.subarray(r * E, (r + 1) * E), k, norm);
      expectExact(fast.ids.slice(r * k, (r + 1) * k), want.experts, `router ids row ${r}`);
      expectClose(fast.weights.subarray(r * k, (r + 1) * k), want.weights, { rel: 2e-6, abs: 1e-7 }, `router weights row ${r}`);
    }
  });

  test.each([
    [129, 8, true],
    [512, 10, true],
    [1024, 32, false],
  ] as const)("general form, E = %i, k = %i: the reference's routing", (E, k, norm) => {
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
