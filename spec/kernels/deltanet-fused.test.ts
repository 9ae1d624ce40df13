// The fused DeltaNet block (lib/gpu/deltanet.ts encodeDeltaNetBlock: deltanet_conv_rows_f32 +
// rms_norm_gated_conv_window_f32) against the three kernels it replaces (conv_silu_rows_f32,
// deltanet_rows_f32, rms_norm_gated_f32) bit for bit: outputs, S, the conv window and the
// snapshot planes; against lib/reference (conv + SiLU, the gated delta rule, the gated
// RMSNorm) within the existing kernels' tolerances; rollback and decode after prefill.
import { afterAll, describe, expect, test } from "bun:test";

import {
  deltanetFuses,
  deltanetNormFused,
  deltanetStateFloats,
  deltanetStateFromGpu,
  deltanetStateToGpu,
  encodeDeltaNetBlock,
  encodeDeltaNetRestore,
  parseFuseRows,
  type DeltaNetShape,
} from "../../lib/gpu/deltanet.ts";
import type { EncodeContext } from "../../lib/gpu/dispatch.ts";
import { MAX_NB } from "../../lib/gpu/limits.ts";
import { allocatePlanes, readPlane, SNAPSHOT_PLANES } from "../../lib/gpu/snapshots.ts";
import type { Buffer } from "../../lib/shim.ts";
import { deltanetStep } from "../../lib/reference/deltanet.ts";
import { causalConvStep, l2Normalize, rmsNormGated, sigmoid, silu, softplus } from "../../lib/reference/ops.ts";
import { recordingNames } from "../dispatch-names.ts";
import { expectClose, expectExact, hostTensor, NB_CASES, openDevice, outputF32, randomF32, rows, run, uploadF32, uploadWeights } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

const EPS = 1e-6;
const TINY: DeltaNetShape = { keyHeads: 2, keyDim: 16, valueHeads: 4, valueDim: 16 };
const NARROW: DeltaNetShape = { keyHeads: 1, keyDim: 16, valueHeads: 2, valueDim: 8 };
const width = (s: DeltaNetShape) => 2 * s.keyHeads * s.keyDim + s.valueHeads * s.valueDim;

interface BlockCase extends DeltaNetShape {
  nb: number;
  K: number;
  x: Float32Array;
  convW: Float32Array;
  window: Float32Array;
  b: Float32Array;
  a: Float32Array;
  aLog: Float32Array;
  dtBias: Float32Array;
  S: Float32Array;
  z: Float32Array;
  normW: Float32Array;
}

function blockCase(nb: number, shape: DeltaNetShape, K: number, seed: number): BlockCase {
  const C = width(shape);
  const Hv = shape.valueHeads;
  return {
    ...shape,
    nb,
    K,
    x: randomF32(nb * C, seed, 1, "x"),
    convW: randomF32(C * K, seed, 0.6, "conv-w"),
    window: K > 1 ? randomF32((K - 1) * C, seed, 1, "window") : new Float32Array(1),
    b: randomF32(nb * Hv, seed, 3, "b"),
    a: randomF32(nb * Hv, seed, 3, "a"),
    aLog: randomF32(Hv, seed, 1, "A_log"),
    dtBias: randomF32(Hv, seed, 1, "dt_bias"),
    S: randomF32(deltanetStateFloats(shape), seed, 0.5, "S"),
    z: randomF32(nb * Hv * shape.valueDim, seed, 4, "z"),
    normW: randomF32(shape.valueDim, seed, 0.5, "norm-w"),
  };
}

interface BlockGpu {
  o: Buffer;
  S: Buffer;
  window: Buffer;
  planes: { S: ReturnType<typeof allocatePlanes>; conv: ReturnType<typeof allocatePlanes> };
  /** Encodes rows [first, first + n) of the case, fused, as the three kernels, or (undefined) as the host chooses. */
  encode: (ctx: EncodeContext, first: number, n: number, fuse: boolean | undefined, snapRows?: number) => void;
}

