// The end of a step (kernels/output.metal through lib/gpu/sampling.ts and lib/gpu/mtp.ts):
// greedy argmax with the top1 - top2 margin, logits + argmax, and the MTP input fusion,
// against lib/reference ops (argmax, topTwoMargin, matvec, rmsNorm).
import { afterAll, describe, test } from "bun:test";

import { encodeMtpInput } from "../../lib/gpu/mtp.ts";
import { encodeArgmax, encodeLogits } from "../../lib/gpu/sampling.ts";
import type { DType } from "../../lib/model/config.ts";
import { argmax, matmulRows, rmsNorm, topTwoMargin } from "../../lib/reference/ops.ts";
import {
  expectClose,
  expectExact,
  hostTensor,
  NB_CASES,
  openDevice,
  outputF32,
  outputI32,
  randomF32,
  randomTokens,
  readF32,
  readI32,
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

describe("argmax_f32", () => {
  // 2,000 and 20,000: float4 loads (one simdgroup on the CPU backend, 8 on a GPU; 32); 5,003: one float at a time.
  const cases = NB_CASES.flatMap((nb) => (nb === 1024 ? [[nb, 64]] : [[nb, 2000], [nb, 5003], [nb, 20000]]) as [number, number][]);
  test.each(cases)("nb = %i, vocab = %i", (nb, vocab) => {
    const r = rng(nb + vocab, "logits");
    // On a grid of 1/16 in [-4, 4): the maximum is often tied, and ties must go to the lowest id.
    const logits = Float32Array.from({ length: nb * vocab }, () => Math.round(r.symmetric() * 64) / 16);
    const lb = uploadF32(dev, logits);
    const ids = outputI32(dev, nb);
    const margin = outputF32(dev, nb);
    run(dev, (ctx) => encodeArgmax(ctx, rows(lb, vocab), ids, margin, nb, vocab));
    const rowsOf = Array.from({ length: nb }, (_, i) => logits.subarray(i * vocab, (i + 1) * vocab));
    expectExact(readI32(ids, nb), rowsOf.map(argmax), `argmax_f32 nb=${nb}`);
    // top1 - top2 of two f32 values is one rounding: exact against fround of the f64 difference.
    expectClose(readF32(margin, nb), rowsOf.map((x) => Math.fround(topTwoMargin(x))), { abs: 0 }, `argmax_f32 margin nb=${nb}`);
  });
});

describe("logits (matvec over the LM head) + argmax", () => {
  test.each(["q4", "bf16"] as DType[])("%s head", (dtype) => {
    const [nb, vocab, d] = [5, 320, 64];
    const { ref, host } = uploadWeight(dev, dtype, [vocab, d], 4);
    const x = randomF32(nb * d, 6, 1, "hidden");
    const xb = uploadF32(dev, x);
    const logits = outputF32(dev, nb * vocab);
    const ids = outputI32(dev, nb);
    const margin = outputF32(dev, nb);
    run(dev, (ctx) => {
      encodeLogits(ctx, ref, rows(xb, d), rows(logits, vocab), nb);
      encodeArgmax(ctx, rows(logits, vocab), ids, margin, nb, vocab);
    });
    const want = matmulRows(host.values, x, nb, vocab, d);
    expectClose(readF32(logits, nb * vocab), want, { abs: 4e-7 * d }, `logits_${dtype}`, vocab); // f32 dot order
    const wantIds = Array.from({ length: nb }, (_, i) => argmax(want.subarray(i * vocab, (i + 1) * vocab)));
    expectExact(readI32(ids, nb), wantIds, `logits_${dtype} argmax`);
  });
});

describe("mtp_fuse", () => {
  const DTYPES: DType[] = ["f32", "bf16", "f16", "q4"];
  test.each(DTYPES.flatMap((dt) => NB_CASES.map((nb) => [dt, nb] as const)))("embedding %s, nb = %i", (dtype, nb) => {
    const [vocab, d] = [50, nb === 1024 ? 32 : 96];
    const eps = 1e-6;
    const { ref: embed, host } = uploadWeight(dev, dtype, [vocab, d], 8);
    const norms = {
      embedNorm: hostTensor(randomF32(d, 1, 0.3, "en"), "f32", [d]),
      hiddenNorm: hostTensor(randomF32(d, 2, 0.3, "hn"), "f32", [d]),
    };
    const { refs } = uploadWeights(dev, norms);
    const ids = randomTokens(nb, vocab, nb);
    const h = randomF32(nb * d, nb, 2, "mtp-h");
    const y = outputF32(dev, nb * 2 * d);
    run(dev, (ctx) => encodeMtpInput(ctx, embed, uploadI32(dev, ids), rows(uploadF32(dev, h), d), refs, rows(y, 2 * d), nb, eps));
    const want = new Float32Array(nb * 2 * d);
    for (let r = 0; r < nb; r++) {
      const t = ids[r]!;
      rmsNorm(host.values.subarray(t * d, (t + 1) * d), norms.embedNorm.values, eps, {}, want.subarray(r * 2 * d, r * 2 * d + d));
      rmsNorm(h.subarray(r * d, (r + 1) * d), norms.hiddenNorm.values, eps, {}, want.subarray(r * 2 * d + d, (r + 1) * 2 * d));
    }
    // a norm per half: a few ulps per element
    expectClose(readF32(y, nb * 2 * d), want, { rel: 1e-5, abs: 1e-6 }, `mtp_fuse_${dtype} nb=${nb}`, 2 * d);
  });
});
