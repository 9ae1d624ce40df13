// kernels/rope.metal, kv.metal, qsa.metal and attention.metal against lib/reference
// (ropeNeox, quantizeQ8 / KvCache, qsaScores + qsaSelect, attendHead) at nb in NB_CASES,
// with caches that already hold earlier positions; q8 paths against the reference's q8.
import { afterAll, describe, expect, test } from "bun:test";

import {
  allocateKvCache,
  attentionPartialBytes,
  attentionSplits,
  ATTN_DECODE_SPLIT,
  ATTN_SPLIT_ROWS,
  encodeAttention,
  encodeKvAppend,
  encodeQsa,
  encodeRope,
} from "../../lib/gpu/attention.ts";
import type { EncodeContext } from "../../lib/gpu/dispatch.ts";
import { MAX_NB } from "../../lib/gpu/limits.ts";
import { attendHead, qsaScores, qsaSelect } from "../../lib/reference/attention.ts";
import { nearHalves } from "../reference/fixtures.ts";
import { KvCache } from "../../lib/reference/kvcache.ts";
import { ropeNeox, topKIndices } from "../../lib/reference/ops.ts";
import type { Buffer } from "../../lib/shim.ts";
import { expectClose, expectExact, NB_CASES, openDevice, outputF32, outputI32, randomF32, rng, rows, run, uploadF32 } from "./harness.ts";
import { printWorstErrors, randomKvCache, uploadKvCache } from "./sequence-util.ts";

const dev = openDevice();
afterAll(() => {
  printWorstErrors();
  dev.close();
});

// ---- RoPE ------------------------------------------------------------------------------

describe("rope_neox_f32", () => {
  const cases = NB_CASES.map((nb) => ({ nb, H: nb === MAX_NB ? 2 : 8, Hkv: nb === MAX_NB ? 1 : 2, hd: nb === MAX_NB ? 16 : 32 }));
  test.each(cases)("nb $nb against ropeNeox", ({ nb, H, Hkv, hd }) => {
    for (const [rd, theta, pos0] of [
      [hd / 4, 1e6, 37],
      [hd, 1e4, 5000],
      [hd / 2, 1e7, 1_000_000],
    ] as const) {
      const q = randomF32(nb * H * hd, nb + rd, 1, "q");
      const k = randomF32(nb * Hkv * hd, nb + rd, 1, "k");
      const qb = uploadF32(dev, q);
      const kb = uploadF32(dev, k);
      run(dev, (ctx) => encodeRope(ctx, { rows: nb, pos0, headDim: hd, rotDim: rd, theta, q: rows(qb, H * hd), qHeads: H, k: rows(kb, Hkv * hd), kHeads: Hkv }));
      for (let t = 0; t < nb; t++) {
        for (let h = 0; h < H; h++) ropeNeox(q.subarray((t * H + h) * hd, (t * H + h + 1) * hd), pos0 + t, rd, theta);
        for (let h = 0; h < Hkv; h++) ropeNeox(k.subarray((t * Hkv + h) * hd, (t * Hkv + h + 1) * hd), pos0 + t, rd, theta);
      }
      // The same f32 angles as the reference (lib/model/rope.ts), reduced mod 2 pi, precise f32
      // sin/cos and products: a few ulps of values of magnitude <= sqrt(2), even at position 10^6.
      expectClose(qb.f32.subarray(0, q.length), q, { abs: 1e-6 }, `rope nb=${nb} rd=${rd} pos0=${pos0}`, hd);
      expectClose(kb.f32.subarray(0, k.length), k, { abs: 1e-6 }, `rope nb=${nb} rd=${rd} pos0=${pos0}`, hd);
    }
  });
});

// ---- KV append ---------------------------------------------------------------------------