function blockOnDevice(c: BlockCase): BlockGpu {
  const C = width(c);
  const Hv = c.valueHeads;
  const ow = Hv * c.valueDim;
  const { refs } = uploadWeights(dev, {
    conv: hostTensor(c.convW, "f32", [C, c.K]),
    aLog: hostTensor(c.aLog, "f32", [Hv]),
    dtBias: hostTensor(c.dtBias, "f32", [Hv]),
    norm: hostTensor(c.normW, "f32", [c.valueDim]),
  });
  const x = uploadF32(dev, c.x);
  const b = uploadF32(dev, c.b);
  const a = uploadF32(dev, c.a);
  const z = uploadF32(dev, c.z);
  const convOut = outputF32(dev, c.nb * C);
  const o = outputF32(dev, c.nb * ow);
  const S = uploadF32(dev, deltanetStateToGpu(c.S, c));
  const window = uploadF32(dev, c.window);
  const planes = { S: allocatePlanes(dev, c.S.length), conv: allocatePlanes(dev, c.window.length) };
  const encode = (ctx: EncodeContext, first: number, n: number, fuse: boolean | undefined, snapRows = 0) =>
    encodeDeltaNetBlock(
      ctx,
      {
        ...c,
        rows: n,
        x: rows(x, C, first * C * 4),
        convWeight: refs.conv,
        convState: window,
        convOut: rows(convOut, C, first * C * 4),
        b: rows(b, Hv, first * Hv * 4),
        a: rows(a, Hv, first * Hv * 4),
        aLog: refs.aLog,
        dtBias: refs.dtBias,
        state: S,
        z: rows(z, ow, first * ow * 4),
        normWeight: refs.norm,
        eps: EPS,
        o: rows(o, ow, first * ow * 4),
        snapshots: snapRows > 0 ? { S: planes.S, conv: planes.conv, rows: snapRows } : undefined,
      },
      fuse,
    );
  return { o, S, window, planes, encode };
}

/** Reference: conv + SiLU, deltanetLayer's q/k normalisation, beta, g, deltanetStep, rmsNormGated. */
function blockReference(c: BlockCase): { o: Float32Array; S: Float32Array; window: Float32Array } {
  const { keyHeads: Hk, keyDim: dk, valueHeads: Hv, valueDim: dv, K } = c;
  const C = width(c);
  const S = c.S.slice();
  const win = c.window.slice();
  const o = new Float32Array(c.nb * Hv * dv);
  const conv = new Float32Array(C);
  for (let t = 0; t < c.nb; t++) {
    causalConvStep(win, c.x.subarray(t * C, (t + 1) * C), c.convW, C, K, conv);
    for (let i = 0; i < C; i++) conv[i] = silu(conv[i]!);
    for (let h = 0; h < Hk; h++) {
      const qh = conv.subarray(h * dk, (h + 1) * dk);
      l2Normalize(qh);
      for (let i = 0; i < dk; i++) qh[i] = qh[i]! / Math.sqrt(dk);
      l2Normalize(conv.subarray((Hk + h) * dk, (Hk + h + 1) * dk));
    }
    for (let h = 0; h < Hv; h++) {
      const kh = Math.floor(h / (Hv / Hk));
      const oh = o.subarray((t * Hv + h) * dv, (t * Hv + h + 1) * dv);
      const g = -Math.exp(c.aLog[h]!) * softplus(c.a[t * Hv + h]! + c.dtBias[h]!);
      deltanetStep(
        S.subarray(h * dk * dv, (h + 1) * dk * dv),
        conv.subarray(kh * dk, (kh + 1) * dk),
        conv.subarray((Hk + kh) * dk, (Hk + kh + 1) * dk),
        conv.subarray(2 * Hk * dk + h * dv, 2 * Hk * dk + (h + 1) * dv),
        Math.fround(sigmoid(c.b[t * Hv + h]!)),
        Math.fround(g),
        dk,
        dv,
        oh,
      );
      rmsNormGated(oh, c.z.subarray((t * Hv + h) * dv, (t * Hv + h + 1) * dv), c.normW, EPS);
    }
  }
  return { o, S, window: win };
}

/** Runs the case's nb rows fused and as the three kernels; every output bit for bit. */
function expectFusedEqualsUnfused(c: BlockCase, label: string, snapRows = 0): BlockGpu {
  const fused = blockOnDevice(c);
  const plain = blockOnDevice(c);
  run(dev, (ctx) => fused.encode(ctx, 0, c.nb, true, snapRows));
  run(dev, (ctx) => plain.encode(ctx, 0, c.nb, false, snapRows));
  const ow = c.valueHeads * c.valueDim;
  expectExact(fused.o.f32.subarray(0, c.nb * ow), plain.o.f32.subarray(0, c.nb * ow), `${label} o`, ow);
  expectExact(fused.S.f32.subarray(0, c.S.length), plain.S.f32.subarray(0, c.S.length), `${label} S`);
  expectExact(fused.window.f32.subarray(0, c.window.length), plain.window.f32.subarray(0, c.window.length), `${label} window`);
  for (let r = 0; r < snapRows; r++) {
    expectExact(readPlane(fused.planes.S, r), readPlane(plain.planes.S, r), `${label} S plane ${r}`);
    if (c.K > 1) expectExact(readPlane(fused.planes.conv, r), readPlane(plain.planes.conv, r), `${label} conv plane ${r}`);
  }
  return fused;
}

