// MoE kernels (kernels/moe.metal through lib/gpu/experts.ts) against lib/reference/moe.ts:
// router softmax + top-k (ties included), grouping of pairs by expert, and the whole MoE of
// a row batch (router, routed experts read through a slot table from a pool of records in
// the on-disk layout, shared expert, combine) for every record dtype, plus a missing slot.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeExpertLists, encodeMoeCombine, encodeRouter, encodeRouterTopK, encodeRoutedExperts, encodeSharedExpert, fusesDownCombine,
  PAIR_ROWS, prefetchesDown, prefetchesTile, type ExpertPool } from "../../lib/gpu/experts.ts";
import type { DType } from "../../lib/model/config.ts";
import { PART_ALIGN } from "../../lib/model/manifest.ts";
import { moeRow, routerTopK, type MoeWeights } from "../../lib/reference/moe.ts";
import { encodeResidualAdd } from "../../lib/gpu/elementwise.ts";
import { encodeHcWrite, hcFold, hcFoldCount, hcMixCount, type HcFold } from "../../lib/gpu/hyperconnection.ts";
import type { ModelConfig } from "../../lib/model/config.ts";
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
  readF32,
  readI32,
  rng,
  rows,
  run,
  uploadF32,
  uploadI32,
  uploadWeights,
  type HostTensor,
} from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

// Softmax in f32 (exp and one division per weight) against f64: a few ulps.
const WEIGHT_TOL = { rel: 2e-6, abs: 1e-7 };

describe("router_topk_f32", () => {
  const cases = NB_CASES.flatMap((nb) => [
    [nb, 8, 2, true],
    [nb, nb === 1024 ? 32 : 130, nb === 1024 ? 4 : 10, false],
  ] as const);
  test.each(cases)("nb = %i, E = %i, k = %i, norm_topk_prob %p", (nb, E, k, norm) => {
    const r = rng(nb * E, "logits");
    // Logits on a grid of 1/8 so equal values (ties) are common: ranks must take the lower id.
    const logits = Float32Array.from({ length: nb * E }, () => Math.round(r.symmetric() * 24) / 8);
    const lb = uploadF32(dev, logits);
    const ids = outputI32(dev, nb * k);
    const weights = outputF32(dev, nb * k);
    run(dev, (ctx) => encodeRouterTopK(ctx, rows(lb, E), { ids, weights }, nb, { experts: E, top_k: k, norm_topk_prob: norm }));
    const wantIds: number[] = [];
    const wantW: number[] = [];
    for (let row = 0; row < nb; row++) {
      const routing = routerTopK(logits.subarray(row * E, (row + 1) * E), k, norm);
      wantIds.push(...routing.experts);
      wantW.push(...routing.weights);
    }
    expectExact(readI32(ids, nb * k), wantIds, `router_topk_f32 ids nb=${nb}`, k);
    expectClose(readF32(weights, nb * k), wantW, WEIGHT_TOL, `router_topk_f32 nb=${nb}`, k);
  });
});

describe("moe_lists_i32", () => {
  test.each(NB_CASES)("nb = %i", (nb) => {
    const [E, k] = [nb === 1024 ? 128 : 16, 4];
    const ids = randomTokens(nb * k, E, nb);
    const offsets = outputI32(dev, E + 1);
    const pairs = outputI32(dev, nb * k);
    const active = outputI32(dev, E + 1);
    run(dev, (ctx) => encodeExpertLists(ctx, uploadI32(dev, ids), { offsets, pairs, active }, nb, k, E));
    const got = readI32(pairs, nb * k);
    const off = readI32(offsets, E + 1);
    for (let e = 0; e < E; e++) {
      const want = [...ids.keys()].filter((q) => ids[q] === e);
      const seg = Array.from(got.subarray(off[e]!, off[e + 1]!)).sort((a, b) => a - b); // order within an expert is free
      expectExact(seg, want, `moe_lists_i32 expert ${e}`);
      expect(seg.length).toBe(want.length);
    }
    expect(off[E]).toBe(nb * k);
    const used = [...new Set(ids)].sort((a, b) => a - b);
    expectExact(readI32(active, used.length + 1), [used.length, ...used], "moe_lists_i32 active experts");
  });
});

interface MoeDims {
  d: number;
  E: number;
  k: number;
  I: number;
  SI: number;
}