/** Rows of vectors that hit the q8 rounding rule's edges: exact halves, near halves, zeros, clamping. */
function edgeRows(nb: number, heads: number, dim: number, seed: number): Float32Array {
  const x = randomF32(nb * heads * dim, seed, 2, "append");
  for (let v = 0; v < nb * heads; v++) {
    const base = v * dim;
    const kind = v % 5;
    if (kind === 4) {
      // max 3.3 makes scale = f32(3.3 / 127) inexact; the rest sit next to (n + 1/2) * scale.
      x[base] = 3.3;
      const scale = Math.fround(Math.fround(3.3) / 127);
      const near = nearHalves(scale, dim - 1);
      for (let i = 1; i < dim; i++) x[base + i] = (i % 2 ? 1 : -1) * near[(i - 1) % near.length]!;
      continue;
    }
    if (kind === 1) {
      // max 127 * 2^e, so scale = 2^e and x / scale = m + 1/2 exactly
      const e = (v % 7) - 3;
      for (let i = 0; i < dim; i++) x[base + i] = ((i % 5) - 2 + 0.5 * Math.sign((i % 5) - 2 || 1)) * 2 ** e;
      x[base] = 127 * 2 ** e;
    } else if (kind === 2) {
      x.fill(0, base, base + dim);
    } else if (kind === 3) {
      x[base + (v % dim)] = -3.5; // negative maximum
    }
  }
  return x;
}

describe("kv_append", () => {
  test.each(NB_CASES)("q8, nb %i: codes and scales equal the reference's exactly", (nb) => {
    const heads = 2;
    const dim = nb === MAX_NB ? 16 : 48;
    const pos0 = nb === 1 ? 9 : 3;
    const cap = pos0 + nb + 2;
    const x = edgeRows(nb, heads, dim, nb);
    const ref = randomKvCache("q8", heads, dim, pos0, 5);
    const cache = uploadKvCache(dev, ref, cap);
    const xb = uploadF32(dev, x);
    (cache.scales as Buffer).f32.fill(-1, (pos0 + nb) * heads); // sentinels after the rows
    run(dev, (ctx) => encodeKvAppend(ctx, { rows: nb, pos0, x: rows(xb, heads * dim), cache }));
    for (let t = 0; t < nb; t++) ref.append(x.subarray(t * heads * dim, (t + 1) * heads * dim));
    const codes = new Int8Array((cache.data as Buffer).bytes.buffer, (cache.data as Buffer).bytes.byteOffset, (pos0 + nb) * heads * dim);
    expectExact(codes, ref.codes.subarray(0, (pos0 + nb) * heads * dim), `q8 codes nb=${nb}`, dim);
    expectExact((cache.scales as Buffer).f32.subarray(0, (pos0 + nb) * heads), ref.scales.subarray(0, (pos0 + nb) * heads), `q8 scales nb=${nb}`);
    expect((cache.scales as Buffer).f32[(pos0 + nb) * heads]).toBe(-1);
  });

  test("f32: values copied to positions pos0..", () => {
    const nb = 5, heads = 2, dim = 16, pos0 = 4;
    const x = randomF32(nb * heads * dim, 3);
    const cache = allocateKvCache(dev, "f32", heads, dim, pos0 + nb + 1);
    const data = cache.data as Buffer;
    data.f32.fill(7);
    const xb = uploadF32(dev, x);
    run(dev, (ctx) => encodeKvAppend(ctx, { rows: nb, pos0, x: rows(xb, heads * dim), cache }));
    expectExact(data.f32.subarray(pos0 * heads * dim, (pos0 + nb) * heads * dim), x, "f32 values");
    expect(data.f32[pos0 * heads * dim - 1]).toBe(7);
    expect(data.f32[(pos0 + nb) * heads * dim]).toBe(7);
  });

  test("positions past the capacity are refused", () => {
    const cache = allocateKvCache(dev, "q8", 1, 16, 4);
    const xb = uploadF32(dev, new Float32Array(32));
    expect(() => run(dev, (ctx) => encodeKvAppend(ctx, { rows: 2, pos0: 3, x: rows(xb, 16), cache }))).toThrow(/capacity 4/);
  });
});

// ---- QSA -------------------------------------------------------------------------------------

interface QsaRun {
  selected: number[][];
  kernelScores: Float32Array[];
}

