// Embedding gather (kernels/embed.metal) against the reference's rows of the stored table
// (bf16/f16 rounded, q4 dequantized), into n streams.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeEmbed } from "../../lib/gpu/embed.ts";
import type { DType } from "../../lib/model/config.ts";
import { expectClose, expectGuard, NB_CASES, openDevice, outputF32, randomTokens, readF32, rows, run, uploadI32, uploadWeight } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

const DTYPES: DType[] = ["f32", "bf16", "f16", "q4"];

describe.each(DTYPES)("embed_%s_f32", (dtype) => {
  test.each(NB_CASES.flatMap((nb) => [[nb, 1], [nb, 4]] as const))("nb = %i, %i streams", (nb, n) => {
    const [vocab, d] = [97, nb === 1024 ? 32 : 96];
    const { ref, host } = uploadWeight(dev, dtype, [vocab, d], 3);
    const ids = randomTokens(nb, vocab, nb + n);
    const X = outputF32(dev, nb * n * d);
    run(dev, (ctx) => encodeEmbed(ctx, ref, uploadI32(dev, ids), rows(X, n * d), nb, n));
    const want = new Float32Array(nb * n * d);
    for (let r = 0; r < nb; r++)
      for (let i = 0; i < n; i++) want.set(host.values.subarray(ids[r]! * d, (ids[r]! + 1) * d), (r * n + i) * d);
    // q4: scale * q + bias in f32, exactly as the reference dequantizes; others are copies.
    expectClose(readF32(X, nb * n * d), want, { abs: 0 }, `embed_${dtype}_f32 nb=${nb}`, n * d);
    expectGuard(X, nb * n * d);
  });
});

test("an id outside the vocabulary writes NaN, not a stray row", () => {
  const { ref } = uploadWeight(dev, "bf16", [10, 32], 1);
  const X = outputF32(dev, 3 * 32);
  X.f32.fill(0);
  run(dev, (ctx) => encodeEmbed(ctx, ref, uploadI32(dev, [3, 10, -1]), rows(X, 32), 3));
  expect(readF32(X, 32).every(Number.isFinite)).toBe(true);
  expect(readF32(X, 64, 32).every(Number.isNaN)).toBe(true);
});
