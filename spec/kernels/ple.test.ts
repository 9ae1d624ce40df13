// kernels/ple.metal against lib/reference/ple.ts (pleRowIndex, pleRows, pleGather, and the
// gate and conv steps of pleLayer) at nb in NB_CASES; then the conv history's row
// snapshots, their rollback, and batch = row by row, bit for bit.
import { afterAll, describe, expect, test } from "bun:test";

import type { ModelConfig } from "../../lib/model/config.ts";
import { presetConfig } from "../../lib/convert/presets.ts";
import type { EncodeContext } from "../../lib/gpu/dispatch.ts";
import { MAX_NB } from "../../lib/gpu/limits.ts";
import { encodePleConv, encodePleGate, encodePleGather, pleHistoryFloats } from "../../lib/gpu/ple.ts";
import { allocatePlanes, encodeRestore, readPlane, SNAPSHOT_PLANES } from "../../lib/gpu/snapshots.ts";
import { causalConvStep, dot, rmsNorm, sigmoid, silu } from "../../lib/reference/ops.ts";
import { pleGather, pleRowIndex, pleRows } from "../../lib/reference/ple.ts";
import type { Buffer } from "../../lib/shim.ts";
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
  rows,
  run,
  uploadF32,
  uploadI32,
  uploadWeights,
} from "./harness.ts";
import { printWorstErrors } from "./sequence-util.ts";

const dev = openDevice();
afterAll(() => {
  printWorstErrors();
  dev.close();
});

type Ple = NonNullable<ModelConfig["ple"]>;

// ---- hash and gather -------------------------------------------------------------------------

/** Tables of a PLE layer as the format stores them, and the f32 values the reference reads. */
function tablesFor(ple: Ple, dtype: "f32" | "bf16", seed: number) {
  const host = ple.orders.flatMap((_, o) =>
    Array.from({ length: ple.heads }, (_, j) => hostTensor(randomF32(ple.rows[o]![j]! * ple.head_dim, seed + 10 * o + j, 1, "table"), dtype, [ple.rows[o]![j]!, ple.head_dim])),
  );
  const named = Object.fromEntries(host.map((t, i) => [`t${i}`, t]));
  const { buffer, refs } = uploadWeights(dev, named, 16384);
  const offsets = host.map((_, i) => refs[`t${i}`]!.offset);
  const values = ple.orders.map((_, o) => Array.from({ length: ple.heads }, (_, j) => host[o * ple.heads + j]!.values));
  return { ref: { buffer, dtype, offsets }, values };
}

function gatherCase(ple: Ple, dtype: "f32" | "bf16", nb: number, pos0: number, history: number, seed: number) {
  const tokens = randomTokens(pos0 + nb, 320, seed);
  const { ref, values } = tablesFor(ple, dtype, seed);
  const T = ple.orders.length * ple.heads;
  const E = T * ple.head_dim;
  const tokBuf = uploadI32(dev, tokens.subarray(pos0 - history));
  const e = outputF32(dev, nb * E);
  const ids = outputI32(dev, nb * T);
  run(dev, (ctx) => encodePleGather(ctx, { rows: nb, pos0, ple, tokens: tokBuf, history, tables: ref, e: rows(e, E), rowIds: ids }));
  const config = { ple } as ModelConfig;
  const expE = new Float32Array(nb * E);
  const expIds: number[] = [];
  for (let t = 0; t < nb; t++) {
    const r = pleRows(config, tokens, pos0 + t);
    expIds.push(...r.flat());
    expE.set(pleGather(values, r, ple.head_dim), t * E);
  }
  return { e: e.f32.subarray(0, nb * E), ids: Array.from(ids.i32.subarray(0, nb * T)), expE, expIds, E, T };
}

/** A PLE config with orders up to 4 and 3 heads (9 tables), odd multipliers. */
const WIDE: Ple = {
  layers: [0],
  orders: [1, 2, 4],
  heads: 3,
  head_dim: 4,
  rows: [[31, 37, 41], [43, 47, 53], [59, 61, 67]],
  mult: [1, 2, 4].map((o, oi) => Array.from({ length: 3 }, (_, j) => Array.from({ length: o }, (_, i) => (Math.imul(0x9e3779b1, 7 + oi * 13 + j * 5 + i) | 1) >>> 0))),
  pad_id: 3,
  conv_kernel: 4,
};