/** A pool of expert records (gate | up | down at 256-aligned offsets) in `slots` slots; expert e in slotOf[e]. */
function buildPool(dims: MoeDims, dtype: DType, seed: number, slotOf: number[], slots: number) {
  const shapes = { gate: [dims.I, dims.d], up: [dims.I, dims.d], down: [dims.d, dims.I] } as const;
  const align = (x: number) => Math.ceil(x / PART_ALIGN) * PART_ALIGN;
  const experts: Record<keyof typeof shapes, HostTensor>[] = [];
  for (let e = 0; e < dims.E; e++) {
    const t = {} as Record<keyof typeof shapes, HostTensor>;
    for (const [name, shape] of Object.entries(shapes) as [keyof typeof shapes, readonly number[]][])
      t[name] = hostTensor(randomF32(shape[0]! * shape[1]!, seed + e, 0.3, `expert-${name}`), dtype, shape);
    experts.push(t);
  }
  let cursor = 0;
  const parts = (Object.keys(shapes) as (keyof typeof shapes)[]).map((name) => {
    const offset = align(cursor);
    cursor = offset + experts[0]![name].bytes.byteLength;
    return { name, dtype, shape: shapes[name], offset };
  });
  const stride = align(cursor);
  const buffer: Buffer = dev.buffer(stride * slots);
  buffer.bytes.fill(0xff); // unused slots hold garbage: only mapped slots may be read
  slotOf.forEach((s, e) => {
    if (s < 0) return;
    for (const p of parts) buffer.bytes.set(experts[e]![p.name].bytes, s * stride + p.offset);
  });
  const pool: ExpertPool = { buffers: [buffer], slotsPerBuffer: slots, slots, stride, parts };
  return { pool, experts };
}

/** Streams a fused decode step writes its output into: n streams of X, coefficient rows (null: X += y). */
interface StreamsInto {
  X: Buffer;
  coeffs: Buffer | null;
  n: number;
  /** The next site's raw products the write also leaves (hc-fold.test.ts pins the fold). */
  fold?: HcFold;
}

/** Runs a whole MoE on nb rows of x and returns y with the reference's y per row. */
function runMoe(nb: number, dims: MoeDims, dtype: DType, opts: { missing?: number; fused?: boolean; shared?: boolean; into?: StreamsInto; x?: Float32Array } = {}) {
  const { d, E, k, I, SI } = dims;
  const slots = E + 3;
  const perm = [...Array(E).keys()].map((e) => (e * 7 + 3) % slots); // slots are not expert ids
  if (new Set(perm).size !== E) throw new Error("test setup: slot map is not one-to-one");
  const slotOf = perm.map((s, e) => (e === opts.missing ? -1 : s));
  const { pool, experts } = buildPool(dims, dtype, 100, slotOf, slots);
  const dense = {
    router: hostTensor(randomF32(E * d, 7, 0.5, "router"), "bf16", [E, d]),
    gate: hostTensor(randomF32(SI * d, 8, 0.3, "sg"), dtype, [SI, d]),
    up: hostTensor(randomF32(SI * d, 9, 0.3, "su"), dtype, [SI, d]),
    down: hostTensor(randomF32(d * SI, 10, 0.3, "sd"), dtype, [d, SI]),
    expertGate: hostTensor(randomF32(d, 11, 0.5, "seg"), "bf16", [1, d]),
  };
  const { refs } = uploadWeights(dev, dense);
  const x = opts.x ?? randomF32(nb * d, nb + 1, 1.5, "moe-x");
  const xb = uploadF32(dev, x);
  const input = rows(xb, d);
  const logits = outputF32(dev, nb * E);
  const ids = outputI32(dev, nb * k);
  const weights = outputF32(dev, nb * k);
  const lists = { offsets: outputI32(dev, E + 1), pairs: outputI32(dev, nb * k), active: outputI32(dev, E + 1) };
  const routed = {
    h: rows(outputF32(dev, nb * k * I), I),
    o: rows(outputF32(dev, nb * k * d), d),
  };
  const shared = {
    h: rows(outputF32(dev, nb * SI), SI),
    s: rows(outputF32(dev, nb * d), d),
    sg: rows(outputF32(dev, nb), 1),
  };
  const y = outputF32(dev, nb * d);
  const cfg = { experts: E, top_k: k, norm_topk_prob: true };
  run(dev, (ctx) => {
    encodeRouter(ctx, refs.router, input, rows(logits, E), { ids, weights }, nb, cfg);
    encodeExpertLists(ctx, ids, lists, nb, k, E);
    // (the engine waits here for the host to publish slotOf)
    const withShared = opts.shared === false ? undefined : shared;
    if (withShared) encodeSharedExpert(ctx, refs, input, shared, nb);
    const into = opts.into && {
      X: rows(opts.into.X, opts.into.n * d),
      coeffs: opts.into.coeffs && rows(opts.into.coeffs, hcMixCount(opts.into.n)),
      streams: opts.into.n,
      d,
      fold: opts.into.fold,
    };
    const combine = opts.fused ? { ids, weights, y: rows(y, d), shared: withShared, into } : undefined;
    encodeRoutedExperts(ctx, pool, uploadI32(dev, slotOf), lists, input, routed, nb, k, E, combine);
    if (!opts.fused) encodeMoeCombine(ctx, weights, routed.o, rows(y, d), nb, k, d, withShared);
  });
  const mw: MoeWeights = {
    router: dense.router.values,
    shared: { gate: dense.gate.values, up: dense.up.values, down: dense.down.values, expertGate: dense.expertGate.values },
  };
  const config = { hidden_size: d, moe: { experts: E, top_k: k, intermediate: I, norm_topk_prob: true, shared_intermediate: SI } } as ModelConfig;
  const expert = (e: number) => ({ gate: experts[e]!.gate.values, up: experts[e]!.up.values, down: experts[e]!.down.values });
  const ref = Array.from({ length: nb }, (_, r) => moeRow(mw, config, expert, x.subarray(r * d, (r + 1) * d)));
  return { y: readF32(y, nb * d), ids: readI32(ids, nb * k), ref };
}

