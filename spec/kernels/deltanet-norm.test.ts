// deltanet_rows_norm_f32 (lib/gpu/deltanet.ts encodeDeltaNetNormed: the row scan and its gated
// RMSNorm in one dispatch, one threadgroup per value head) against the two kernels it replaces
// (deltanet_rows_f32, then rms_norm_gated_f32 in place) bit for bit: y, the final S and the
// snapshot planes, over value dims 8 to 128, Hv/Hk 1, 2 and 4, rows 1..4, with and without
// snapshot rows, for every number of columns a simdgroup walks at once (COLS 1, 2, 4:
// CHERENKOV_DELTANET_NORM_COLS, kernels deltanet_rows_norm_f32, _c2_f32, _c4_f32); again under a
// 256-thread pipeline limit (CHERENKOV_CPU_MAX_THREADS, the limit spec/native/apple-limits.test.ts
// holds the engine to), where a simdgroup walks more columns. Then the COLS option and its
// default, and encodeDeltaNetBlock's choice of form (CHERENKOV_DELTANET_NORM_FUSED) and its refusals.
import { afterAll, describe, expect, test } from "bun:test";
import { join } from "node:path";

import {
  DELTANET_NORM_KERNEL,
  DELTANET_NORM_MAX_ROWS,
  deltanetNormCols,
  deltanetNormColsFor,
  deltanetNormFused,
  deltanetStateToGpu,
  encodeDeltaNet,
  encodeDeltaNetBlock,
  encodeDeltaNetNormed,
  type DeltaNetArgs,
  type DeltaNetNormCols,
  type DeltaNetShape,
} from "../../lib/gpu/deltanet.ts";
import type { EncodeContext } from "../../lib/gpu/dispatch.ts";
import { encodeRmsNormGated } from "../../lib/gpu/norms.ts";
import { allocatePlanes, readPlane } from "../../lib/gpu/snapshots.ts";
import type { Buffer } from "../../lib/shim.ts";
import { withEnvVar } from "../env-var.ts";
import { dnCase, width, type DnCase } from "./deltanet-util.ts";
import { expectExact, hostTensor, openDevice, outputF32, randomF32, recordingNames, rows, run, uploadF32, uploadWeights } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

const EPS = 1e-6;
const KERNEL = "deltanet_rows_norm_f32";
const COLS: DeltaNetNormCols[] = [1, 2, 4];


/** A recurrence case with the gated norm's inputs: gate rows z and the plain weight [dv]. */
interface NormCase extends DnCase {
  z: Float32Array;
  normW: Float32Array;
}

function normCase(nb: number, shape: DeltaNetShape, seed: number): NormCase {
  return { ...dnCase(nb, shape, seed), z: randomF32(nb * shape.valueHeads * shape.valueDim, seed, 4, "z"), normW: randomF32(shape.valueDim, seed, 0.5, "norm-w") };
}

interface NormGpu {
  o: Buffer;
  S: Buffer;
  planes: ReturnType<typeof allocatePlanes>;
  args: (snapRows: number) => DeltaNetArgs;
  norm: Parameters<typeof encodeDeltaNetNormed>[2];
}

/** The case's inputs and state on the device; o starts as garbage so that nothing unwritten passes. */
function onDevice(c: NormCase): NormGpu {
  const Hv = c.valueHeads;
  const ow = Hv * c.valueDim;
  const { refs } = uploadWeights(dev, {
    aLog: hostTensor(c.aLog, "f32", [Hv]),
    dtBias: hostTensor(c.dtBias, "f32", [Hv]),
    norm: hostTensor(c.normW, "f32", [c.valueDim]),
  });
  const qkv = uploadF32(dev, c.qkv);
  const b = uploadF32(dev, c.b);
  const a = uploadF32(dev, c.a);
  const z = uploadF32(dev, c.z);
  const o = uploadF32(dev, randomF32(c.nb * ow, 99, 7, "garbage"));
  const S = uploadF32(dev, deltanetStateToGpu(c.S, c));
  const planes = allocatePlanes(dev, c.S.length);
  const args = (snapRows: number): DeltaNetArgs => ({
    ...c,
    rows: c.nb,
    qkv: rows(qkv, width(c)),
    b: rows(b, Hv),
    a: rows(a, Hv),
    aLog: refs.aLog,
    dtBias: refs.dtBias,
    state: S,
    o: rows(o, ow),
    snapshots: snapRows > 0 ? { planes, rows: snapRows } : undefined,
    chunked: false,
  });
  return { o, S, planes, args, norm: { z: rows(z, ow), weight: refs.norm, eps: EPS } };
}

