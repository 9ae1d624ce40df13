// The chunked form of the DeltaNet recurrence (kernels/deltanet.metal "The chunked form":
// deltanet_chunk_prep_f32 + deltanet_chunk_scan_f32, lib/gpu/deltanet.ts) against lib/reference's
// recurrence (deltanetStep, f64 sums over f32 state) and against the row scan (deltanet_rows_f32)
// on the same device: outputs and final state, over row counts that are not a multiple of the
// block (DELTANET_CHUNK = 32), fewer than a block, one row, several blocks, several heads (value
// heads sharing a key head), gates and betas at their extremes, and states carried across calls.
// Then the host's choice: snapshot rows keep the row scan; CHERENKOV_DELTANET_CHUNKED.
import { afterAll, describe, expect, test } from "bun:test";

import { DELTANET_CHUNK, deltanetChunkBytes, deltanetChunkedMinRows, DELTANET_CHUNKED_MIN_ROWS, deltanetStateFromGpu, deltanetTakesChunked, type DeltaNetArgs, type DeltaNetShape } from "../../lib/gpu/deltanet.ts";
import { readPlane } from "../../lib/gpu/snapshots.ts";
import { dnCase, dnOnDevice, dnReference, type DnCase } from "./deltanet-util.ts";
import { compareClose, expectClose, expectExact, openDevice, run } from "./harness.ts";
import { printWorstErrors } from "./sequence-util.ts";

const dev = openDevice();
afterAll(() => {
  printWorstErrors();
  dev.close();
});

// Tolerance against the reference. The row scan is held to abs 1e-6 + rel 1e-5 and measures
// 4.5e-8 abs (deltanet.test.ts). The chunked form reaches the same values through other f32 sums:
// dot products over dk and over the block's rows (up to 32 terms of |k^_i . k^_t| <= 1 times
// corrections of the size of v), the forward substitution T = (I + A)^-1 (up to 31 terms a row),
// and decays as exp(G_t - G_i) of f32 cumulative sums instead of products of exp(g). Each term
// brings an ulp of its size (2^-24, values here O(1)), ~100 terms a value: ~6e-6 at worst if they
// all lined up; measured worst over these cases 1.4e-6 on o and 6.3e-7 on S (CHERENKOV_KERNEL_ERRORS=1
// prints them). 4e-6 absolute plus 1e-5 relative (values are O(1)) holds that with room, and is
// sharp: one beta logit moved by 1e-2 on one row moves later outputs by 1.1e-5 (the last test).
const TOL = { abs: 4e-6, rel: 1e-5 };

interface Run {
  o: Float32Array;
  S: Float32Array;
}

/** Runs rows [0, nb) of the case through one form in calls of `split` rows (state carried). */
function runForm(c: DnCase, chunked: boolean, split = c.nb, cols?: 2 | 4): Run {
  const g = dnOnDevice(dev, c);
  run(dev, (ctx) => {
    for (let first = 0; first < c.nb; first += split) g.encode(ctx, first, Math.min(split, c.nb - first), 0, chunked, cols);
  });
  const nO = c.nb * c.valueHeads * c.valueDim;
  return { o: g.o.f32.slice(0, nO), S: deltanetStateFromGpu(g.S.f32.subarray(0, c.S.length), c) };
}

function compareAll(c: DnCase, label: string, split?: number, cols?: 2 | 4): void {
  const ref = dnReference(c);
  const chunk = runForm(c, true, split, cols);
  const rows = runForm(c, false, split);
  const w = c.valueHeads * c.valueDim;
  expectClose(chunk.o, ref.o, TOL, `chunk-o ${label}`, w);
  expectClose(chunk.S, ref.S, TOL, `chunk-S ${label}`, c.valueDim);
  // Against the row scan: both are within their tolerance of the reference.
  expectClose(chunk.o, rows.o, { abs: TOL.abs + 1e-6, rel: TOL.rel + 1e-5 }, `chunk-vs-rows-o ${label}`, w);
  expectClose(chunk.S, rows.S, { abs: TOL.abs + 1e-6, rel: TOL.rel + 1e-5 }, `chunk-vs-rows-S ${label}`, c.valueDim);
}

const TINY: DeltaNetShape = { keyHeads: 2, keyDim: 16, valueHeads: 4, valueDim: 16 };
/** The 30b shape's head dims (dk = dv = 128: four state rows a lane) with few heads and columns. */
const WIDE: DeltaNetShape = { keyHeads: 1, keyDim: 128, valueHeads: 2, valueDim: 6 };
/** Dims that fill no lane evenly: dk 40 (two rows a lane, the second partial), dv 5 (odd: a simdgroup's second column unused). */
const ODD: DeltaNetShape = { keyHeads: 2, keyDim: 40, valueHeads: 4, valueDim: 5 };