// y sums k + 1 expert outputs, each two chained f32 dot products (d then I terms) of values
// of size ~1: errors of ~1e-6 relative to the largest output.
const MOE_TOL = { abs: 1e-5, relMax: 2e-5 };

describe("whole MoE: router, lists, routed experts through slots, shared expert, combine", () => {
  const DTYPES: DType[] = ["f32", "bf16", "f16", "q4"];
  test.each(DTYPES.flatMap((dt) => NB_CASES.map((nb) => [dt, nb] as const)))("%s records, nb = %i", (dtype, nb) => {
    const dims: MoeDims = nb === 1024 ? { d: 32, E: 8, k: 2, I: 32, SI: 32 } : { d: 64, E: 16, k: 4, I: 96, SI: 64 };
    const { y, ids, ref } = runMoe(nb, dims, dtype);
    expectExact(ids, ref.flatMap((r) => r.routing.experts), `router ids (${dtype}, nb=${nb})`, dims.k);
    const want = new Float32Array(nb * dims.d);
    ref.forEach((r, i) => want.set(r.y, i * dims.d));
    expectClose(y, want, MOE_TOL, `moe_${dtype} nb=${nb}`, dims.d);
  });

  // A decode step through moe_gate_up_pairs and moe_down_combine at a narrow and a wide row
  // (wider than the 2,048 columns the staged matvec forms take).
  test.each([64, 4128])("q4 decode, d = %i: the reference", (d) => {
    const dims: MoeDims = { d, E: 8, k: 2, I: 64, SI: 32 };
    const { y, ids, ref } = runMoe(1, dims, "q4", { fused: true });
    expectExact(ids, ref.flatMap((r) => r.routing.experts), `router ids (d=${d})`, dims.k);
    expectClose(y, ref[0]!.y, { abs: 4e-7 * d + 1e-5, relMax: 2e-5 }, `moe q4 decode d=${d}`, d);
  });

  // A decode step (nb = 1) over q4 records ends in moe_down_combine: the same bits as the
  // separate down projections and combine, with and without a shared expert.
  test.each([true, false])("moe_down_combine (decode), shared expert %p: the same bits as moe_down + moe_combine", (withShared) => {
    const dims: MoeDims = { d: 64, E: 16, k: 4, I: 96, SI: 64 };
    const split = runMoe(1, dims, "q4", { shared: withShared });
    const fused = runMoe(1, dims, "q4", { fused: true, shared: withShared });
    expect(fusesDownCombine(buildPool(dims, "q4", 100, [0], 1).pool, 1)).toBe(true);
    expect([...fused.ids]).toEqual([...split.ids]);
    expect([...new Uint32Array(fused.y.buffer, fused.y.byteOffset, fused.y.length)]).toEqual([...new Uint32Array(split.y.buffer, split.y.byteOffset, split.y.length)]);
    if (withShared) expectClose(fused.y, fused.ref[0]!.y, MOE_TOL, "moe_down_combine vs reference");
    const missing = fused.ids[1]!;
    const m = runMoe(1, dims, "q4", { fused: true, missing, shared: withShared });
    expect(m.y.every(Number.isNaN)).toBe(true); // a missing expert makes its row NaN, as the combine does
  });

  // The L2 prefetches of moe_gate_up_pairs (CHERENKOV_MOE_PREFETCH_DOWN: the down rows;
  // CHERENKOV_MOE_PREFETCH_TILE: its own gate and up rows) read and write nothing a kernel
  // sees: on and off give the same bits (on CUDA they run, with a threadgroup count that does
  // not divide d: 4128 rows over 4 threadgroups of the gate/up grid).
  // The third field: the switch's value when unset (the tile prefetch is on by default).
  const switches = [
    ["CHERENKOV_MOE_PREFETCH_DOWN", prefetchesDown, false],
    ["CHERENKOV_MOE_PREFETCH_TILE", prefetchesTile, true],
  ] as const;
  test.each(switches.flatMap(([name, read, unset]) => [64, 4128].map((d) => [name, d, read, unset] as const)))(
    "the prefetch switch %s of moe_gate_up_pairs (d = %i): on and off give the same bits; the option parses or names itself",
    (name, d, read, unset) => {
      const dims: MoeDims = { d, E: 8, k: 2, I: 64, SI: 32 };
      const bits = (a: Float32Array) => [...new Uint32Array(a.buffer, a.byteOffset, a.length)];
      const was = process.env[name];
      try {
        const runs = ["1", "0"].map((v) => {
          process.env[name] = v;
          expect(read()).toBe(v === "1");
          return runMoe(1, dims, "q4", { fused: true });
        });
        expect(bits(runs[0]!.y)).toEqual(bits(runs[1]!.y));
        delete process.env[name];
        expect(read()).toBe(unset);
        process.env[name] = "";
        expect(read()).toBe(unset);
        process.env[name] = "yes";
        expect(() => read()).toThrow(new RegExp(`${name}=yes: expected 0`));
      } finally {
        if (was === undefined) delete process.env[name];
        else process.env[name] = was;
      }
    },
  );

  // A verify batch (2..PAIR_ROWS rows) runs per routed pair too: each row gets the bits it gets
  // alone (a decode step), so accepting a draft cannot change a greedy token.
  test.each([2, 3, PAIR_ROWS])("the pair path over %i rows: each row's bits as a decode step's, and the reference", (nb) => {
    const dims: MoeDims = { d: 64, E: 16, k: 4, I: 96, SI: 64 };
    const x = randomF32(nb * dims.d, 60 + nb, 1.5, "verify-x");
    const batch = runMoe(nb, dims, "q4", { fused: true, x });
    const bits = (a: Float32Array) => [...new Uint32Array(a.buffer, a.byteOffset, a.length)];
    for (let r = 0; r < nb; r++) {
      const alone = runMoe(1, dims, "q4", { fused: true, x: x.slice(r * dims.d, (r + 1) * dims.d) });
      expect(bits(batch.y.subarray(r * dims.d, (r + 1) * dims.d))).toEqual(bits(alone.y));
      expect([...batch.ids.subarray(r * dims.k, (r + 1) * dims.k)]).toEqual([...alone.ids]);
      expectClose(batch.y.subarray(r * dims.d, (r + 1) * dims.d), batch.ref[r]!.y, MOE_TOL, `pair path row ${r} vs reference`);
    }
  });

  // The site's write done by moe_down_combine_hc (the decode MoE site): the same bits as
  // moe_down_combine into y, then hc_write_f32 (n > 1) or the residual add (n = 1).
  test.each([4, 2, 1].flatMap((n) => [true, false].map((sh) => [n, sh] as const)))("moe_down_combine_hc, n = %i, shared expert %p: the same bits as moe_down_combine + the site's write", (n, withShared) => {
    const dims: MoeDims = { d: 64, E: 16, k: 4, I: 96, SI: 64 };
    const d = dims.d;
    const X0 = randomF32(n * d, 90 + n, 2, "streams");
    const coeffs = n === 1 ? null : uploadF32(dev, randomF32(hcMixCount(n), 91 + n, 1.5, "coeffs"));
    const fusedX = uploadF32(dev, X0);
    runMoe(1, dims, "q4", { fused: true, shared: withShared, into: { X: fusedX, coeffs, n } });
    const plain = runMoe(1, dims, "q4", { fused: true, shared: withShared });
    const splitX = uploadF32(dev, X0);
    run(dev, (ctx) => {
      const y = rows(uploadF32(dev, plain.y), d);
      if (coeffs) encodeHcWrite(ctx, rows(splitX, n * d), rows(coeffs, hcMixCount(n)), y, 1, n, d);
      else encodeResidualAdd(ctx, rows(splitX, d), y, 1, d);
    });
    const bits = (b: Buffer) => [...new Uint32Array(b.bytes.buffer, b.bytes.byteOffset, n * d)];
    expect(bits(fusedX)).toEqual(bits(splitX));
    expect(bits(fusedX)).not.toEqual([...new Uint32Array(X0.buffer)]);
    // A missing expert makes every stream of the row NaN, as the write of a NaN y does.
    const missingX = uploadF32(dev, X0);
    runMoe(1, dims, "q4", { fused: true, shared: withShared, missing: plain.ids[1]!, into: { X: missingX, coeffs, n } });
    expect(readF32(missingX, n * d).every(Number.isNaN)).toBe(true);
  });

  // With a fold (kernels/hc.h hc_store_lanes on simdgroup 0's lanes): the same stream bits,
  // and the partials bits of hc_write_fold_f32 writing the same y (hc-fold.test.ts pins those).
  test.each([[4, true], [4, false], [2, true]] as const)("moe_down_combine_hc with a fold, n = %i, shared expert %p", (n, withShared) => {
    const dims: MoeDims = { d: 64, E: 16, k: 4, I: 96, SI: 64 };
    const d = dims.d;
    const M = hcMixCount(n);
    const cfg = { streams: n, eps: 1e-6, sinkhorn_iters: 20 };
    const X0 = randomF32(n * d, 95 + n, 2, "streams");
    const coeffs = uploadF32(dev, randomF32(M, 96 + n, 1.5, "coeffs"));
    const { refs: next } = uploadWeights(dev, {
      fn: hostTensor(randomF32(M * n * d, 97, 0.2, "fn"), "bf16", [M, n * d]),
      base: hostTensor(randomF32(M, 97, 1, "base"), "f32", [M]),
      scale: hostTensor(new Float32Array([0.7, 1.3, 2.1]), "f32", [3]),
    });
    const part = (b: Buffer) => rows(b, hcFoldCount(n, d));
    const fusedX = uploadF32(dev, X0);
    const fusedP = outputF32(dev, hcFoldCount(n, d));
    runMoe(1, dims, "q4", { fused: true, shared: withShared, into: { X: fusedX, coeffs, n, fold: hcFold(next, part(fusedP), cfg, d) } });
    const plain = runMoe(1, dims, "q4", { fused: true, shared: withShared });
    const writeX = uploadF32(dev, X0);
    const writeP = outputF32(dev, hcFoldCount(n, d));
    run(dev, (ctx) => encodeHcWrite(ctx, rows(writeX, n * d), rows(coeffs, M), rows(uploadF32(dev, plain.y), d), 1, n, d, hcFold(next, part(writeP), cfg, d)));
    const bits = (b: Buffer, count: number) => [...new Uint32Array(b.bytes.buffer, b.bytes.byteOffset, count)];
    expect(bits(fusedX, n * d)).toEqual(bits(writeX, n * d));
    expect(bits(fusedP, hcFoldCount(n, d))).toEqual(bits(writeP, hcFoldCount(n, d)));
    expect(bits(fusedP, hcFoldCount(n, d)).some((v) => v !== 0)).toBe(true);
  });

  test("fusesDownCombine: up to PAIR_ROWS rows (a decode row, a verify batch), q4 records, one pool buffer", () => {
    const dims: MoeDims = { d: 64, E: 4, k: 2, I: 32, SI: 32 };
    const { pool } = buildPool(dims, "q4", 100, [0, 1, 2, 3], 4);
    expect(fusesDownCombine(pool, 1)).toBe(true);
    expect(fusesDownCombine(pool, PAIR_ROWS)).toBe(true);
    expect(fusesDownCombine(pool, PAIR_ROWS + 1)).toBe(false);
    expect(fusesDownCombine({ ...pool, buffers: [pool.buffers[0]!, pool.buffers[0]!] }, 1)).toBe(false);
    expect(fusesDownCombine(buildPool(dims, "bf16", 100, [0, 1, 2, 3], 4).pool, 1)).toBe(false);
  });

  test("a missing slot (-1) writes NaN for exactly the rows routed to it, reading nothing", () => {
    const dims: MoeDims = { d: 64, E: 8, k: 2, I: 32, SI: 32 };
    const missing = runMoe(5, dims, "q4").ids[0]!; // an expert row 0 uses
    const { y, ids, ref } = runMoe(5, dims, "q4", { missing });
    for (let r = 0; r < 5; r++) {
      const row = y.subarray(r * dims.d, (r + 1) * dims.d);
      const usesMissing = [...ids.subarray(r * dims.k, (r + 1) * dims.k)].includes(missing);
      if (usesMissing) expect(row.every(Number.isNaN)).toBe(true);
      else expectClose(row, ref[r]!.y, MOE_TOL, "moe missing-slot other rows");
    }
    expect(ids[0]).toBe(missing); // the case is exercised
  });
});