describe("ple_gather", () => {
  const tiny = presetConfig("tiny").ple!;
  test.each(NB_CASES)("tiny tables f32, nb %i: rows and e equal the reference exactly", (nb) => {
    const pos0 = nb === 1 ? 30 : nb === 2 ? 1 : 0; // history clipped at the start
    const r = gatherCase(tiny, "f32", nb, pos0, Math.min(pos0, 2), nb);
    expectExact(r.ids, r.expIds, `ple rows nb=${nb}`, r.T);
    expectExact(r.e, r.expE, `ple e nb=${nb}`, r.E);
  });

  test("small preset tables in bf16, history longer than needed", () => {
    const r = gatherCase(presetConfig("small").ple!, "bf16", 5, 20, 6, 3);
    expectExact(r.ids, r.expIds, "ple rows bf16", r.T);
    expectExact(r.e, r.expE, "ple e bf16", r.E);
  });

  test("orders 1, 2, 4 with 3 heads; pad id before the start", () => {
    const r = gatherCase(WIDE, "f32", 7, 2, 2, 4);
    expectExact(r.ids, r.expIds, "ple rows wide", r.T);
    expectExact(r.e, r.expE, "ple e wide", r.E);
    // The hash itself: position 0 of order 4 mixes three pad tokens.
    const toks = [5, 9];
    expect(pleRowIndex(toks, 0, WIDE.mult[2]![0]!, WIDE.pad_id, 59)).toBe(
      ((Math.imul(5, WIDE.mult[2]![0]![0]!) ^ Math.imul(3, WIDE.mult[2]![0]![1]!) ^ Math.imul(3, WIDE.mult[2]![0]![2]!) ^ Math.imul(3, WIDE.mult[2]![0]![3]!)) >>> 0) % 59,
    );
  });

  test("too short a token history is refused", () => {
    expect(() => gatherCase(tiny, "f32", 2, 5, 1, 1)).toThrow(/history 1/);
  });
});

// ---- gate ------------------------------------------------------------------------------------------

function gateCase(nb: number, d: number, seed: number) {
  const k = randomF32(nb * d, seed, 1.5, "k");
  const q = randomF32(nb * d, seed, 1.5, "q");
  k.fill(0, 0, d); // row 0: s = 0 exactly, alpha = 1/2
  if (nb > 2) for (let c = 0; c < d; c++) k[2 * d + c] = 1e-9 * (c % 2 ? 1 : -1); // |s| below 1e-6
  return { k, q, vin: randomF32(nb * d, seed, 1, "vin"), bias: randomF32(d, seed, 0.5, "bias"), cn: randomF32(d, seed, 0.2, "cn") };
}

function gateReference(g: ReturnType<typeof gateCase>, nb: number, d: number, eps: number) {
  const v = new Float32Array(nb * d);
  const u = new Float32Array(nb * d);
  for (let t = 0; t < nb; t++) {
    let s = dot(g.k.subarray(t * d, (t + 1) * d), g.q.subarray(t * d, (t + 1) * d)) / Math.sqrt(d);
    s = Math.sign(s) * Math.sqrt(Math.max(Math.abs(s), 1e-6));
    const alpha = sigmoid(s);
    const vt = v.subarray(t * d, (t + 1) * d);
    for (let c = 0; c < d; c++) vt[c] = alpha * (g.vin[t * d + c]! + g.bias[c]!);
    rmsNorm(vt, g.cn, eps, {}, u.subarray(t * d, (t + 1) * d));
  }
  return { v, u };
}

describe("ple_gate_f32", () => {
  // float4 loads where d % 4 == 0 and the rows are aligned (256, 64, 2,048: several turns of a
  // lane's loads), one float at a time otherwise (254).
  const cases = [...NB_CASES.map((nb) => [nb, nb === MAX_NB ? 64 : 256]), [1, 2048], [3, 254]] as [number, number][];
  test.each(cases)("nb %i, d %i against pleLayer's gate", (nb, d) => {
    const eps = 1e-6;
    const g = gateCase(nb, d, 40 + nb);
    const ref = gateReference(g, nb, d, eps);
    const { refs } = uploadWeights(dev, { bias: hostTensor(g.bias, "f32", [d]), cn: hostTensor(g.cn, "f32", [d]) });
    const kb = uploadF32(dev, g.k), qb = uploadF32(dev, g.q), vb = uploadF32(dev, g.vin);
    const v = outputF32(dev, nb * d), u = outputF32(dev, nb * d);
    run(dev, (ctx) =>
      encodePleGate(ctx, { rows: nb, dim: d, eps, k: rows(kb, d), q: rows(qb, d), vIn: rows(vb, d), vBias: refs.bias, convNorm: refs.cn, v: rows(v, d), u: rows(u, d) }),
    );
    // f32 dot and sum of squares over d vs f64 (the signed sqrt amplifies the dot's rounding near s = 0).
    expectClose(v.f32.subarray(0, nb * d), ref.v, { abs: 1e-6, rel: 1e-5 }, `ple-gate-v nb=${nb}`, d);
    expectClose(u.f32.subarray(0, nb * d), ref.u, { abs: 1e-6, rel: 1e-5 }, `ple-gate-u nb=${nb}`, d);
  });
});

// ---- conv -------------------------------------------------------------------------------------------

interface ConvCase {
  nb: number;
  d: number;
  K: number;
  D: number;
  n: number;
  u: Float32Array;
  v: Float32Array;
  w: Float32Array;
  history: Float32Array;
  X: Float32Array;
}

function convCase(nb: number, d: number, K: number, D: number, n: number, seed: number): ConvCase {
  return {
    nb, d, K, D, n,
    u: randomF32(nb * d, seed, 1.5, "u"),
    v: randomF32(nb * d, seed, 1, "v"),
    w: randomF32(d * K, seed, 0.6, "w"),
    history: randomF32(pleHistoryFloats(d, K, D), seed, 1.5, "history"),
    X: randomF32(nb * n * d, seed, 2, "X"),
  };
}

