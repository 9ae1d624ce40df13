// attn_tiles (kernels/attention.metal): a prompt chunk's causal attention through the tile API,
// against lib/reference's attendHead over the same cache (q8 and f32), at head_dim 32 / 64 / 128
// (and 160 / 256 for q8: attn_tiles_wide_q8),
// GQA ratios 1, 4 and 8, row counts that leave threadgroups and simdgroups partly empty, and
// chunks after earlier positions (pos0 > 0). The CPU backend keeps attn_rows by default
// (lib/gpu/attention.ts attnTilesMinRows): CHERENKOV_ATTN_TILES_MIN_ROWS=1 sends these calls
// through the tiles, and every call checks which kernel it encoded.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";

import {
  ATTN_TILES,
  ATTN_TILES_MIN_ROWS,
  attnTilesMinRows,
  encodeAttention,
  usesAttnTiles,
} from "../../lib/gpu/attention.ts";
import { MAX_SNAP } from "../../lib/gpu/limits.ts";
import { attendHead } from "../../lib/reference/attention.ts";
import { CommandBuffer, type Buffer, type Pipeline } from "../../lib/shim.ts";
import { expectClose, expectGuard, openDevice, outputF32, randomF32, rows, run, uploadF32 } from "./harness.ts";
import { printWorstErrors, randomKvCache, uploadKvCache } from "./sequence-util.ts";

const dev = openDevice();
const saved = process.env.CHERENKOV_ATTN_TILES_MIN_ROWS;
beforeAll(() => {
  process.env.CHERENKOV_ATTN_TILES_MIN_ROWS = "1";
});
afterAll(() => {
  if (saved === undefined) delete process.env.CHERENKOV_ATTN_TILES_MIN_ROWS;
  else process.env.CHERENKOV_ATTN_TILES_MIN_ROWS = saved;
  printWorstErrors();
  dev.close();
});

/** Kernel names encoded while `body` runs. */
function kernelsOf(body: () => void): string[] {
  const seen: string[] = [];
  const { dispatch } = CommandBuffer.prototype;
  CommandBuffer.prototype.dispatch = function (this: CommandBuffer, pipeline: Pipeline, ...rest) {
    seen.push(pipeline.name);
    return dispatch.call(this, pipeline, ...rest);
  } as typeof dispatch;
  try {
    body();
  } finally {
    CommandBuffer.prototype.dispatch = dispatch;
  }
  return seen;
}



interface TileCase {
  kind: "q8" | "f32";
  nb: number;
  pos0: number;
  H: number;
  Hkv: number;
  hd: number;
  gated?: boolean;
  /** Pass the QSA list that selects every position (topk pos0 + nb), as encodeQsa writes it. */
  listed?: boolean;
}

/** attn_tiles' output and the reference's (f64 softmax and sums over the dequantized cache). */
function runCase(c: TileCase, seed: number) {
  const { nb, pos0, H, Hkv, hd } = c;
  const K = randomKvCache(c.kind, Hkv, hd, pos0 + nb, seed, 1.5);
  const V = randomKvCache(c.kind, Hkv, hd, pos0 + nb, seed + 1, 1);
  const q = randomF32(nb * H * hd, seed, 1.5, "q");
  const gate = randomF32(nb * H * hd, seed, 3, "gate");
  const expected = new Float32Array(nb * H * hd);
  const out = new Float32Array(hd);
  for (let t = 0; t < nb; t++) {
    const positions = Array.from({ length: pos0 + t + 1 }, (_, s) => s);
    for (let h = 0; h < H; h++) {
      const off = (t * H + h) * hd;
      attendHead(q.subarray(off, off + hd), K, V, Math.floor((h * Hkv) / H), positions, out);
      for (let d = 0; d < hd; d++) expected[off + d] = c.gated ? out[d]! / (1 + Math.exp(-gate[off + d]!)) : out[d]!;
    }
  }
  const qb = uploadF32(dev, q);
  const gb = uploadF32(dev, gate);
  const o = outputF32(dev, nb * H * hd);
  let selection: { list: Buffer; counts: Buffer; topk: number } | undefined;
  if (c.listed) {
    const topk = pos0 + nb;
    const list = dev.buffer(nb * topk * 4);
    const counts = dev.buffer(nb * 4);
    for (let t = 0; t < nb; t++) {
      for (let s = 0; s <= pos0 + t; s++) list.i32[t * topk + s] = s;
      counts.i32[t] = pos0 + t + 1;
    }
    selection = { list, counts, topk };
  }
  const kernels = kernelsOf(() =>
    run(dev, (ctx) =>
      encodeAttention(ctx, {
        rows: nb,
        pos0,
        heads: H,
        q: rows(qb, H * hd),
        k: uploadKvCache(dev, K),
        v: uploadKvCache(dev, V),
        o: rows(o, H * hd),
        gate: c.gated ? rows(gb, H * hd) : undefined,
        selection,
      }),
    ),
  );
  expectGuard(o, nb * H * hd); // nothing written past the rows
  return { kernels, actual: o.f32.subarray(0, nb * H * hd), expected };
}