describe("fused DeltaNet block = conv + deltanet + gated norm, bit for bit", () => {
  test.each(NB_CASES)("nb %i", (nb) => {
    const c = blockCase(nb, nb === MAX_NB ? NARROW : TINY, 4, 300 + nb);
    const g = expectFusedEqualsUnfused(c, `fused nb=${nb}`);
    // The conv did move the window and the recurrence S (the comparison is not of untouched inputs).
    expect(Array.from(g.window.f32.subarray(0, c.window.length))).not.toEqual(Array.from(c.window));
  });

  test.each([
    ["dk 40, dv 24 (lanes hold two rows of S)", { keyHeads: 2, keyDim: 40, valueHeads: 2, valueDim: 24 }, 4],
    ["dk 64, r = 4", { keyHeads: 1, keyDim: 64, valueHeads: 4, valueDim: 8 }, 4],
    ["dk 128, dv 128, r = 2 (the 30b-a3b head shape)", { keyHeads: 1, keyDim: 128, valueHeads: 2, valueDim: 128 }, 4],
    ["kernel size 1 (no window)", TINY, 1],
    ["kernel size 2", TINY, 2],
    ["kernel size 6", NARROW, 6],
  ] as const)("shape %s", (_, shape, K) => {
    expectFusedEqualsUnfused(blockCase(5, shape, K, 41 + K), `fused ${shape.keyDim}x${shape.valueDim} K=${K}`);
  });

  test("snapshot planes of a verify batch, and rollback to them", () => {
    const nb = SNAPSHOT_PLANES;
    const c = blockCase(nb, TINY, 4, 61);
    const g = expectFusedEqualsUnfused(c, "fused snapshots", nb);
    // Plane r is the state after rows 0..r run alone (fused, r + 1 rows).
    for (const r of [0, 3, nb - 2]) {
      const part = blockOnDevice(c);
      run(dev, (ctx) => part.encode(ctx, 0, r + 1, true));
      expectExact(readPlane(g.planes.S, r), part.S.f32.subarray(0, c.S.length), `S plane ${r}`);
      expectExact(readPlane(g.planes.conv, r), part.window.f32.subarray(0, c.window.length), `conv plane ${r}`);
      run(dev, (ctx) => encodeDeltaNetRestore(ctx, r, { planes: g.planes.S, live: g.S }, { planes: g.planes.conv, live: g.window }));
      expectExact(g.S.f32.subarray(0, c.S.length), part.S.f32.subarray(0, c.S.length), `rollback S to row ${r}`);
      expectExact(g.window.f32.subarray(0, c.window.length), part.window.f32.subarray(0, c.window.length), `rollback window to row ${r}`);
    }
  });

  test("three-kernel prefill then fused decode equals fused token by token, bit for bit", () => {
    const n = 12;
    const c = blockCase(n, TINY, 4, 77);
    const batch = blockOnDevice(c);
    run(dev, (ctx) => batch.encode(ctx, 0, 9, false));
    for (let t = 9; t < n; t++) run(dev, (ctx) => batch.encode(ctx, t, 1, true));
    const single = blockOnDevice(c);
    run(dev, (ctx) => {
      for (let t = 0; t < n; t++) single.encode(ctx, t, 1, true);
    });
    const ow = c.valueHeads * c.valueDim;
    expectExact(batch.o.f32.subarray(0, n * ow), single.o.f32.subarray(0, n * ow), "o", ow);
    expectExact(batch.S.f32.subarray(0, c.S.length), single.S.f32.subarray(0, c.S.length), "S");
    expectExact(batch.window.f32.subarray(0, c.window.length), single.window.f32.subarray(0, c.window.length), "window");
  });
});

describe("fused DeltaNet block against lib/reference", () => {
  test.each([1, 5])("nb %i", (nb) => {
    const c = blockCase(nb, TINY, 4, 500 + nb);
    const ref = blockReference(c);
    const g = blockOnDevice(c);
    run(dev, (ctx) => g.encode(ctx, 0, nb, true));
    // The recurrence's tolerance (spec/kernels/deltanet.test.ts) carried through the gated
    // norm, which scales each head to unit RMS: relative errors stay those of o.
    expectClose(g.o.f32.subarray(0, ref.o.length), ref.o, { abs: 1e-5, rel: 1e-4 }, `fused-block nb=${nb}`, c.valueHeads * c.valueDim);
    expectClose(deltanetStateFromGpu(g.S.f32.subarray(0, ref.S.length), c), ref.S, { abs: 1e-6, rel: 1e-5 }, `fused-block-state nb=${nb}`, c.valueDim);
    expectExact(g.window.f32.subarray(0, ref.window.length), ref.window, `fused-block window nb=${nb}`);
  });
});

