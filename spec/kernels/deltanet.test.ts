// kernels/conv.metal and kernels/deltanet.metal against lib/reference (causalConvStep +
// SiLU; the q/k normalisation, beta, g and deltanetStep of deltanetLayer), at nb in
// NB_CASES; then the row snapshots, their rollback, and batch = row by row, bit for bit.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeConvSilu, encodeDeltaNetRestore, deltanetStateFromGpu, type DeltaNetShape } from "../../lib/gpu/deltanet.ts";
import type { EncodeContext } from "../../lib/gpu/dispatch.ts";
import { MAX_NB } from "../../lib/gpu/limits.ts";
import { allocatePlanes, readPlane, SNAPSHOT_PLANES } from "../../lib/gpu/snapshots.ts";
import { causalConvStep, silu } from "../../lib/reference/ops.ts";
import type { Buffer } from "../../lib/shim.ts";
import { dnCase, dnOnDevice as dnOnDeviceOf, dnReference, width, type DnCase } from "./deltanet-util.ts";
import { expectClose, expectExact, hostTensor, NB_CASES, openDevice, outputF32, randomF32, rows, run, uploadF32, uploadWeights } from "./harness.ts";
import { printWorstErrors } from "./sequence-util.ts";

const dev = openDevice();
afterAll(() => {
  printWorstErrors();
  dev.close();
});

// ---- conv ------------------------------------------------------------------------------

interface ConvCase {
  C: number;
  K: number;
  x: Float32Array;
  w: Float32Array;
  state: Float32Array;
}

function convCase(nb: number, C: number, K: number, seed: number): ConvCase {
  return { C, K, x: randomF32(nb * C, seed, 1, "x"), w: randomF32(C * K, seed, 0.6, "w"), state: randomF32((K - 1) * C, seed, 1, "state") };
}

/** Reference: causalConvStep + SiLU row by row; returns y [nb][C] and the final window. */
function convReference(c: ConvCase, nb: number): { y: Float32Array; state: Float32Array } {
  const win = c.state.slice();
  const y = new Float32Array(nb * c.C);
  const out = new Float32Array(c.C);
  for (let t = 0; t < nb; t++) {
    causalConvStep(win, c.x.subarray(t * c.C, (t + 1) * c.C), c.w, c.C, c.K, out);
    for (let i = 0; i < c.C; i++) y[t * c.C + i] = silu(out[i]!);
  }
  return { y, state: win };
}

interface ConvGpu {
  x: Buffer;
  y: Buffer;
  state: Buffer;
  encode: (ctx: EncodeContext, nb: number, xRow?: number, snapRows?: number) => void;
  planes: ReturnType<typeof allocatePlanes> | null;
}

function convOnDevice(c: ConvCase, nb: number): ConvGpu {
  const { refs } = uploadWeights(dev, { w: hostTensor(c.w, "f32", [c.C, c.K]) });
  const x = uploadF32(dev, c.x);
  const y = outputF32(dev, nb * c.C);
  const state = uploadF32(dev, c.state);
  const planes = c.K > 1 ? allocatePlanes(dev, (c.K - 1) * c.C) : null;
  const encode = (ctx: EncodeContext, n: number, xRow = 0, snapRows = 0) =>
    encodeConvSilu(ctx, {
      rows: n,
      channels: c.C,
      x: rows(x, c.C, xRow * c.C * 4),
      weight: refs.w,
      state,
      y: rows(y, c.C, xRow * c.C * 4),
      snapshots: snapRows > 0 && planes ? { planes, rows: snapRows } : undefined,
    });
  return { x, y, state, encode, planes };
}