function runQsa(kind: "q8" | "f32", nb: number, pos0: number, Hi: number, di: number, topk: number, seed: number) {
  const ik = randomKvCache(kind, 1, di, pos0 + nb, seed);
  const iq = randomF32(nb * Hi * di, seed, 1, "iq");
  // Mostly positive index weights, so that scores tie at exactly 0 only sometimes.
  const iw = randomF32(nb * Hi, seed, 1, "iw").map((w, i) => (i % 3 === 2 ? w : Math.abs(w)));
  const cache = uploadKvCache(dev, ik, pos0 + nb);
  const longest = pos0 + nb;
  const scores = outputF32(dev, nb * longest);
  const selected = outputI32(dev, nb * topk);
  const counts = outputI32(dev, nb);
  const iqb = uploadF32(dev, iq);
  const iwb = uploadF32(dev, iw);
  run(dev, (ctx) =>
    encodeQsa(ctx, {
      rows: nb, pos0, topk, heads: Hi, iq: rows(iqb, Hi * di), iw: rows(iwb, Hi), ik: cache,
      scores: rows(scores, longest), selected, counts,
    }),
  );
  const out: QsaRun = { selected: [], kernelScores: [] };
  for (let t = 0; t < nb; t++) {
    const n = counts.i32[t]!;
    out.selected.push(Array.from(selected.i32.subarray(t * topk, t * topk + n)));
    out.kernelScores.push(scores.f32.slice(t * longest, t * longest + pos0 + t + 1));
  }
  return { ik, iq, iw, out };
}

