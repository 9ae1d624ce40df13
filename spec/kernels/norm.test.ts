// RMSNorm kernels (kernels/norm.metal) against lib/reference rmsNorm, rmsNormHeads and
// rmsNormGated: whole rows (zero-centred and plain weights), heads within rows, the gated form.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeElementwise } from "../../lib/gpu/elementwise.ts";
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

describe("rms_norm_f32, wide rows", () => {
  // Rows wider than a lane's batch of loads (8 turns of 32: norm.h NORM_LOADS): 2,048 (the
  // 30b shape's hidden size, two batches) and 2,080 (a tail past them).
  test.each([2048, 2080])("d = %i, nb = 3", (d) => {
    const nb = 3;
    const x = randomF32(nb * d, d, 3, "wide-x");
    const w = normWeight(d, 4);
    const xb = uploadF32(dev, x);
    const y = outputF32(dev, nb * d);
    run(dev, (ctx) => encodeRmsNorm(ctx, rows(xb, d), w, rows(y, d), nb, eps));
    const wv = w.buffer.f32.subarray(w.offset / 4, w.offset / 4 + d);
    const want = new Float32Array(nb * d);
    for (let r = 0; r < nb; r++) rmsNorm(x.subarray(r * d, (r + 1) * d), wv, eps, { zeroCentred: true }, want.subarray(r * d, (r + 1) * d));
    expectClose(readF32(y, nb * d), want, TOL, `rms_norm_f32 d=${d}`, d);
    expectGuard(y, nb * d);
  });
});

describe("rms_norm_bias_f32 (the PLE layer's k = RMSNorm(W_k e + b_k))", () => {
  test.each(NB_CASES.flatMap((nb) => [[nb, 1], [nb, 4]] as const))("nb = %i, heads %i: the bits of ew_add_f32 then rms_norm_f32", (nb, heads) => {
    const dim = nb === 1024 ? 48 : 520; // 520: a lane's batch of loads, then a tail
    const width = heads * dim;
    const x = randomF32(nb * width, 11 + nb, 3, "bias-x");
    const bias = uploadWeights(dev, { b: hostTensor(randomF32(width, 12, 1, "bias-b"), "f32", [width]) }).refs.b;
    const w = normWeight(dim, 5);
    const xb = uploadF32(dev, x);
    const fused = outputF32(dev, nb * width);
    run(dev, (ctx) => encodeRmsNorm(ctx, rows(xb, width), w, rows(fused, width), nb, eps, { heads, bias }));
    // The two dispatches it replaces, on a copy of x.
    const added = uploadF32(dev, x);
    const separate = outputF32(dev, nb * width);
    run(dev, (ctx) => {
      encodeElementwise(ctx, "add", rows(added, width), { buffer: bias.buffer, offset: bias.offset, stride: 0 }, rows(added, width), nb, width);
      encodeRmsNorm(ctx, rows(added, width), w, rows(separate, width), nb, eps, { heads });
    });
    const got = readF32(fused, nb * width);
    expect(Buffer.from(got.buffer, got.byteOffset, got.byteLength).equals(Buffer.from(readF32(separate, nb * width).buffer))).toBe(true);
    // And against the reference: x + b, then the norm per head.
    const bv = bias.buffer.f32.subarray(bias.offset / 4, bias.offset / 4 + width);
    const wv = w.buffer.f32.slice(w.offset / 4, w.offset / 4 + dim);
    const want = x.slice();
    for (let r = 0; r < nb; r++) {
      const row = want.subarray(r * width, (r + 1) * width);
      for (let c = 0; c < width; c++) row[c] = Math.fround(row[c]! + bv[c]!);
      rmsNormHeads(row, wv, heads, dim, eps);
    }
    expectClose(got, want, TOL, `rms_norm_bias_f32 nb=${nb}`, width);
    expectGuard(fused, nb * width);
  });

  test("a bias of the wrong length is refused, naming the kernel", () => {
    const w = normWeight(16, 6);
    const bias = uploadWeights(dev, { b: hostTensor(randomF32(8, 13, 1, "bias-short"), "f32", [8]) }).refs.b;
    const xb = uploadF32(dev, randomF32(16, 14, 1, "bias-x1"));
    const y = outputF32(dev, 16);
    expect(() => run(dev, (ctx) => encodeRmsNorm(ctx, rows(xb, 16), w, rows(y, 16), 1, eps, { bias }))).toThrow(/rms_norm_bias_f32/);
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