/** The default form for a shape the fused kernel refuses runs (the three kernels). */
function expectFusedEqualsUnfusedDefault(c: BlockCase): void {
  const auto = blockOnDevice(c);
  const plain = blockOnDevice(c);
  run(dev, (ctx) => auto.encode(ctx, 0, c.nb, undefined));
  run(dev, (ctx) => plain.encode(ctx, 0, c.nb, false));
  expectExact(auto.o.f32.subarray(0, c.nb * c.valueHeads * c.valueDim), plain.o.f32.subarray(0, c.nb * c.valueHeads * c.valueDim), "default form o");
}

describe("choosing the form", () => {
  test("decode and verify batches fuse, prefill batches take the three kernels", () => {
    expect(deltanetFuses(1, 128, 16)).toBe(true);
    expect(deltanetFuses(SNAPSHOT_PLANES, 128, 16)).toBe(true);
    expect(deltanetFuses(MAX_NB, 128, 16)).toBe(false);
    expect(deltanetFuses(1, 128)).toBe(false); // off by default (slower on the H200)
    expect(deltanetFuses(1, 128, 0)).toBe(false);
    // Key dims past DELTANET_CONV_MAX_KEY_DIM keep the three kernels, and the fused form refuses them.
    expect(deltanetFuses(1, 256, 16)).toBe(false);
    const c = blockCase(1, { keyHeads: 1, keyDim: 160, valueHeads: 1, valueDim: 8 }, 4, 9);
    const g = blockOnDevice(c);
    expect(() => run(dev, (ctx) => g.encode(ctx, 0, 1, true))).toThrow(/key dim 160 exceeds 128/);
    expectFusedEqualsUnfusedDefault(c);
  });

  test("a head wider than the recurrence + norm kernel holds keeps the two kernels where that fusion is on (it never refuses a model)", () => {
    const saved = process.env.CHERENKOV_DELTANET_NORM_FUSED;
    process.env.CHERENKOV_DELTANET_NORM_FUSED = "1";
    try {
      for (const shape of [
        { keyHeads: 1, keyDim: 160, valueHeads: 1, valueDim: 8 },
        { keyHeads: 1, keyDim: 16, valueHeads: 1, valueDim: 160 },
      ]) {
        const c = blockCase(1, shape, 4, 10);
        const names: string[] = [];
        const g = blockOnDevice(c);
        run(dev, (ctx) => g.encode(recordingNames(ctx, names), 0, 1, false));
        expect(names.some((n) => n.startsWith("deltanet_rows_norm"))).toBe(false);
        expect(names).toContain("rms_norm_gated_f32");
        // A head the kernel holds takes it.
        const small = blockOnDevice(blockCase(1, TINY, 4, 10));
        const seen: string[] = [];
        run(dev, (ctx) => small.encode(recordingNames(ctx, seen), 0, 1, false));
        expect(seen.some((n) => n.startsWith("deltanet_rows_norm"))).toBe(true);
      }
    } finally {
      if (saved === undefined) delete process.env.CHERENKOV_DELTANET_NORM_FUSED;
      else process.env.CHERENKOV_DELTANET_NORM_FUSED = saved;
    }
  });

  test("the fused form is two dispatches, the three kernels three (two where the recurrence takes its norm)", () => {
    const c = blockCase(1, TINY, 4, 12);
    const g = blockOnDevice(c);
    // The GPU backends run a decode row's recurrence and gated norm as one dispatch by default
    // (deltanetNormFused: deltanet_rows_norm_f32 after the conv).
    for (const [fuse, want] of [[true, 2], [false, deltanetNormFused(dev.backend) ? 2 : 3]] as const) {
      const before = dev.commandsEncoded;
      run(dev, (ctx) => g.encode(ctx, 0, 1, fuse));
      expect(dev.commandsEncoded - before).toBe(want);
    }
  });

  test("CHERENKOV_DELTANET_FUSE_ROWS is a row count", () => {
    expect(parseFuseRows(undefined, 16)).toBe(16);
    expect(parseFuseRows("0", 16)).toBe(0);
    expect(parseFuseRows("4", 16)).toBe(4);
    expect(() => parseFuseRows("-1", 16)).toThrow(/CHERENKOV_DELTANET_FUSE_ROWS/);
    expect(() => parseFuseRows("many", 16)).toThrow(/not a row count/);
  });
});