/** Runs `encode` and returns the pipelines it dispatched and their threadgroup sizes. */
function runSeen(encode: (ctx: EncodeContext) => void): { names: string[]; threads: number[] } {
  const names: string[] = [];
  const threads: number[] = [];
  run(dev, (ctx) => {
    const named = recordingNames(ctx, names);
    const cb = named.cb;
    const dispatch = (...a: Parameters<typeof cb.dispatch>) => {
      const tg = a[2];
      threads.push(typeof tg === "number" ? tg : [...tg].reduce((x: number, y) => x * (y ?? 1), 1));
      return cb.dispatch(...a);
    };
    encode({ ...named, cb: new Proxy(cb, { get: (t, k) => (k === "dispatch" ? dispatch : Reflect.get(t, k, t)) }) });
  });
  return { names, threads };
}

/** Fused (COLS columns at once) and unfused on two copies of the case; y, S and every snapshot plane bit for bit. */
function expectFusedEqualsPair(c: NormCase, cols: DeltaNetNormCols, snapRows: number, label: string): void {
  const fused = onDevice(c);
  const pair = onDevice(c);
  const seen = withEnvVar("CHERENKOV_DELTANET_NORM_COLS", String(cols), () => runSeen((ctx) => encodeDeltaNetNormed(ctx, fused.args(snapRows), fused.norm)));
  const kernel = DELTANET_NORM_KERNEL[cols];
  expect(seen.names).toEqual([kernel]);
  // As many threads as the pipeline allows, up to 512 (16 simdgroups) and one simdgroup a group of COLS columns.
  expect(seen.threads).toEqual([Math.min(512, dev.pipeline(kernel).maxThreads, 32 * Math.ceil(c.valueDim / cols))]);
  const plain = runSeen((ctx) => {
    encodeDeltaNet(ctx, pair.args(snapRows));
    encodeRmsNormGated(ctx, pair.args(0).o, pair.norm.z, pair.norm.weight, pair.args(0).o, c.nb, c.valueHeads, EPS);
  });
  expect(plain.names).toEqual(["deltanet_rows_f32", "rms_norm_gated_f32"]);
  const ow = c.valueHeads * c.valueDim;
  expectExact(fused.o.f32.subarray(0, c.nb * ow), pair.o.f32.subarray(0, c.nb * ow), `${label} y`, ow);
  expectExact(fused.S.f32.subarray(0, c.S.length), pair.S.f32.subarray(0, c.S.length), `${label} S`);
  for (let r = 0; r < snapRows; r++) expectExact(readPlane(fused.planes, r), readPlane(pair.planes, r), `${label} S plane ${r}`);
  // Not a comparison of untouched buffers: S moved, and y is a normalised vector (RMS of
  // y / (w SiLU(z)) is 1 per head: here just finite and not the garbage o started as).
  expect(Array.from(fused.S.f32.subarray(0, c.S.length))).not.toEqual(Array.from(deltanetStateToGpu(c.S, c)));
  expect(fused.o.f32.subarray(0, c.nb * ow).every(Number.isFinite)).toBe(true);
}

const SHAPES: [string, DeltaNetShape][] = [
  ["dv 16, Hv/Hk 2", { keyHeads: 2, keyDim: 16, valueHeads: 4, valueDim: 16 }],
  ["dv 8, Hv/Hk 4 (fewer columns than simdgroups)", { keyHeads: 1, keyDim: 64, valueHeads: 4, valueDim: 8 }],
  ["dv 24, dk 40, Hv/Hk 1 (lanes hold two rows of S; columns not a multiple of the simdgroups)", { keyHeads: 2, keyDim: 40, valueHeads: 2, valueDim: 24 }],
  ["dv 128, dk 128, Hv/Hk 2 (the 30b head shape)", { keyHeads: 1, keyDim: 128, valueHeads: 2, valueDim: 128 }],
];

describe("deltanet_rows_norm_f32 = deltanet_rows_f32 + rms_norm_gated_f32, bit for bit", () => {
  for (const [name, shape] of SHAPES) {
    for (const cols of COLS) {
      test.each([1, 2, 3, 4])(`${name}, COLS ${cols}: %i rows, with and without snapshot rows`, (nb) => {
        const c = normCase(nb, shape, 700 + 10 * nb + shape.valueDim);
        const label = `${name} COLS=${cols} nb=${nb}`;
        expectFusedEqualsPair(c, cols, 0, label);
        expectFusedEqualsPair(c, cols, nb, `${label} snapshots`);
        if (nb > 1) expectFusedEqualsPair(c, cols, nb - 1, `${label} snapshots of all but the last row`);
      });
    }
  }

  test("the pipeline limit this run has (CHERENKOV_CPU_MAX_THREADS, when set) is every variant's", () => {
    const limit = process.env.CHERENKOV_CPU_MAX_THREADS;
    for (const cols of COLS) expect(dev.pipeline(DELTANET_NORM_KERNEL[cols]).maxThreads).toBe(Math.min(512, limit ? Number(limit) : 512));
  });
});