describe("conv_silu_rows_f32", () => {
  test.each(NB_CASES)("nb %i against causalConvStep + SiLU", (nb) => {
    const c = convCase(nb, nb === MAX_NB ? 48 : 160, 4, 100 + nb);
    const ref = convReference(c, nb);
    const g = convOnDevice(c, nb);
    run(dev, (ctx) => g.encode(ctx, nb));
    // f32 sum of K products vs the reference's f64 sum, then SiLU: a few f32 ulps.
    expectClose(g.y.f32.subarray(0, nb * c.C), ref.y, { abs: 1e-6, rel: 1e-6 }, `conv nb=${nb}`, c.C);
    // The window only moves inputs: exact.
    expectExact(g.state.f32.subarray(0, c.state.length), ref.state, `conv window nb=${nb}`, c.C);
  });

  test("row blocks (16 rows a thread on a GPU): a window wider than a block (K 20) and K 4, over several blocks", () => {
    for (const K of [4, 20]) {
      const c = convCase(MAX_NB, 40, K, 31 + K);
      const ref = convReference(c, MAX_NB);
      const g = convOnDevice(c, MAX_NB);
      run(dev, (ctx) => g.encode(ctx, MAX_NB));
      expectClose(g.y.f32.subarray(0, MAX_NB * c.C), ref.y, { abs: 1e-6, rel: 1e-6 }, `conv K=${K} nb=${MAX_NB}`, c.C);
      expectExact(g.state.f32.subarray(0, c.state.length), ref.state, `conv window K=${K}`, c.C);
    }
  });

  test("kernel size 1 (no window) and 2", () => {
    for (const K of [1, 2]) {
      const c = convCase(5, 40, K, 7 + K);
      const ref = convReference(c, 5);
      const g = convOnDevice({ ...c, state: K === 1 ? new Float32Array(1) : c.state }, 5);
      run(dev, (ctx) => g.encode(ctx, 5));
      expectClose(g.y.f32.subarray(0, 5 * c.C), ref.y, { abs: 1e-6, rel: 1e-6 }, `conv K=${K}`, c.C);
    }
  });
});

// ---- DeltaNet --------------------------------------------------------------------------

// The row scan's own tests: the host's form choice is forced to it.
const dnOnDevice = (c: DnCase) => {
  const g = dnOnDeviceOf(dev, c);
  return { ...g, encode: (ctx: EncodeContext, first: number, n: number, snapRows = 0) => g.encode(ctx, first, n, snapRows, false) };
};

const TINY: DeltaNetShape = { keyHeads: 2, keyDim: 16, valueHeads: 4, valueDim: 16 };
const NARROW: DeltaNetShape = { keyHeads: 1, keyDim: 16, valueHeads: 2, valueDim: 8 };

describe("deltanet_rows_f32", () => {
  test.each(NB_CASES)("nb %i against deltanetStep", (nb) => {
    const c = dnCase(nb, nb === MAX_NB ? NARROW : TINY, 200 + nb);
    const ref = dnReference(c);
    const g = dnOnDevice(c);
    run(dev, (ctx) => g.encode(ctx, 0, nb));
    // f32 reductions over dk (and the algebraically equal o = e^g S.q + delta q.k form) vs
    // f64 sums; the state carries rounding across rows, decayed by e^g < 1.
    expectClose(g.o.f32.subarray(0, ref.o.length), ref.o, { abs: 1e-6, rel: 1e-5 }, `deltanet nb=${nb}`, c.valueHeads * c.valueDim);
    expectClose(deltanetStateFromGpu(g.S.f32.subarray(0, ref.S.length), c), ref.S, { abs: 1e-6, rel: 1e-5 }, `deltanet-state nb=${nb}`, c.valueDim);
  });

  test.each([
    ["dk 40, dv 24 (lanes hold two rows of S)", { keyHeads: 2, keyDim: 40, valueHeads: 2, valueDim: 24 }],
    ["dk 64, r = 4", { keyHeads: 1, keyDim: 64, valueHeads: 4, valueDim: 8 }],
  ] as const)("shape %s", (_, shape) => {
    const c = dnCase(5, shape, 31);
    const ref = dnReference(c);
    const g = dnOnDevice(c);
    run(dev, (ctx) => g.encode(ctx, 0, 5));
    expectClose(g.o.f32.subarray(0, ref.o.length), ref.o, { abs: 1e-6, rel: 1e-5 }, "deltanet shapes", c.valueHeads * c.valueDim);
    expectClose(deltanetStateFromGpu(g.S.f32.subarray(0, ref.S.length), c), ref.S, { abs: 1e-6, rel: 1e-5 }, "deltanet-state shapes", c.valueDim);
  });
});

