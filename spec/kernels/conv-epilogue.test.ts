// DeltaNet's causal conv + SiLU in the epilogue of a decode row's q4 projections (kernels/conv.h,
// lib/gpu/projections.ts ProjectionConv): the conv output and the window, bit for bit, as
// the projection stored and conv_silu_rows_f32 after it leave them; the other projections of
// the same call unchanged; kernels of more than 4 taps, batches and wide rows left to the
// conv kernel (the call says so).
import { afterAll, afterEach, describe, expect, test } from "bun:test";

import { encodeConvSilu } from "../../lib/gpu/deltanet.ts";
import { bind, type EncodeContext } from "../../lib/gpu/dispatch.ts";
import { hcFoldCount } from "../../lib/gpu/hc-fold.ts";
import { encodeHcWrite, hcFold, hcMixCount, hcPartialCount, type HcConfig } from "../../lib/gpu/hyperconnection.ts";
import { encodeMatvecs, type Projection, type ProjectionConv } from "../../lib/gpu/projections.ts";
import { encodeSiteProjections, r1ReadKernel, type SiteRead } from "../../lib/gpu/site-read.ts";
import type { DType } from "../../lib/model/config.ts";
import type { Buffer } from "../../lib/shim.ts";
import { hostTensor, openDevice, outputF32, randomF32, recordingNames, rows, run, uploadF32, uploadWeight, uploadWeights } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());
const saved = process.env.CHERENKOV_HC_READ_FUSED;
afterEach(() => {
  if (saved === undefined) delete process.env.CHERENKOV_HC_READ_FUSED;
  else process.env.CHERENKOV_HC_READ_FUSED = saved;
});

const bits = (b: Buffer, count: number) => [...new Uint32Array(b.bytes.buffer, b.bytes.byteOffset, count)];

/** DeltaNet-like projections of width d: qkv (C channels, q4), z (q4), b and a (bf16). */
function projections(d: number, C: number, seed: number) {
  const ws: [DType, number][] = [["q4", C], ["q4", 64], ["bf16", 8], ["bf16", 8]];
  return ws.map(([dt, out], i) => uploadWeight(dev, dt, [out, d], seed + i).ref);
}

function convCase(C: number, K: number, seed: number) {
  const { refs } = uploadWeights(dev, { conv: hostTensor(randomF32(C * K, seed, 0.8, "conv-w"), "f32", [C, K]) });
  const state = randomF32(Math.max(1, (K - 1) * C), seed, 1, "conv-state");
  return { weight: refs.conv, state };
}

/**
 * The call both ways: with the conv asked of the projections (then, if they did not take it,
 * conv_silu_rows_f32 on what they stored), and without it followed by conv_silu_rows_f32.
 * `encode` runs the projections (x rows of width d) and returns whether the conv was done.
 */
function bothWays(d: number, C: number, K: number, nb: number, seed: number, encode: (ctx: EncodeContext, items: Projection[], x: Buffer, conv?: ProjectionConv) => boolean) {
  const ws = projections(d, C, seed);
  const conv = convCase(C, K, seed + 9);
  const x = uploadF32(dev, randomF32(nb * d, seed + 7, 1, "x"));
  const side = () => {
    const ys = ws.map((w) => outputF32(dev, nb * w.shape[0]!));
    return { ys, items: ws.map((w, i) => ({ w, y: rows(ys[i]!, w.shape[0]!) })), state: uploadF32(dev, conv.state), out: outputF32(dev, nb * C), names: [] as string[] };
  };
  const fused = side();
  const plain = side();
  let done = false;
  run(dev, (ctx) => {
    const c = recordingNames(ctx, fused.names);
    done = encode(c, fused.items, x, { of: fused.items[0]!, weight: conv.weight, state: bind(fused.state, 0), y: rows(fused.out, C) });
    if (!done) encodeConvSilu(c, { rows: nb, channels: C, x: fused.items[0]!.y, weight: conv.weight, state: bind(fused.state, 0), y: rows(fused.out, C) });
  });
  run(dev, (ctx) => {
    const c = recordingNames(ctx, plain.names);
    encode(c, plain.items, x);
    encodeConvSilu(c, { rows: nb, channels: C, x: plain.items[0]!.y, weight: conv.weight, state: bind(plain.state, 0), y: rows(plain.out, C) });
  });
  const sameBits = () => {
    expect(bits(fused.out, nb * C)).toEqual(bits(plain.out, nb * C));
    expect(bits(fused.state, (K - 1) * C)).toEqual(bits(plain.state, (K - 1) * C));
    // z, b and a: the same call stored them (the qkv itself is unwritten when the conv was taken).
    for (let i = 1; i < ws.length; i++) expect(bits(fused.ys[i]!, nb * ws[i]!.shape[0]!)).toEqual(bits(plain.ys[i]!, nb * ws[i]!.shape[0]!));
    expect(bits(fused.out, nb * C).some((v) => v !== 0)).toBe(true);
  };
  return { done, fused, plain, sameBits };
}