test("under a 256-thread pipeline limit (8 simdgroups, 16 columns each at dv 128): the same comparisons pass", () => {
  const proc = Bun.spawnSync([process.execPath, "test", "--timeout", "300000", import.meta.path, "-t", "rms_norm_gated_f32, bit for bit"], {
    cwd: join(import.meta.dir, "..", ".."),
    // (the CPU backend's emulated limit, whichever backend this run tests)
    env: { ...process.env, CHERENKOV_BACKEND: "cpu", CHERENKOV_CPU_MAX_THREADS: "256" },
  });
  const output = proc.stdout.toString() + proc.stderr.toString();
  if (proc.exitCode !== 0) console.error(output.slice(-4000));
  expect(proc.exitCode).toBe(0);
  expect(output).toMatch(/^\s*0 fail$/m);
  expect(output).toMatch(new RegExp(`^\\s*${SHAPES.length * COLS.length * 4 + 1} pass$`, "m")); // every shape and COLS case, and the limit's check
}, 1_200_000);

describe("CHERENKOV_DELTANET_NORM_COLS", () => {
  test("1, 2 or 4 force it, unset or empty leave the choice to the shape, anything else refused by name", () => {
    const read = (v: string | undefined) => withEnvVar("CHERENKOV_DELTANET_NORM_COLS", v, deltanetNormCols);
    expect(read(undefined)).toBeUndefined();
    expect(read("")).toBeUndefined();
    expect(read("1")).toBe(1);
    expect(read("2")).toBe(2);
    expect(read("4")).toBe(4);
    for (const bad of ["3", "8", "0", "two"]) expect(() => read(bad)).toThrow(new RegExp(`CHERENKOV_DELTANET_NORM_COLS=${bad}: expected 1, 2 or 4`));
  });

  test("default: the largest of 4 and 2 dividing the columns each simdgroup walks, else 1", () => {
    expect(deltanetNormColsFor(128, 16)).toBe(4); // the 30b head: 8 columns a simdgroup
    expect(deltanetNormColsFor(64, 16)).toBe(4);
    expect(deltanetNormColsFor(32, 16)).toBe(2);
    expect(deltanetNormColsFor(16, 16)).toBe(1);
    expect(deltanetNormColsFor(24, 16)).toBe(1); // not whole
    expect(deltanetNormColsFor(8, 8)).toBe(1);
  });

  test("unset, the 30b head shape runs deltanet_rows_norm_c4_f32 (same bits), dv 16 deltanet_rows_norm_f32", () => {
    for (const [dv, kernel] of [[128, "deltanet_rows_norm_c4_f32"], [16, KERNEL]] as const) {
      const c = normCase(2, { keyHeads: 1, keyDim: 32, valueHeads: 2, valueDim: dv }, 90 + dv);
      const fused = onDevice(c);
      const pair = onDevice(c);
      const seen = withEnvVar("CHERENKOV_DELTANET_NORM_COLS", undefined, () => runSeen((ctx) => encodeDeltaNetNormed(ctx, fused.args(1), fused.norm)));
      expect(seen.names).toEqual([kernel]);
      run(dev, (ctx) => {
        encodeDeltaNet(ctx, pair.args(1));
        encodeRmsNormGated(ctx, pair.args(0).o, pair.norm.z, pair.norm.weight, pair.args(0).o, c.nb, c.valueHeads, EPS);
      });
      const ow = c.valueHeads * dv;
      expectExact(fused.o.f32.subarray(0, c.nb * ow), pair.o.f32.subarray(0, c.nb * ow), `default dv=${dv} y`, ow);
      expectExact(fused.S.f32.subarray(0, c.S.length), pair.S.f32.subarray(0, c.S.length), `default dv=${dv} S`);
      expectExact(readPlane(fused.planes, 0), readPlane(pair.planes, 0), `default dv=${dv} S plane 0`);
    }
  });
});

// ---- encodeDeltaNetBlock's choice -------------------------------------------------------

const TINY: DeltaNetShape = { keyHeads: 2, keyDim: 16, valueHeads: 4, valueDim: 16 };

