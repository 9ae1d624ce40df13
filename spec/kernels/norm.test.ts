// RMSNorm kernels (kernels/norm.metal) against lib/reference rmsNorm, rmsNormHeads and
// rmsNormGated: whole rows (zero-centred and plain weights), heads within rows, the gated form.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeRmsNorm, encodeRmsNormGated } from "../../lib/gpu/norms.ts";
import { rmsNorm, rmsNormGated, rmsNormHeads } from "../../lib/reference/ops.ts";
import { expectClose, expectGuard, hostTensor, NB_CASES, openDevice, outputF32, randomF32, readF32, rows, run, uploadF32, uploadWeights } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());
const eps = 1e-6;

// Elementwise results after one f32 sum of squares and an f32 rsqrt (Metal's is within
// 2 ulp): a few ulps of each output, so a relative bound of 1e-5 with a tiny floor.
const TOL = { rel: 1e-5, abs: 1e-6 };

function normWeight(n: number, seed: number) {
  return uploadWeights(dev, { w: hostTensor(randomF32(n, seed, 0.5, "norm-w"), "f32", [n]) }).refs.w;
}

describe("rms_norm_f32", () => {
  test.each(NB_CASES.flatMap((nb) => [[nb, true], [nb, false]] as const))("nb = %i, zero-centred %p", (nb, centred) => {
    const d = nb === 1024 ? 64 : 200; // 200: lanes cover an uneven tail
    const x = randomF32(nb * d, nb, 3, "norm-x");
    const w = normWeight(d, 1);
    const xb = uploadF32(dev, x);
    const y = outputF32(dev, nb * d);
    run(dev, (ctx) => encodeRmsNorm(ctx, rows(xb, d), w, rows(y, d), nb, eps, { centred }));
    const wv = w.buffer.f32.subarray(w.offset / 4, w.offset / 4 + d);
    const want = new Float32Array(nb * d);
    for (let r = 0; r < nb; r++) rmsNorm(x.subarray(r * d, (r + 1) * d), wv, eps, { zeroCentred: centred }, want.subarray(r * d, (r + 1) * d));
    expectClose(readF32(y, nb * d), want, TOL, `rms_norm_f32 nb=${nb}`, d);
    expectGuard(y, nb * d);
  });

  test.each(NB_CASES)("per head (q_norm / k_norm), in place, nb = %i", (nb) => {
    const [heads, dim] = [4, 16];
    const x = randomF32(nb * heads * dim, 7 + nb, 2, "heads-x");
    const w = normWeight(dim, 2);
    const xb = uploadF32(dev, x);
    run(dev, (ctx) => encodeRmsNorm(ctx, rows(xb, heads * dim), w, rows(xb, heads * dim), nb, eps, { heads }));
    const wv = w.buffer.f32.slice(w.offset / 4, w.offset / 4 + dim);
    const want = x.slice();
    for (let r = 0; r < nb; r++) rmsNormHeads(want.subarray(r * heads * dim, (r + 1) * heads * dim), wv, heads, dim, eps);
    expectClose(readF32(xb, nb * heads * dim), want, TOL, `rms_norm_f32 heads nb=${nb}`, heads * dim);
  });
});

describe("rms_norm_gated_f32", () => {
  test.each(NB_CASES)("nb = %i", (nb) => {
    const [heads, dim] = nb === 1024 ? [2, 16] : [8, 48];
    const width = heads * dim;
    const o = randomF32(nb * width, nb, 2, "gated-o");
    const z = randomF32(nb * width, nb, 4, "gated-z");
    const w = normWeight(dim, 3);
    const ob = uploadF32(dev, o);
    const zb = uploadF32(dev, z);
    const y = outputF32(dev, nb * width);
    run(dev, (ctx) => encodeRmsNormGated(ctx, rows(ob, width), rows(zb, width), w, rows(y, width), nb, heads, eps));
    const wv = w.buffer.f32.slice(w.offset / 4, w.offset / 4 + dim);
    const want = o.slice();
    for (let v = 0; v < nb * heads; v++) rmsNormGated(want.subarray(v * dim, (v + 1) * dim), z.subarray(v * dim, (v + 1) * dim), wv, eps);
    expectClose(readF32(y, nb * width), want, TOL, `rms_norm_gated_f32 nb=${nb}`, width);
    expectGuard(y, nb * width);
  });

  test("rejects a norm weight that is not f32", () => {
    const b = dev.buffer(4096);
    const w12 = uploadWeights(dev, { w: hostTensor(new Float32Array(12), "bf16", [12]) }).refs.w;
    expect(() => run(dev, (ctx) => encodeRmsNorm(ctx, rows(b, 12), w12, rows(b, 12), 1, eps))).toThrow("weight dtype bf16, expected f32");
  });
});
