// router_fused_bf16_f32 (kernels/moe.metal): the router of a few rows in one dispatch, the
// logits in threadgroup memory then the same top-k as router_topk_f32. Against the two-dispatch
// form (matvec + router_topk) and the reference: the same experts, weights within f32 rounding
// (the logits' dot products are summed in another order), at the real checkpoints' router
// shapes (30b: 128 experts top-8, 80b: 512 top-10) and at odd ones; which form the engine picks.
import { describe, expect, test } from "bun:test";
import { encodeRouter, ROUTER_FUSED_MAX_ROWS, routerFuses } from "../../lib/gpu/experts.ts";
import { routerTopK } from "../../lib/reference/moe.ts";
import { expectClose, hostTensor, openDevice, outputF32, outputI32, randomF32, readF32, readI32, rows, run, uploadF32, uploadWeights } from "./harness.ts";

const dev = openDevice();

function route(nb: number, E: number, k: number, d: number, norm: boolean, fused: boolean, seed: number) {
  const router = hostTensor(randomF32(E * d, seed, 0.5, "router"), "bf16", [E, d]);
  const { refs } = uploadWeights(dev, { router });
  const x = randomF32(nb * d, seed + 1, 1.5, "router-x");
  const ids = outputI32(dev, nb * k);
  const weights = outputF32(dev, nb * k);
  const cfg = { experts: E, top_k: k, norm_topk_prob: norm };
  let names: string[] = [];
  run(dev, (ctx) => {
    const before = dev.commandsEncoded;
    encodeRouter(ctx, refs.router!, rows(uploadF32(dev, x), d), rows(outputF32(dev, nb * E), E), { ids, weights }, nb, cfg, { fused });
    names = [String(dev.commandsEncoded - before)];
  });
  const ref = Array.from({ length: nb }, (_, r) => {
    const logits = new Float32Array(E);
    for (let e = 0; e < E; e++) {
      let s = 0;
      for (let i = 0; i < d; i++) s += router.values[e * d + i]! * x[r * d + i]!;
      logits[e] = s;
    }
    return routerTopK(logits, k, norm);
  });
  return { ids: readI32(ids, nb * k), weights: readF32(weights, nb * k), ref, dispatches: Number(names[0]) };
}

describe("router_fused_bf16_f32: the same experts as matvec + router_topk and the reference", () => {
  const CASES = [
    { E: 128, k: 8, d: 2048, name: "30b shape" },
    { E: 512, k: 10, d: 2048, name: "80b shape" },
    { E: 130, k: 3, d: 72, name: "odd: 130 experts, d 72 (one batch of loads, a partial one)" },
    { E: 33, k: 32, d: 2056, name: "k = 32, d past one batch of loads" },
  ];
  test.each(CASES.flatMap((c) => [1, 3].map((nb) => [c.name, nb, c] as const)))("%s, nb = %i", (_name, nb, c) => {
    for (const norm of [true, false]) {
      const one = route(nb, c.E, c.k, c.d, norm, true, 40 + c.E + nb);
      const two = route(nb, c.E, c.k, c.d, norm, false, 40 + c.E + nb);
      expect(one.dispatches).toBe(1);
      expect(two.dispatches).toBe(2);
      expect(one.ids).toEqual(two.ids);
      expect(Array.from(one.ids)).toEqual(one.ref.flatMap((r) => r.experts));
      expectClose(one.weights, two.weights, { abs: 1e-6, relMax: 1e-5 }, "fused vs two dispatches", c.k);
      expectClose(one.weights, Float32Array.from(one.ref.flatMap((r) => r.weights)), { abs: 1e-6, relMax: 1e-5 }, "fused vs reference", c.k);
    }
  });

  test("the engine takes it on a GPU for up to a few rows of a bf16 router, not on the CPU backend or for other weights", () => {
    const w = (dtype: "bf16" | "f32" | "q4", offset = 0) => ({ buffer: null as never, offset, dtype, shape: [128, 2048] as const });
    const x = { buffer: null as never, offset: 0, stride: 8192 };
    const cfg = { experts: 128, top_k: 8, norm_topk_prob: true };
    expect(routerFuses("cuda", w("bf16"), x, 1, cfg)).toBe(true);
    expect(routerFuses("metal", w("bf16"), x, ROUTER_FUSED_MAX_ROWS, cfg)).toBe(true);
    expect(routerFuses("cuda", w("bf16"), x, ROUTER_FUSED_MAX_ROWS + 1, cfg)).toBe(false);
    expect(routerFuses("cpu", w("bf16"), x, 1, cfg)).toBe(false);
    expect(routerFuses("cuda", w("f32"), x, 1, cfg)).toBe(false);
    expect(routerFuses("cuda", w("bf16", 8), x, 1, cfg)).toBe(false);
    expect(routerFuses("cuda", w("bf16"), { ...x, stride: 8200 }, 1, cfg)).toBe(false);
  });
});