describe("qsa_scores + qsa_topk_f32", () => {
  const cases = [
    { nb: 1, pos0: 3000, Hi: 4, di: 32, topk: 64 },
    { nb: 2, pos0: 100, Hi: 2, di: 16, topk: 8 },
    { nb: 3, pos0: 300, Hi: 36, di: 24, topk: 50 }, // top-k on 320 threads (10 simdgroups); heads in two rounds (32 + 4)
    { nb: 5, pos0: 2, Hi: 2, di: 16, topk: 4 }, // rows 0-1 take every position, later rows select
    { nb: MAX_NB, pos0: 0, Hi: 2, di: 16, topk: 16 },
  ];
  test.each(cases)("q8, nb $nb, pos0 $pos0, topk $topk against qsaScores + qsaSelect", ({ nb, pos0, Hi, di, topk }) => {
    const { ik, iq, iw, out } = runQsa("q8", nb, pos0, Hi, di, topk, nb + pos0);
    let flips = 0;
    for (let t = 0; t < nb; t++) {
      const count = pos0 + t + 1;
      const sel = out.selected[t]!;
      if (count <= topk) {
        expect(sel).toEqual(Array.from({ length: count }, (_, s) => s));
        continue;
      }
      const ref = qsaScores(iq.subarray(t * Hi * di, (t + 1) * Hi * di), iw.subarray(t * Hi, (t + 1) * Hi), ik.values.subarray(0, count * di), count, Hi, di);
      // f32 dot products over di (codes times the scale factored out) vs f64 sums.
      expectClose(out.kernelScores[t]!, ref, { abs: 1e-6, rel: 1e-5 }, `qsa-scores nb=${nb}`);
      // The selection is exactly the top-k of the kernel's own scores (ties: lower s), ascending...
      expect(sel).toEqual(topKIndices(out.kernelScores[t]!, topk).sort((a, b) => a - b));
      // ...and the reference's, except where rounding reorders scores within 1e-6 of the k-th.
      const want = qsaSelect(ref, topk);
      if (sel.join() !== want.join()) {
        const kth = topKIndices(ref, topk).map((s) => ref[s]!)[topk - 1]!;
        const diff = sel.filter((s) => !want.includes(s)).concat(want.filter((s) => !sel.includes(s)));
        for (const s of diff) expect(Math.abs(ref[s]! - kth)).toBeLessThan(1e-6);
        flips++;
      }
    }
    expect(flips).toBeLessThanOrEqual(Math.ceil(nb / 100));
  });

  test("f32 index keys; ties at score 0 go to the lower positions", () => {
    // iq, iw > 0; ik > 0 at every third position and < 0 elsewhere: those score exactly 0,
    // so each row's selection is its positive positions plus the lowest zero-score ones.
    const nb = 5, pos0 = 40, Hi = 2, di = 16, topk = 20;
    const ik = new KvCache("f32", 1, di);
    const raw = randomF32((pos0 + nb) * di, 12, 1, "ik");
    for (let s = 0; s < pos0 + nb; s++) ik.append(raw.subarray(s * di, (s + 1) * di).map((x) => (s % 3 === 0 ? Math.abs(x) : -Math.abs(x))));
    const iq = randomF32(nb * Hi * di, 13, 1, "iq").map(Math.abs);
    const iw = randomF32(nb * Hi, 14, 1, "iw").map(Math.abs);
    const longest = pos0 + nb;
    const scores = outputF32(dev, nb * longest);
    const selected = outputI32(dev, nb * topk);
    const counts = outputI32(dev, nb);
    const iqb = uploadF32(dev, iq);
    const iwb = uploadF32(dev, iw);
    run(dev, (ctx) =>
      encodeQsa(ctx, {
        rows: nb, pos0, topk, heads: Hi, iq: rows(iqb, Hi * di), iw: rows(iwb, Hi), ik: uploadKvCache(dev, ik, longest),
        scores: rows(scores, longest), selected, counts,
      }),
    );
    for (let t = 0; t < nb; t++) {
      const count = pos0 + t + 1;
      const ref = qsaScores(iq.subarray(t * Hi * di, (t + 1) * Hi * di), iw.subarray(t * Hi, (t + 1) * Hi), ik.values.subarray(0, count * di), count, Hi, di);
      expectClose(scores.f32.subarray(t * longest, t * longest + count), ref, { abs: 1e-6, rel: 1e-5 }, "qsa-scores f32");
      const positive = Array.from({ length: count }, (_, s) => s).filter((s) => s % 3 === 0);
      const zeros = Array.from({ length: count }, (_, s) => s).filter((s) => s % 3 !== 0);
      const want = [...positive, ...zeros.slice(0, topk - positive.length)].sort((a, b) => a - b);
      expect(qsaSelect(ref, topk)).toEqual(want);
      expect(counts.i32[t]).toBe(topk);
      expect(Array.from(selected.i32.subarray(t * topk, (t + 1) * topk))).toEqual(want);
    }
  });

  test("all scores equal: the first topk positions", () => {
    const nb = 3, pos0 = 50, di = 16, topk = 6;
    const cache = uploadKvCache(dev, randomKvCache("q8", 1, di, pos0 + nb, 4), pos0 + nb);
    const scores = outputF32(dev, nb * (pos0 + nb));
    const selected = outputI32(dev, nb * topk);
    const counts = outputI32(dev, nb);
    const zeros = uploadF32(dev, new Float32Array(nb * 2 * di)); // iq = 0: every score is 0
    const iw = uploadF32(dev, new Float32Array(nb * 2).fill(1));
    run(dev, (ctx) =>
      encodeQsa(ctx, { rows: nb, pos0, topk, heads: 2, iq: rows(zeros, 2 * di), iw: rows(iw, 2), ik: cache, scores: rows(scores, pos0 + nb), selected, counts }),
    );
    for (let t = 0; t < nb; t++) {
      expect(counts.i32[t]).toBe(topk);
      expect(Array.from(selected.i32.subarray(t * topk, (t + 1) * topk))).toEqual([0, 1, 2, 3, 4, 5]);
    }
  });

  // Thousands of positions drawn from five key vectors, so scores come in five groups of exact
  // ties (one of them relu's zeros) and the k-th score falls inside a group: the selection is
  // the higher groups and the lowest positions of the k-th's. Shapes: the 30b's (16 heads x 128,
  // two heads a simdgroup), more heads than one round of qsa_scores holds (40 x 256: three
  // rounds), and a q8 dim that is not a multiple of 16 (its 4-byte key loads).
  const tieCases = [
    { kind: "q8", Hi: 16, di: 128, pos0: 4000, topk: 2048 },
    { kind: "q8", Hi: 40, di: 256, pos0: 2500, topk: 1400 },
    { kind: "q8", Hi: 3, di: 20, pos0: 3000, topk: 700 },
    { kind: "f32", Hi: 9, di: 36, pos0: 3000, topk: 2000 },
  ] as const;
  test.each(tieCases)("$kind, $Hi heads x $di, pos0 $pos0, topk $topk: five groups of equal scores", ({ kind, Hi, di, pos0, topk }) => {
    const nb = 3;
    const longest = pos0 + nb;
    const iq = randomF32(nb * Hi * di, di, 1, "iq").map(Math.abs);
    const iw = randomF32(nb * Hi, di, 1, "iw").map((w) => 0.1 + Math.abs(w));
    const vectors = [0, 1, 2, 3, 4].map((v) => randomF32(di, 100 + v, 1, "ik").map((x) => (v === 0 ? -Math.abs(x) : Math.abs(x) * v)));
    const group = (s: number) => (s * 7 + (s >> 5)) % 5; // interleaved, uneven runs
    const ik = new KvCache(kind, 1, di);
    for (let s = 0; s < longest; s++) ik.append(vectors[group(s)]!);
    const scores = outputF32(dev, nb * longest);
    const selected = outputI32(dev, nb * topk);
    const counts = outputI32(dev, nb);
    const iqb = uploadF32(dev, iq);
    const iwb = uploadF32(dev, iw);
    run(dev, (ctx) =>
      encodeQsa(ctx, {
        rows: nb, pos0, topk, heads: Hi, iq: rows(iqb, Hi * di), iw: rows(iwb, Hi), ik: uploadKvCache(dev, ik, longest),
        scores: rows(scores, longest), selected, counts,
      }),
    );
    let cutInsideGroup = 0;
    for (let t = 0; t < nb; t++) {
      const count = pos0 + t + 1;
      const got = scores.f32.subarray(t * longest, t * longest + count);
      const ref = qsaScores(iq.subarray(t * Hi * di, (t + 1) * Hi * di), iw.subarray(t * Hi, (t + 1) * Hi), ik.values.subarray(0, count * di), count, Hi, di);
      expectClose(got, ref, { abs: 1e-6, rel: 1e-5 }, `qsa-scores ties ${kind} ${Hi}x${di}`);
      // Equal keys score the same bits, and five distinct values.
      const first = [0, 1, 2, 3, 4].map((g) => [0, 1, 2, 3, 4].find((s) => group(s) === g)!);
      for (let s = 0; s < count; s++) if (got[s] !== got[first[group(s)]!]) throw new Error(`qsa ties: position ${s} scores ${got[s]}, not its group's ${got[first[group(s)]!]}`);
      expect(new Set(got).size).toBe(5);
      const want = qsaSelect(ref, topk);
      expect(counts.i32[t]).toBe(topk);
      expect(Array.from(selected.i32.subarray(t * topk, (t + 1) * topk))).toEqual(want);
      const kth = topKIndices(got, topk).map((s) => got[s]!)[topk - 1]!;
      const above = Array.from(got).filter((x) => x > kth).length;
      if (above > 0 && above < topk && Array.from(got).filter((x) => x === kth).length > topk - above) cutInsideGroup++;
    }
    expect(cutInsideGroup).toBeGreaterThan(0); // the case tests ties at the cut, not a clean boundary
  });
});