// Q, P and f32 K/V as bf16 hi + lo pairs, q8 codes exact (docs/model.md, rule R7): each product
// to about 2^-16, so a logit (|q k| summed over hd dims, times 1/sqrt(hd)) is off by ~1e-5 at
// most here and an output (a convex mix of |v| <= 1) by less. Measured worst: 5.7e-6 (f32 and
// q8 alike; CHERENKOV_KERNEL_ERRORS=1 prints it); attn_rows' f32 sums meet
// attention.test.ts's 2e-6 + 1e-5 relative. The bound is sharp: with Q's lo product left out
// (one bf16 product for S) the outputs were off by up to 1.3e-3 and every case failed.
const TILE_TOL = { abs: 1.2e-5 };

describe("attn_tiles against attendHead", () => {
  const cases: TileCase[] = [];
  for (const kind of ["q8", "f32"] as const) {
    for (const hd of [32, 64, 128]) {
      cases.push({ kind, nb: 37, pos0: 0, H: 4, Hkv: 4, hd }); // G 1: a simdgroup of 5 pairs, one idle
      cases.push({ kind, nb: 21, pos0: 45, H: 8, Hkv: 2, hd, gated: true }); // G 4, a second chunk
    }
    cases.push({ kind, nb: 19, pos0: 70, H: 16, Hkv: 2, hd: 128 }); // G 8: 2 rows per simdgroup
    cases.push({ kind, nb: 3, pos0: 0, H: 8, Hkv: 1, hd: 64, gated: true }); // fewer pairs than a simdgroup
    cases.push({ kind, nb: 24, pos0: 9, H: 4, Hkv: 1, hd: 64, listed: true }); // a QSA list of every position
  }
  // attn_tiles_wide_q8: two simdgroups per 16 pairs, 16 positions a tile.
  cases.push({ kind: "q8", nb: 37, pos0: 0, H: 2, Hkv: 2, hd: 256 }); // G 1
  cases.push({ kind: "q8", nb: 21, pos0: 45, H: 8, Hkv: 2, hd: 256, gated: true }); // G 4, a second chunk
  cases.push({ kind: "q8", nb: 11, pos0: 30, H: 16, Hkv: 2, hd: 256 }); // G 8, the 80b shape's ratio
  cases.push({ kind: "q8", nb: 13, pos0: 5, H: 4, Hkv: 1, hd: 160 }); // the second half 32 dims
  test.each(cases)("$kind hd $hd, nb $nb, pos0 $pos0, H $H/$Hkv, gated $gated, listed $listed", (c) => {
    const r = runCase(c, c.nb * 7 + c.pos0 + c.hd);
    expect(r.kernels).toEqual([c.hd > 128 ? "attn_tiles_wide_q8" : `attn_tiles_${c.kind}`]);
    expectClose(r.actual, r.expected, TILE_TOL, `attn-tiles-${c.kind} hd=${c.hd} nb=${c.nb} pos0=${c.pos0}`, c.hd);
  });
});

describe("attn_tiles selection", () => {
  const q = { buffer: dev.buffer(64), offset: 0, stride: 512 };
  const dense = { rows: 64, pos0: 10, q, kind: "q8" as const, headDim: 128, splits: 1 };
  const list = (topk: number) => ({ list: q.buffer, counts: q.buffer, topk });
  test("causal chunks that read every position from the threshold; QSA lists that select, splits, head dims past 128 or not /16 keep attn_rows", () => {
    expect(usesAttnTiles(dense, 64)).toBe(true);
    expect(usesAttnTiles({ ...dense, rows: 63 }, 64)).toBe(false);
    expect(usesAttnTiles({ ...dense, selection: list(74) }, 64)).toBe(true); // QSA lists every position
    expect(usesAttnTiles({ ...dense, selection: list(73) }, 64)).toBe(false); // the last row's list selects
    expect(usesAttnTiles({ ...dense, splits: 2 }, 64)).toBe(false);
    expect(usesAttnTiles({ ...dense, headDim: 256 }, 64)).toBe(true); // attn_tiles_wide_q8
    expect(usesAttnTiles({ ...dense, headDim: 272 }, 64)).toBe(false);
    expect(usesAttnTiles({ ...dense, kind: "f32", headDim: 128 }, 64)).toBe(true);
    expect(usesAttnTiles({ ...dense, kind: "f32", headDim: 144 }, 64)).toBe(false); // f32 K/V tiles of 256 dims exceed 32 KiB
    expect(usesAttnTiles({ ...dense, headDim: 72 }, 64)).toBe(false);
    expect(usesAttnTiles({ ...dense, q: { ...q, offset: 4 } }, 64)).toBe(false);
    expect([ATTN_TILES.maxHeadDim, ATTN_TILES.maxWideHeadDim]).toEqual([128, 256]);
  });

  test("the threshold: never on the CPU backend by default, above a verify batch on a GPU, overridable", () => {
    delete process.env.CHERENKOV_ATTN_TILES_MIN_ROWS;
    try {
      expect(attnTilesMinRows("cpu")).toBe(Infinity);
      expect(attnTilesMinRows("cuda")).toBe(ATTN_TILES_MIN_ROWS);
      expect(ATTN_TILES_MIN_ROWS).toBeGreaterThan(1 + MAX_SNAP);
      process.env.CHERENKOV_ATTN_TILES_MIN_ROWS = "0";
      expect(() => attnTilesMinRows("cpu")).toThrow(/CHERENKOV_ATTN_TILES_MIN_ROWS=0/);
      process.env.CHERENKOV_ATTN_TILES_MIN_ROWS = "5";
      expect(attnTilesMinRows("cpu")).toBe(5);
    } finally {
      process.env.CHERENKOV_ATTN_TILES_MIN_ROWS = "1";
    }
  });
});