// The rows form on every backend: a GPU would pick the split form for these narrow shapes
// (prefersSplit), which has no conv epilogue (the engine's DeltaNet projections at the 30b
// shape take the rows form; the tiny model's, on a GPU, the split form and the conv kernel).
const viaMatvecs = (ctx: EncodeContext, items: Projection[], x: Buffer, conv?: ProjectionConv) =>
  encodeMatvecs(ctx, items, rows(x, items[0]!.w.shape[1]!), 1, conv ? { form: "rows", conv } : { form: "rows" });

describe("encodeMatvecs with a conv: matvec_multi_q4_r1_f32's epilogue", () => {
  test.each([4, 3, 2])("taps %i: the conv kernel's output and window, bit for bit; the other projections stored", (K) => {
    const r = bothWays(96, 256, K, 1, 10 + K, viaMatvecs);
    expect(r.done).toBe(true);
    expect(r.fused.names).not.toContain("conv_silu_rows_f32");
    expect(r.fused.names).toContain("matvec_multi_q4_r1_f32");
    r.sameBits();
  });

  test("5 taps, a batch of rows, a row wider than the staging: not taken, the conv kernel runs", () => {
    const five = bothWays(64, 128, 5, 1, 30, viaMatvecs);
    expect(five.done).toBe(false);
    five.sameBits();
    const wide = bothWays(4096, 128, 4, 1, 31, viaMatvecs);
    expect(wide.done).toBe(false);
    wide.sameBits();
    const batch = bothWays(64, 128, 4, 3, 32, (ctx, items, x, conv) => encodeMatvecs(ctx, items, rows(x, 64), 3, conv ? { form: "rows", conv } : { form: "rows" }));
    expect(batch.done).toBe(false);
    batch.sameBits();
  });
});

describe("the fused site read with a conv (matvec_multi_q4_r1_read_f32's epilogue)", () => {
  test("the read kernel + projections + conv kernel, bit for bit", () => {
    const [n, d, C] = [4, 64, 3072];
    const cfg: HcConfig = { streams: n, eps: 1e-6, sinkhorn_iters: 20 };
    const M = hcMixCount(n);
    const { refs } = uploadWeights(dev, {
      fn: hostTensor(randomF32(M * n * d, 40, 0.2, "fn"), "bf16", [M, n * d]),
      base: hostTensor(randomF32(M, 40, 1, "base"), "f32", [M]),
      scale: hostTensor(new Float32Array([0.7, 1.3, 2.1]), "f32", [3]),
      norm: hostTensor(randomF32(d, 40, 0.3, "norm"), "f32", [d]),
    });
    const X = uploadF32(dev, randomF32(n * d, 41, 2, "X"));
    const part = outputF32(dev, hcFoldCount(n, d));
    const folded = rows(part, hcFoldCount(n, d));
    run(dev, (ctx) => encodeHcWrite(ctx, rows(X, n * d), rows(uploadF32(dev, randomF32(M, 42, 1.5, "k")), M), rows(uploadF32(dev, randomF32(d, 43, 1, "y")), d), 1, n, d, hcFold(refs, folded, cfg, d)));
    process.env.CHERENKOV_HC_READ_FUSED = "1";
    const read = (): SiteRead => ({
      X: rows(X, n * d),
      site: refs,
      scratch: { raw: rows(outputF32(dev, hcPartialCount(n, d)), hcPartialCount(n, d)), coeffs: rows(outputF32(dev, M), M) },
      xn: rows(outputF32(dev, d), d),
      cfg,
      d,
      norm: { w: refs.norm, eps: 1e-6 },
      folded,
    });
    // q4 qkv of 3,072 channels (the rows form on a GPU too), z, and bf16 b and a.
    const r = bothWays(d, C, 4, 1, 50, (ctx, items, _x, conv) => {
      const s = read();
      return encodeSiteProjections(ctx, items, s, s.xn, 1, conv);
    });
    expect(r.done).toBe(true);
    expect(r.fused.names).toEqual([r1ReadKernel(n)]);
    r.sameBits();
  });
});