// ---- attention ---------------------------------------------------------------------------------

interface AttnCase {
  kind: "q8" | "f32";
  nb: number;
  pos0: number;
  H: number;
  Hkv: number;
  hd: number;
  /** QSA-like selection: topk random positions per row (all when pos + 1 <= topk). */
  topk?: number;
  splitLen?: number;
}

function randomSelection(nb: number, pos0: number, topk: number, seed: number): number[][] {
  const r = rng(seed, "selection");
  return Array.from({ length: nb }, (_, t) => {
    const count = pos0 + t + 1;
    if (count <= topk) return Array.from({ length: count }, (_, s) => s);
    const chosen = new Set<number>([pos0 + t]);
    while (chosen.size < topk) chosen.add(r.int(count));
    return [...chosen].sort((a, b) => a - b);
  });
}

function attentionCase(c: AttnCase, seed: number) {
  const { nb, pos0, H, Hkv, hd } = c;
  const K = randomKvCache(c.kind, Hkv, hd, pos0 + nb, seed, 1.5);
  const V = randomKvCache(c.kind, Hkv, hd, pos0 + nb, seed + 1);
  const q = randomF32(nb * H * hd, seed, 1.5, "q");
  const selection = c.topk ? randomSelection(nb, pos0, c.topk, seed) : null;
  const expected = new Float32Array(nb * H * hd);
  for (let t = 0; t < nb; t++) {
    const positions = selection ? selection[t]! : Array.from({ length: pos0 + t + 1 }, (_, s) => s);
    for (let h = 0; h < H; h++) {
      const off = (t * H + h) * hd;
      attendHead(q.subarray(off, off + hd), K, V, Math.floor((h * Hkv) / H), positions, expected.subarray(off, off + hd));
    }
  }
  return { K, V, q, selection, expected };
}