/** encodeDeltaNetBlock's three-kernel form over the case's rows as conv output (convDone: the rows are x's). */
function blockOnDevice(c: NormCase) {
  const g = onDevice(c);
  const C = width(c);
  const { refs } = uploadWeights(dev, { conv: hostTensor(randomF32(C * 4, 3, 0.5, "conv"), "f32", [C, 4]) });
  const window = uploadF32(dev, randomF32(3 * C, 3, 1, "window"));
  const convOut = outputF32(dev, c.nb * C);
  const work = { buffer: dev.buffer(1 << 20), offset: 0, bytes: 1 << 20 };
  const encode = (ctx: EncodeContext, normFused: boolean | undefined, chunked?: boolean) => {
    const { qkv, b, a, aLog, dtBias, state, o } = g.args(0);
    const block = { ...TINY, rows: c.nb, x: qkv, convWeight: refs.conv, convState: window, convOut: rows(convOut, C), b, a, aLog, dtBias, state, o };
    encodeDeltaNetBlock(ctx, { ...block, z: g.norm.z, normWeight: g.norm.weight, eps: EPS, normFused, work, chunked }, false);
  };
  return { ...g, encode };
}

describe("encodeDeltaNetBlock: the recurrence and its norm in one dispatch", () => {
  const withEnv = <T>(value: string | undefined, body: () => T): T => withEnvVar("CHERENKOV_DELTANET_NORM_FUSED", value, body);

  test("CHERENKOV_DELTANET_NORM_FUSED: 1 on, 0 off, unset on for the GPU backends and off on the CPU backend, anything else refused by name", () => {
    for (const backend of ["cpu", "cuda", "metal"]) {
      const on = (v: string | undefined) => withEnv(v, () => deltanetNormFused(backend));
      expect(on(undefined)).toBe(backend !== "cpu");
      expect(on("")).toBe(backend !== "cpu");
      expect(on("0")).toBe(false);
      expect(on("1")).toBe(true);
      expect(() => on("yes")).toThrow(/CHERENKOV_DELTANET_NORM_FUSED=yes: expected 0/);
    }
  });

  test("up to 4 rows of the row scan take it (the option read at each call); 5 rows, and the chunked form, keep their kernels; same bits", () => {
    const three = ["conv_silu_rows_f32", "deltanet_rows_f32", "rms_norm_gated_f32"];
    for (const nb of [1, DELTANET_NORM_MAX_ROWS]) {
      const c = normCase(nb, TINY, 40 + nb);
      const fused = blockOnDevice(c);
      const plain = blockOnDevice(c);
      expect(withEnv("1", () => runSeen((ctx) => fused.encode(ctx, undefined)).names)).toEqual(["conv_silu_rows_f32", KERNEL]);
      expect(withEnv("0", () => runSeen((ctx) => plain.encode(ctx, undefined)).names)).toEqual(three);
      const ow = c.valueHeads * c.valueDim;
      expectExact(fused.o.f32.subarray(0, nb * ow), plain.o.f32.subarray(0, nb * ow), `block nb=${nb} y`, ow);
      expectExact(fused.S.f32.subarray(0, c.S.length), plain.S.f32.subarray(0, c.S.length), `block nb=${nb} S`);
      // The argument overrides the environment.
      expect(withEnv("0", () => runSeen((ctx) => fused.encode(ctx, true)).names)).toEqual(["conv_silu_rows_f32", KERNEL]);
      expect(withEnv("1", () => runSeen((ctx) => fused.encode(ctx, false)).names)).toEqual(three);
    }
    const five = blockOnDevice(normCase(DELTANET_NORM_MAX_ROWS + 1, TINY, 45));
    expect(runSeen((ctx) => five.encode(ctx, true)).names).toEqual(three);
    const chunked = blockOnDevice(normCase(2, TINY, 46));
    expect(runSeen((ctx) => chunked.encode(ctx, true, true)).names).toEqual(["conv_silu_rows_f32", "deltanet_chunk_prep_f32", "deltanet_chunk_scan_c4_f32", "rms_norm_gated_f32"]);
  });

  test("shapes past the kernel's limits are refused, naming the limit", () => {
    const wide = onDevice(normCase(1, { keyHeads: 1, keyDim: 16, valueHeads: 1, valueDim: 136 }, 5));
    expect(() => run(dev, (ctx) => encodeDeltaNetNormed(ctx, wide.args(0), wide.norm))).toThrow(/value dim 136 exceeds 128/);
    const deep = onDevice(normCase(1, { keyHeads: 1, keyDim: 160, valueHeads: 1, valueDim: 8 }, 6));
    expect(() => run(dev, (ctx) => encodeDeltaNetNormed(ctx, deep.args(0), deep.norm))).toThrow(/key dim 160 exceeds 128/);
    const many = onDevice(normCase(5, TINY, 7));
    expect(() => run(dev, (ctx) => encodeDeltaNetNormed(ctx, many.args(0), many.norm))).toThrow(/5 rows exceed 4/);
  });
});
