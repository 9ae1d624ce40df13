// The plain residual's read (n = 1, no site: the MTP head) formed by the projections that
// consume it (lib/gpu/site-read.ts PlainRead, matvec_multi_q4_r1_norm_f32): one dispatch gives,
// bit for bit, what rms_norm_f32 followed by the decode projections give (the projections and
// the norm stored to xn), with a conv in the epilogue too; steps it cannot take fall back to
// those two.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeConvSilu } from "../../lib/gpu/deltanet.ts";
import { bind } from "../../lib/gpu/dispatch.ts";
import { encodeRmsNorm } from "../../lib/gpu/norms.ts";
import { encodeMatvecs, type Projection } from "../../lib/gpu/projections.ts";
import { encodeSiteProjections, plainRead } from "../../lib/gpu/site-read.ts";
import type { DType } from "../../lib/model/config.ts";
import { bitsOf as bits, hostTensor, openDevice, outputF32, randomF32, recordingNames, restoreEnvAfterEach, rows, run, uploadF32, uploadWeight, uploadWeights } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());
restoreEnvAfterEach("CHERENKOV_HC_READ_FUSED", "CHERENKOV_HC_READ_TILES");

/** A residual row X (at a 16-byte offset inside its buffer) and its norm weights. */
function residual(d: number, seed: number, centred: boolean) {
  const { refs } = uploadWeights(dev, { norm: hostTensor(randomF32(d, seed, 0.3, "norm"), "f32", [d]) });
  const X = uploadF32(dev, new Float32Array([...new Float32Array(4), ...randomF32(d, seed, 2, "X")]));
  return { X: { buffer: X, offset: 16, stride: d * 4 }, norm: { w: refs.norm, eps: 1e-6, centred } };
}

type Form = "rows" | "split" | "mixed";

/** The projections both ways: the fused dispatch, and rms_norm_f32 + encodeMatvecs in `form` (the one the fused kernel computes). */
function bothWays(d: number, weights: [DType, number][], seed: number, form: Form, centred = true) {
  const { X, norm } = residual(d, seed, centred);
  const ws = weights.map(([dt, out], i) => uploadWeight(dev, dt, [out, d], seed + 10 + i).ref);
  const side = () => {
    const ys = ws.map((w) => outputF32(dev, w.shape[0]!));
    return { ys, xn: outputF32(dev, d), names: [] as string[], items: ws.map((w, i): Projection => ({ w, y: rows(ys[i]!, w.shape[0]!) })) };
  };
  const fused = side();
  const apart = side();
  process.env.CHERENKOV_HC_READ_FUSED = "1";
  run(dev, (ctx) => encodeSiteProjections(recordingNames(ctx, fused.names), fused.items, plainRead(X, rows(fused.xn, d), d, norm, true), rows(fused.xn, d), 1));
  run(dev, (ctx) => {
    const c = recordingNames(ctx, apart.names);
    encodeRmsNorm(c, X, norm.w, rows(apart.xn, d), 1, norm.eps, { centred });
    encodeMatvecs(c, apart.items, rows(apart.xn, d), 1, form === "mixed" ? { mixed: true } : { form });
  });
  return { ws, fused, apart };
}