function runAttention(c: AttnCase, seed: number) {
  const { nb, pos0, H, hd } = c;
  const { K, V, q, selection, expected } = attentionCase(c, seed);
  const kc = uploadKvCache(dev, K, pos0 + nb);
  const vc = uploadKvCache(dev, V, pos0 + nb);
  const qb = uploadF32(dev, q);
  const o = outputF32(dev, nb * H * hd);
  let sel: { list: Buffer; counts: Buffer; topk: number } | undefined;
  if (selection) {
    const topk = c.topk!;
    const list = outputI32(dev, nb * topk);
    const counts = outputI32(dev, nb);
    selection.forEach((s, t) => {
      list.i32.set(s, t * topk);
      counts.i32[t] = s.length;
    });
    sel = { list, counts, topk };
  }
  // attn_rows itself (a GPU would send a long causal chunk to attn_tiles: spec/kernels/attn-tiles.test.ts).
  const base = { rows: nb, pos0, heads: H, selection: sel, splitLen: c.splitLen, tiles: false };
  const { splits } = attentionSplits(base);
  const partials = splits > 1 ? dev.buffer(attentionPartialBytes(nb, H, hd, splits)) : undefined;
  run(dev, (ctx) => encodeAttention(ctx, { ...base, q: rows(qb, H * hd), k: kc, v: vc, o: rows(o, H * hd), partials }));
  return { actual: o.f32.subarray(0, nb * H * hd), expected, splits };
}

// Online softmax and dot products in f32 (q8: the code dot product scaled once) vs the
// reference's f64 logits, softmax and sums over the same dequantized cache values.
const ATTN_TOL = { abs: 2e-6, rel: 1e-5 };