describe("moe_combine_f32 (no shared expert)", () => {
  test.each(NB_CASES)("nb = %i", (nb) => {
    const [k, d] = [3, nb === 1024 ? 32 : 72];
    const w = randomF32(nb * k, nb, 1, "combine-w");
    const o = randomF32(nb * k * d, nb, 2, "combine-o");
    const y = outputF32(dev, nb * d);
    run(dev, (ctx) => encodeMoeCombine(ctx, uploadF32(dev, w), rows(uploadF32(dev, o), d), rows(y, d), nb, k, d));
    const want = new Float32Array(nb * d);
    for (let r = 0; r < nb; r++)
      for (let c = 0; c < d; c++) {
        let s = 0;
        for (let j = 0; j < k; j++) s += w[r * k + j]! * o[(r * k + j) * d + c]!;
        want[r * d + c] = s;
      }
    expectClose(readF32(y, nb * d), want, { abs: 2e-6 }, `moe_combine_f32 nb=${nb}`, d); // k f32 products of values <= 2
  });
});

test("CHERENKOV_MOE_DC_SG outside 1..8 is refused by name when the experts module loads", () => {
  for (const bad of ["0", "9", "4.5", "x"]) {
    const p = Bun.spawnSync([process.execPath, "-e", 'await import("./lib/gpu/experts.ts")'], {
      cwd: `${import.meta.dir}/../..`,
      env: { ...process.env, CHERENKOV_MOE_DC_SG: bad },
      stderr: "pipe",
    });
    expect(p.exitCode).not.toBe(0);
    expect(p.stderr.toString()).toContain(`CHERENKOV_MOE_DC_SG=${bad}: expected an integer from 1 to 8`);
  }
});

test.each(["8", "2"])("moe_down_combine with CHERENKOV_MOE_DC_SG=%s simdgroups: the same bits as moe_down + moe_combine", (count) => {
  // The module reads the count once, so the bit-for-bit tests above run again in a process of their own.
  const p = Bun.spawnSync([process.execPath, "test", "spec/kernels/moe.test.ts", "-t", "moe_down_combine \\(decode\\)"], {
    cwd: `${import.meta.dir}/../..`,
    env: { ...process.env, CHERENKOV_MOE_DC_SG: count },
    stdout: "pipe",
    stderr: "pipe",
  });
  const out = p.stdout.toString() + p.stderr.toString();
  expect(out).toMatch(/\b2 pass\b/);
  expect(p.exitCode).toBe(0);
}, 60_000);