describe("matvec_multi_q4_r1_norm_f32: rms_norm_f32 and the decode projections in one dispatch, the same bits", () => {
  const cases: [string, number, [DType, number][], Form, string, boolean][] = [
    ["the MTP head's attention q, gate, k, v (q4, 640 rows)", 256, [["q4", 256], ["q4", 256], ["q4", 64], ["q4", 64]], "rows", "2", true],
    ["the same, three tiles a simdgroup, plain w", 256, [["q4", 256], ["q4", 256], ["q4", 64], ["q4", 64]], "rows", "3", false],
    ["the MoE site's router and shared gate (bf16 alone, the split form)", 256, [["bf16", 16], ["bf16", 1]], "split", "2", true],
    ["the LM head (q4 [4096, 256])", 256, [["q4", 4096]], "rows", "2", true],
    ["a row of 2,048 (two turns a thread), q4 beside bf16", 2048, [["q4", 3072], ["bf16", 4]], "mixed", "2", true],
    ["a row of 96 (fewer columns than threads)", 96, [["q4", 1040], ["q4", 8]], "rows", "1", true],
  ];
  test.each(cases)("%s: d = %i", (_, d, weights, form, tiles, centred) => {
    process.env.CHERENKOV_HC_READ_TILES = tiles;
    const { ws, fused, apart } = bothWays(d, weights, 5 + d, form, centred);
    expect(fused.names).toEqual(["matvec_multi_q4_r1_norm_f32"]);
    expect(apart.names[0]).toBe("rms_norm_f32");
    ws.forEach((w, i) => expect(bits(fused.ys[i]!, w.shape[0]!)).toEqual(bits(apart.ys[i]!, w.shape[0]!)));
    expect(bits(fused.xn, d)).toEqual(bits(apart.xn, d));
    // Not a vacuous equality: the outputs were written.
    expect(bits(fused.xn, d).some((v) => v !== 0)).toBe(true);
    ws.forEach((w, i) => expect(bits(fused.ys[i]!, w.shape[0]!).some((v) => v !== 0)).toBe(true));
  });

  test("with DeltaNet's conv in the epilogue (a plain-residual trunk): the conv kernel's output and window", () => {
    const [d, C, K] = [128, 256, 4];
    const { X, norm } = residual(d, 60, true);
    const ws = ([["q4", C], ["q4", 64], ["bf16", 8], ["bf16", 8]] as [DType, number][]).map(([dt, out], i) => uploadWeight(dev, dt, [out, d], 61 + i).ref);
    const { refs } = uploadWeights(dev, { conv: hostTensor(randomF32(C * K, 66, 0.8, "conv-w"), "f32", [C, K]) });
    const state0 = randomF32((K - 1) * C, 67, 1, "conv-state");
    process.env.CHERENKOV_HC_READ_FUSED = "1";
    const side = (withConv: boolean) => {
      const ys = ws.map((w) => outputF32(dev, w.shape[0]!));
      const items = ws.map((w, i): Projection => ({ w, y: rows(ys[i]!, w.shape[0]!) }));
      const state = uploadF32(dev, state0);
      const out = outputF32(dev, C);
      const xn = outputF32(dev, d);
      const names: string[] = [];
      const conv = { of: items[0]!, weight: refs.conv, state: bind(state, 0), y: rows(out, C) };
      run(dev, (ctx) => {
        const c = recordingNames(ctx, names);
        const done = encodeSiteProjections(c, items, plainRead(X, rows(xn, d), d, norm, true), rows(xn, d), 1, withConv ? conv : undefined);
        if (!done) encodeConvSilu(c, { rows: 1, channels: C, x: items[0]!.y, weight: refs.conv, state: bind(state, 0), y: rows(out, C) });
      });
      return { ys, state, out, xn, names };
    };
    const fused = side(true);
    const apart = side(false);
    expect(fused.names).toEqual(["matvec_multi_q4_r1_norm_f32"]);
    expect(apart.names).toEqual(["matvec_multi_q4_r1_norm_f32", "conv_silu_rows_f32"]);
    expect(bits(fused.out, C)).toEqual(bits(apart.out, C));
    expect(bits(fused.state, (K - 1) * C)).toEqual(bits(apart.state, (K - 1) * C));
    for (let i = 1; i < ws.length; i++) expect(bits(fused.ys[i]!, ws[i]!.shape[0]!)).toEqual(bits(apart.ys[i]!, ws[i]!.shape[0]!));
    expect(bits(fused.xn, d)).toEqual(bits(apart.xn, d));
    expect(bits(fused.out, C).some((v) => v !== 0)).toBe(true);
  });
});

describe("steps the fused dispatch does not take encode rms_norm_f32, then the projections", () => {
  test("a row wider than the staging, a batch of rows, CHERENKOV_HC_READ_FUSED=0, a narrow q4 group read strictly on a GPU, an f32 weight", () => {
    const first = (d: number, nb: number, weights: [DType, number][], env: string, anyForm = true) => {
      const { X, norm } = residual(d, 90 + d + nb, true);
      const ws = weights.map(([dt, out], i) => uploadWeight(dev, dt, [out, d], 95 + i).ref);
      const xn = outputF32(dev, nb * d);
      const got: string[] = [];
      process.env.CHERENKOV_HC_READ_FUSED = env;
      const x = { ...X, stride: d * 4 };
      run(dev, (ctx) =>
        encodeSiteProjections(
          recordingNames(ctx, got),
          ws.map((w) => ({ w, y: rows(outputF32(dev, nb * w.shape[0]!), w.shape[0]!) })),
          plainRead(x, rows(xn, d), d, norm, anyForm),
          rows(xn, d),
          nb,
        ),
      );
      return got;
    };
    // (8 q4 rows take the split form on a GPU: prefersSplit)
    expect(first(4096, 1, [["q4", 8]], "1")).toEqual(["rms_norm_f32", dev.backend === "cpu" ? "matvec_q4_r1_f32" : "matvec_split_q4_r1_f32"]);
    // A batch of rows reads apart, except that a GPU runs up to 4 rows one row a threadgroup
    // (projections.ts ONE_ROW_BATCH), each row's read folded into its one-row projections.
    expect(first(64, 5, [["q4", 64]], "1")[0]).toBe("rms_norm_f32");
    expect(first(64, 3, [["q4", 64]], "1")[0]).toBe(dev.backend === "cpu" ? "rms_norm_f32" : "matvec_multi_q4_r1_norm_f32");
    expect(first(64, 1, [["q4", 64]], "0")[0]).toBe("rms_norm_f32");
    expect(first(64, 1, [["f32", 64]], "1")[0]).toBe("rms_norm_f32");
    expect(first(64, 1, [["q4", 64]], "1")).toEqual(["matvec_multi_q4_r1_norm_f32"]);
    // A GPU computes a group of 64 q4 rows in the split form (prefersSplit). A strict read (a
    // trunk's, whose verify batch must repeat its bits) is fused there only where that split
    // has one simdgroup (d <= 1,024: it sums a row as the rows form does); at d = 2,048 (two
    // simdgroups) it stays apart.
    expect(first(64, 1, [["q4", 64]], "1", false)[0]).toBe("matvec_multi_q4_r1_norm_f32");
    expect(first(2048, 1, [["q4", 64]], "1", false)[0]).toBe(dev.backend === "cpu" ? "matvec_multi_q4_r1_norm_f32" : "rms_norm_f32");
    // On the CPU backend the fused read is off unless forced.
    expect(first(64, 1, [["q4", 64]], "")[0]).toBe(dev.backend === "cpu" ? "rms_norm_f32" : "matvec_multi_q4_r1_norm_f32");
  });
});