describe("attn_rows", () => {
  const causal: AttnCase[] = [
    { kind: "q8", nb: 1, pos0: 700, H: 4, Hkv: 2, hd: 32 }, // decode: 3 splits + combine
    { kind: "q8", nb: 2, pos0: 37, H: 4, Hkv: 2, hd: 32 },
    { kind: "q8", nb: 3, pos0: 150, H: 4, Hkv: 2, hd: 32 }, // a verify batch: split as a decode row (ATTN_SPLIT_ROWS)
    { kind: "q8", nb: 5, pos0: 90, H: 8, Hkv: 2, hd: 48 }, // a prompt chunk: one split
    { kind: "q8", nb: MAX_NB, pos0: 0, H: 2, Hkv: 1, hd: 16 },
  ];
  test.each(causal)("causal $kind, nb $nb, pos0 $pos0, H $H/$Hkv, hd $hd", (c) => {
    const r = runAttention(c, c.nb + c.pos0);
    if (c.nb <= ATTN_SPLIT_ROWS && c.pos0 + c.nb > ATTN_DECODE_SPLIT) expect(r.splits).toBeGreaterThan(1);
    if (c.nb > ATTN_SPLIT_ROWS) expect(r.splits).toBe(1);
    expectClose(r.actual, r.expected, ATTN_TOL, `attention nb=${c.nb}`, c.hd);
  });

  const listed: AttnCase[] = [
    { kind: "q8", nb: 1, pos0: 2000, H: 4, Hkv: 1, hd: 32, topk: 64 },
    { kind: "q8", nb: 2, pos0: 20, H: 4, Hkv: 2, hd: 16, topk: 8 },
    { kind: "q8", nb: 5, pos0: 3, H: 4, Hkv: 2, hd: 32, topk: 6 }, // first rows read everything
    { kind: "q8", nb: MAX_NB, pos0: 0, H: 4, Hkv: 2, hd: 16, topk: 16 },
  ];
  test.each(listed)("selected positions $kind, nb $nb, pos0 $pos0, topk $topk", (c) => {
    const r = runAttention(c, 3 * c.nb + c.pos0);
    expectClose(r.actual, r.expected, ATTN_TOL, `attention-list nb=${c.nb}`, c.hd);
  });

  test.each([
    { kind: "f32", nb: 5, pos0: 60, H: 4, Hkv: 4, hd: 32 },
    { kind: "f32", nb: 1, pos0: 300, H: 2, Hkv: 1, hd: 16, splitLen: 64 },
    { kind: "q8", nb: 5, pos0: 10, H: 4, Hkv: 2, hd: 32, splitLen: 4 }, // many splits, empty ones for short rows
    { kind: "q8", nb: 3, pos0: 40, H: 4, Hkv: 2, hd: 16, topk: 10, splitLen: 3 },
  ] as AttnCase[])("variant $kind nb $nb pos0 $pos0 split $splitLen", (c) => {
    const r = runAttention(c, 11 + c.nb);
    expectClose(r.actual, r.expected, ATTN_TOL, `attention-variant nb=${c.nb}`, c.hd);
  });
});

// ---- the attention ops of a step in order -------------------------------------------------------