// ---- state: snapshots, rollback, row batching --------------------------------------------

describe("sequence state", () => {
  const nb = SNAPSHOT_PLANES; // a full verify batch: 1 + MAX_SNAP rows
  const cc = convCase(nb, 96, 4, 55);
  const dc = dnCase(nb, TINY, 56);
  // Conv input width must equal the DeltaNet qkv width for the combined rollback below.
  const C = width(TINY);
  const conv = convCase(nb, C, 4, 57);

  test("snapshot plane r equals the state after running rows 0..r alone; rollback restores it bit for bit", () => {
    const full = dnOnDevice(dc);
    const cfull = convOnDevice(conv, nb);
    run(dev, (ctx) => {
      cfull.encode(ctx, nb, 0, nb);
      full.encode(ctx, 0, nb, nb);
    });
    const finalS = full.S.f32.slice(0, dc.S.length);
    const finalW = cfull.state.f32.slice(0, conv.state.length);
    for (let r = 0; r < nb; r++) {
      const part = dnOnDevice(dc);
      const cpart = convOnDevice(conv, nb);
      run(dev, (ctx) => {
        cpart.encode(ctx, r + 1);
        part.encode(ctx, 0, r + 1);
      });
      expectExact(readPlane(full.planes, r), part.S.f32.subarray(0, dc.S.length), `S plane ${r}`);
      expectExact(readPlane(cfull.planes!, r), cpart.state.f32.subarray(0, conv.state.length), `conv plane ${r}`);
    }
    // The last plane is the live state.
    expectExact(readPlane(full.planes, nb - 1), finalS, "last S plane = live S");
    // Roll back to each accepted row and compare with the plane (and not the final state).
    for (const r of [0, 3, nb - 2]) {
      run(dev, (ctx) =>
        encodeDeltaNetRestore(ctx, r, { planes: full.planes, live: full.S }, { planes: cfull.planes!, live: cfull.state }),
      );
      expectExact(full.S.f32.subarray(0, dc.S.length), readPlane(full.planes, r), `rollback S to row ${r}`);
      expectExact(cfull.state.f32.subarray(0, conv.state.length), readPlane(cfull.planes!, r), `rollback conv to row ${r}`);
      expect(Array.from(full.S.f32.subarray(0, dc.S.length))).not.toEqual(Array.from(finalS));
      expect(Array.from(cfull.state.f32.subarray(0, conv.state.length))).not.toEqual(Array.from(finalW));
    }
  });

  test("decode after prefill equals token by token, bit for bit", () => {
    const n = 12;
    const c = dnCase(n, TINY, 77);
    const k = convCase(n, C, 4, 78);
    const batch = dnOnDevice(c);
    const cbatch = convOnDevice(k, n);
    // Prefill 9 rows as one batch, then 3 decode steps.
    run(dev, (ctx) => {
      cbatch.encode(ctx, 9, 0);
      batch.encode(ctx, 0, 9);
    });
    for (let t = 9; t < n; t++)
      run(dev, (ctx) => {
        cbatch.encode(ctx, 1, t);
        batch.encode(ctx, t, 1);
      });
    const single = dnOnDevice(c);
    const csingle = convOnDevice(k, n);
    run(dev, (ctx) => {
      for (let t = 0; t < n; t++) {
        csingle.encode(ctx, 1, t);
        single.encode(ctx, t, 1);
      }
    });
    expectExact(batch.o.f32.subarray(0, n * c.valueHeads * c.valueDim), single.o.f32.subarray(0, n * c.valueHeads * c.valueDim), "o");
    expectExact(batch.S.f32.subarray(0, c.S.length), single.S.f32.subarray(0, c.S.length), "S");
    expectExact(cbatch.y.f32.subarray(0, n * C), csingle.y.f32.subarray(0, n * C), "conv y");
    expectExact(cbatch.state.f32.subarray(0, k.state.length), csingle.state.f32.subarray(0, k.state.length), "conv window");
  });

  test("snapshot rows are bounds-checked", () => {
    const g = dnOnDevice(dc);
    expect(() => run(dev, (ctx) => g.encode(ctx, 0, 2, 3))).toThrow(/snapshot rows 3/);
    void cc;
  });
});