function convReference(c: ConvCase) {
  const hist = c.history.slice();
  const X = c.X.slice();
  const conv = new Float32Array(c.d);
  for (let t = 0; t < c.nb; t++) {
    causalConvStep(hist, c.u.subarray(t * c.d, (t + 1) * c.d), c.w, c.d, c.K, conv, c.D);
    for (let ch = 0; ch < c.d; ch++) {
      const y = c.v[t * c.d + ch]! + silu(conv[ch]!);
      for (let i = 0; i < c.n; i++) X[(t * c.n + i) * c.d + ch] = X[(t * c.n + i) * c.d + ch]! + y;
    }
  }
  return { X, history: hist };
}

function convOnDevice(c: ConvCase) {
  const { refs } = uploadWeights(dev, { w: hostTensor(c.w, "f32", [c.d, c.K]) });
  const u = uploadF32(dev, c.u), v = uploadF32(dev, c.v), X = uploadF32(dev, c.X), history = uploadF32(dev, c.history);
  const planes = allocatePlanes(dev, c.history.length);
  const encode = (ctx: EncodeContext, first: number, nb: number, snapRows = 0) =>
    encodePleConv(ctx, {
      rows: nb,
      dim: c.d,
      dilation: c.D,
      weight: refs.w,
      u: rows(u, c.d, first * c.d * 4),
      v: rows(v, c.d, first * c.d * 4),
      history,
      x: rows(X, c.n * c.d, first * c.n * c.d * 4),
      streams: c.n,
      streamStride: c.d * 4,
      snapshots: snapRows > 0 ? { planes, rows: snapRows } : undefined,
    });
  return { X: X as Buffer, history: history as Buffer, planes, encode };
}

describe("ple_conv_f32", () => {
  test.each(NB_CASES)("nb %i against causalConvStep (dilation 3) + SiLU into 4 streams", (nb) => {
    const c = convCase(nb, nb === MAX_NB ? 32 : 64, 4, 3, 4, 60 + nb);
    const ref = convReference(c);
    const g = convOnDevice(c);
    run(dev, (ctx) => g.encode(ctx, 0, nb));
    // f32 sum of K products, SiLU, then one f32 add per stream vs f64: a few ulps of |X| <~ 4.
    expectClose(g.X.f32.subarray(0, c.X.length), ref.X, { abs: 2e-6, rel: 1e-6 }, `ple-conv nb=${nb}`, c.d);
    expectExact(g.history.f32.subarray(0, c.history.length), ref.history, `ple history nb=${nb}`, c.d);
  });

  test("one stream, dilation 1 and 2", () => {
    for (const D of [1, 2]) {
      const c = convCase(5, 32, 3, D, 1, 70 + D);
      const ref = convReference(c);
      const g = convOnDevice(c);
      run(dev, (ctx) => g.encode(ctx, 0, 5));
      expectClose(g.X.f32.subarray(0, c.X.length), ref.X, { abs: 2e-6, rel: 1e-6 }, `ple-conv D=${D}`, c.d);
      expectExact(g.history.f32.subarray(0, c.history.length), ref.history, `ple history D=${D}`, c.d);
    }
  });
});

describe("ple sequence state", () => {
  test("snapshot plane r equals the history after rows 0..r alone; rollback restores it bit for bit", () => {
    const nb = SNAPSHOT_PLANES;
    const c = convCase(nb, 32, 4, 3, 2, 81);
    const full = convOnDevice(c);
    run(dev, (ctx) => full.encode(ctx, 0, nb, nb));
    const last = full.history.f32.slice(0, c.history.length);
    for (let r = 0; r < nb; r++) {
      const part = convOnDevice(c);
      run(dev, (ctx) => part.encode(ctx, 0, r + 1));
      expectExact(readPlane(full.planes, r), part.history.f32.subarray(0, c.history.length), `history plane ${r}`);
    }
    for (const r of [0, 4]) {
      run(dev, (ctx) => encodeRestore(ctx, { planes: full.planes, plane: r, live: full.history }));
      expectExact(full.history.f32.subarray(0, c.history.length), readPlane(full.planes, r), `rollback history to row ${r}`);
      expect(Array.from(full.history.f32.subarray(0, c.history.length))).not.toEqual(Array.from(last));
    }
  });

  test("decode after prefill equals token by token, bit for bit", () => {
    const n = 10;
    const c = convCase(n, 32, 4, 3, 4, 82);
    const batch = convOnDevice(c);
    run(dev, (ctx) => batch.encode(ctx, 0, 7));
    for (let t = 7; t < n; t++) run(dev, (ctx) => batch.encode(ctx, t, 1));
    const single = convOnDevice(c);
    run(dev, (ctx) => {
      for (let t = 0; t < n; t++) single.encode(ctx, t, 1);
    });
    expectExact(batch.X.f32.subarray(0, c.X.length), single.X.f32.subarray(0, c.X.length), "X");
    expectExact(batch.history.f32.subarray(0, c.history.length), single.history.f32.subarray(0, c.history.length), "history");
  });
});