describe("rope, append (K, V, ik), QSA, attend: a step's attention ops in order", () => {
  const n = 11, H = 4, Hkv = 2, hd = 32, rd = 16, theta = 1e4, Hi = 2, di = 16, topk = 4;
  const q = randomF32(n * H * hd, 1, 1, "q");
  const k = randomF32(n * Hkv * hd, 1, 1, "k");
  const v = randomF32(n * Hkv * hd, 1, 1, "v");
  const iq = randomF32(n * Hi * di, 1, 1, "iq");
  const iw = randomF32(n * Hi, 1, 1, "iw");
  const ik = randomF32(n * di, 1, 1, "ik");

  const setup = () => ({
    q: uploadF32(dev, q),
    k: uploadF32(dev, k),
    v: uploadF32(dev, v),
    iq: uploadF32(dev, iq),
    iw: uploadF32(dev, iw),
    ik: uploadF32(dev, ik),
    kc: allocateKvCache(dev, "q8", Hkv, hd, n),
    vc: allocateKvCache(dev, "q8", Hkv, hd, n),
    ikc: allocateKvCache(dev, "q8", 1, di, n),
    scores: outputF32(dev, n * n),
    list: outputI32(dev, n * topk),
    counts: outputI32(dev, n),
    o: outputF32(dev, n * H * hd),
  });
  type Bufs = ReturnType<typeof setup>;
  const step = (ctx: EncodeContext, b: Bufs, first: number, nb: number) => {
    const qr = rows(b.q, H * hd, first * H * hd * 4);
    const kr = rows(b.k, Hkv * hd, first * Hkv * hd * 4);
    encodeRope(ctx, { rows: nb, pos0: first, headDim: hd, rotDim: rd, theta, q: qr, qHeads: H, k: kr, kHeads: Hkv });
    encodeKvAppend(ctx, { rows: nb, pos0: first, x: kr, cache: b.kc });
    encodeKvAppend(ctx, { rows: nb, pos0: first, x: rows(b.v, Hkv * hd, first * Hkv * hd * 4), cache: b.vc });
    encodeKvAppend(ctx, { rows: nb, pos0: first, x: rows(b.ik, di, first * di * 4), cache: b.ikc });
    const list = { buffer: b.list, offset: first * topk * 4 };
    const counts = { buffer: b.counts, offset: first * 4 };
    encodeQsa(ctx, {
      rows: nb, pos0: first, topk, heads: Hi, iq: rows(b.iq, Hi * di, first * Hi * di * 4), iw: rows(b.iw, Hi, first * Hi * 4),
      ik: b.ikc, scores: rows(b.scores, n, first * n * 4), selected: list, counts,
    });
    encodeAttention(ctx, {
      rows: nb, pos0: first, heads: H, q: qr, k: b.kc, v: b.vc, o: rows(b.o, H * hd, first * H * hd * 4),
      selection: { list, counts, topk },
    });
  };

  test("prefill then decode equals token by token, bit for bit", () => {
    const batched = setup();
    run(dev, (ctx) => step(ctx, batched, 0, 8));
    for (let t = 8; t < n; t++) run(dev, (ctx) => step(ctx, batched, t, 1));
    const single = setup();
    run(dev, (ctx) => {
      for (let t = 0; t < n; t++) step(ctx, single, t, 1);
    });
    expectExact(batched.o.f32.subarray(0, n * H * hd), single.o.f32.subarray(0, n * H * hd), "o");
    expectExact(batched.list.i32.subarray(0, n * topk), single.list.i32.subarray(0, n * topk), "selected positions");
    expectExact((batched.kc.data as Buffer).bytes.subarray(0, n * Hkv * hd), (single.kc.data as Buffer).bytes.subarray(0, n * Hkv * hd), "K codes");
    expectExact((batched.ikc.data as Buffer).bytes.subarray(0, n * di), (single.ikc.data as Buffer).bytes.subarray(0, n * di), "ik codes");
  });

  test("matches the reference's attention rows (append first, QSA on the q8 index keys)", () => {
    const b = setup();
    run(dev, (ctx) => step(ctx, b, 0, n));
    const K = new KvCache("q8", Hkv, hd);
    const V = new KvCache("q8", Hkv, hd);
    const IK = new KvCache("q8", 1, di);
    const expected = new Float32Array(n * H * hd);
    for (let t = 0; t < n; t++) {
      const qt = q.slice(t * H * hd, (t + 1) * H * hd);
      const kt = k.slice(t * Hkv * hd, (t + 1) * Hkv * hd);
      for (let h = 0; h < H; h++) ropeNeox(qt.subarray(h * hd, (h + 1) * hd), t, rd, theta);
      for (let h = 0; h < Hkv; h++) ropeNeox(kt.subarray(h * hd, (h + 1) * hd), t, rd, theta);
      K.append(kt);
      V.append(v.subarray(t * Hkv * hd, (t + 1) * Hkv * hd));
      IK.append(ik.subarray(t * di, (t + 1) * di));
      const count = t + 1;
      const selected =
        count <= topk
          ? Array.from({ length: count }, (_, s) => s)
          : qsaSelect(qsaScores(iq.subarray(t * Hi * di, (t + 1) * Hi * di), iw.subarray(t * Hi, (t + 1) * Hi), IK.values.subarray(0, count * di), count, Hi, di), topk);
      expect(Array.from(b.list.i32.subarray(t * topk, t * topk + b.counts.i32[t]!))).toEqual(selected);
      for (let h = 0; h < H; h++)
        attendHead(qt.subarray(h * hd, (h + 1) * hd), K, V, Math.floor((h * Hkv) / H), selected, expected.subarray((t * H + h) * hd, (t * H + h + 1) * hd));
    }
    // ik codes: the kernel's q8 equals the reference's bit for bit.
    expectExact(new Int8Array((b.ikc.data as Buffer).bytes.buffer, (b.ikc.data as Buffer).bytes.byteOffset, n * di), IK.codes.subarray(0, n * di), "ik codes");
    // RoPE rounding (f32 vs f64) can move a K code by one q8 step (max/127): a q8-step tolerance.
    expectClose(b.o.f32.subarray(0, n * H * hd), expected, { abs: 2e-2 }, "attention-chain", hd);
  });
});