describe("deltanet chunked form", () => {
  test.each([1, 2, 5, 31, 32, 33, 64, 70, 100])("nb %i (tiny shape) against deltanetStep and the row scan", (nb) => {
    compareAll(dnCase(nb, TINY, 300 + nb), `tiny nb=${nb}`);
  });

  test.each([
    ["dk 128 (the 30b head dim)", WIDE, 45],
    ["dk 40, dv 5", ODD, 77],
  ] as const)("shape %s", (name, shape, nb) => {
    compareAll(dnCase(nb, shape, 400 + nb), name);
  });

  test("gates and betas at their extremes: beta 0 and 1, decay 1 (g = 0) and 0 (g -> -inf), mixed by row", () => {
    const nb = 75;
    const c = dnCase(nb, TINY, 501);
    const Hv = c.valueHeads;
    // b: +-30 (sigmoid 1 - 1e-13 and 1e-13) or random; a: -30 (softplus ~1e-13: decay 1), +60
    // (g ~ -60 e^A_log: decay ~0), or random. Every combination occurs in every head.
    for (let t = 0; t < nb; t++) {
      for (let h = 0; h < Hv; h++) {
        const k = (t * 7 + h * 3) % 9;
        if (k % 3 === 0) c.b[t * Hv + h] = 30;
        else if (k % 3 === 1) c.b[t * Hv + h] = -30;
        if (Math.floor(k / 3) === 0) c.a[t * Hv + h] = -30;
        else if (Math.floor(k / 3) === 1) c.a[t * Hv + h] = 60;
      }
    }
    compareAll(c, "extremes");
  });

  test("decay 1 and beta 1 on every row (no forgetting: the state is a long sum)", () => {
    const c = dnCase(96, TINY, 502);
    c.b.fill(30);
    c.a.fill(-30);
    compareAll(c, "no-decay");
  });

  test("state carried across calls: 100 rows as calls of 37 (blocks restart inside the batch)", () => {
    compareAll(dnCase(100, TINY, 503), "split", 37);
  });

  test.each([
    ["tiny, 70 rows", TINY, 70],
    ["dk 128", WIDE, 45],
    ["dk 40, dv 5 (a simdgroup's last three columns unused)", ODD, 33],
  ] as const)("the scan with 4 columns a simdgroup (deltanet_chunk_scan_c4_f32): %s", (name, shape, nb) => {
    compareAll(dnCase(nb, shape, 700 + nb), `c4 ${name}`, undefined, 4);
  });

  test("TOL is sharp: one beta logit moved by 1e-2 on one row already fails it", () => {
    // A slip in the algebra (a decay off by a row, a term of the solve lost) moves outputs by
    // far more than this.
    const c = dnCase(70, TINY, 504);
    const ref = dnReference(c);
    const moved = { ...c, b: c.b.slice() };
    moved.b[40 * c.valueHeads] = moved.b[40 * c.valueHeads]! + 1e-2;
    const slipped = compareClose(dnReference(moved).o, ref.o, TOL);
    expect(slipped.failures).toBeGreaterThan(0);
  });
});

describe("deltanet form choice", () => {
  test("batches with snapshot rows keep the row scan; forcing the chunked form there is an error", () => {
    const c = dnCase(40, TINY, 601);
    const g = dnOnDevice(dev, c);
    // Forced on: refused with the reason.
    expect(() => run(dev, (ctx) => g.encode(ctx, 0, 5, 3, true))).toThrow(/chunked form cannot serve this call: it writes no snapshot planes/);
    // Host's choice with CHERENKOV_DELTANET_CHUNKED=1 and snapshot rows: the row scan, whose
    // planes hold the state after each row (the last one equals the live state).
    withEnv("1", () => run(dev, (ctx) => g.encode(ctx, 0, 5, 5)));
    expectExact(readPlane(g.planes, 4), g.S.f32.subarray(0, c.S.length), "last plane = live S");
    expect(readPlane(g.planes, 0).some((x) => x !== 0)).toBe(true);
  });

  test("deltanetTakesChunked: from the row threshold, without snapshot rows, key dim <= 128, with a big enough work region", () => {
    const c = dnCase(1, TINY, 602);
    const work = { buffer: dev.buffer(16), offset: 0, bytes: deltanetChunkBytes(64, c.valueHeads) };
    const args = { ...c, rows: 64, work } as unknown as DeltaNetArgs;
    expect(deltanetTakesChunked(args, 64)).toBe(true);
    expect(deltanetTakesChunked({ ...args, rows: 63 }, 64)).toBe(false);
    expect(deltanetTakesChunked({ ...args, rows: 65 }, 64)).toBe(false); // 65 rows need a third block
    expect(deltanetTakesChunked({ ...args, snapshots: { planes: {} as never, rows: 2 } }, 64)).toBe(false);
    expect(deltanetTakesChunked({ ...args, keyDim: 256 }, 64)).toBe(false);
    expect(deltanetTakesChunked({ ...args, work: undefined }, 64)).toBe(false);
  });

  test("CHERENKOV_DELTANET_CHUNKED: 1 forces on (1 row), 0 off, unset: GPU from DELTANET_CHUNKED_MIN_ROWS, never on cpu; bad values are errors", () => {
    withEnv(undefined, () => {
      expect(deltanetChunkedMinRows("cpu")).toBe(Infinity);
      expect(deltanetChunkedMinRows("cuda")).toBe(DELTANET_CHUNKED_MIN_ROWS);
      expect(deltanetChunkedMinRows("metal")).toBe(DELTANET_CHUNKED_MIN_ROWS);
    });
    withEnv("1", () => expect(deltanetChunkedMinRows("cpu")).toBe(1));
    withEnv("0", () => expect(deltanetChunkedMinRows("cuda")).toBe(Infinity));
    withEnv("yes", () => expect(() => deltanetChunkedMinRows("cpu")).toThrow(/CHERENKOV_DELTANET_CHUNKED=yes/));
    expect(DELTANET_CHUNKED_MIN_ROWS).toBeGreaterThanOrEqual(DELTANET_CHUNK);
  });
});

function withEnv(value: string | undefined, f: () => void): void {
  const saved = process.env.CHERENKOV_DELTANET_CHUNKED;
  if (value === undefined) delete process.env.CHERENKOV_DELTANET_CHUNKED;
  else process.env.CHERENKOV_DELTANET_CHUNKED = value;
  try {
    f();
  } finally {
    if (saved === undefined) delete process.env.CHERENKOV_DELTANET_CHUNKED;
    else process.env.CHERENKOV_DELTANET_CHUNKED = saved;
  }
}
