// Kernels at the shapes of the real checkpoints (issue 23 item 2): the other kernel tests stop
// at head_dim 48 and a few dozen experts; here the 30b-a3b and 80b-a3b presets' own dimensions
// (lib/convert/presets.ts) run through the same kernels against lib/reference: RoPE and KV append
// at head_dim 256, attention 16/2 and 32/4 heads in q8 and f32 caches up to position 700 and
// over a QSA selection of 2048 positions, the router and expert lists at 512 experts top-10, and
// a whole q4 MoE at hidden 2048 with 512 experts of width 512 and a shared expert (80b) and 128
// experts of width 768 without one (30b). Sized to stay a few seconds on a loaded 2-core machine.
import { afterAll, describe, expect, test } from "bun:test";

import { presetConfig } from "../../lib/convert/presets.ts";
import { allocateKvCache, attentionPartialBytes, attentionSplits, encodeAttention, encodeKvAppend, encodeRope, type KvCacheRef } from "../../lib/gpu/attention.ts";
import { encodeExpertLists, encodeMoeCombine, encodeRouter, encodeRouterTopK, encodeRoutedExperts, encodeSharedExpert, type ExpertPool } from "../../lib/gpu/experts.ts";
import type { ModelConfig } from "../../lib/model/config.ts";
import { PART_ALIGN } from "../../lib/model/manifest.ts";
import { attendHead } from "../../lib/reference/attention.ts";
import { KvCache } from "../../lib/reference/kvcache.ts";
import { moeRow, routerTopK, type MoeWeights } from "../../lib/reference/moe.ts";
import { matvec, ropeNeox } from "../../lib/reference/ops.ts";
import type { Buffer } from "../../lib/shim.ts";
import { expectClose, expectExact, hostTensor, openDevice, outputF32, outputI32, randomF32, randomTokens, readF32, readI32, rng, rows, run, uploadF32, uploadI32, uploadWeights, type HostTensor } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

const SHAPES = { "80b": presetConfig("80b-a3b-shape"), "30b": presetConfig("30b-a3b-shape") } as const;
type ShapeName = keyof typeof SHAPES;
const attn = (s: ShapeName) => SHAPES[s].attention;

// ---- RoPE and KV append at head_dim 256 ------------------------------------------------------

describe("rope and kv_append at the real head shapes", () => {
  test.each(Object.keys(SHAPES) as ShapeName[])("%s: partial RoPE, theta 1e7, then q8 append", (s) => {
    const a = attn(s);
    const nb = 3, pos0 = 4000, hd = a.head_dim, rd = Math.round(hd * a.partial_rotary_factor);
    const q = randomF32(nb * a.heads * hd, 1, 1, "q");
    const k = randomF32(nb * a.kv_heads * hd, 2, 1, "k");
    const qb = uploadF32(dev, q);
    const kb = uploadF32(dev, k);
    const cache = allocateKvCache(dev, "q8", a.kv_heads, hd, pos0 + nb);
    run(dev, (ctx) => {
      encodeRope(ctx, { rows: nb, pos0, headDim: hd, rotDim: rd, theta: a.rope_theta, q: rows(qb, a.heads * hd), qHeads: a.heads, k: rows(kb, a.kv_heads * hd), kHeads: a.kv_heads });
      encodeKvAppend(ctx, { rows: nb, pos0, x: rows(kb, a.kv_heads * hd), cache });
    });
    for (let t = 0; t < nb; t++) {
      for (let h = 0; h < a.heads; h++) ropeNeox(q.subarray((t * a.heads + h) * hd, (t * a.heads + h + 1) * hd), pos0 + t, rd, a.rope_theta);
      for (let h = 0; h < a.kv_heads; h++) ropeNeox(k.subarray((t * a.kv_heads + h) * hd, (t * a.kv_heads + h + 1) * hd), pos0 + t, rd, a.rope_theta);
    }
    expectClose(qb.f32.subarray(0, q.length), q, { abs: 1e-6 }, `rope-${s} q`, hd);
    expectClose(kb.f32.subarray(0, k.length), k, { abs: 1e-6 }, `rope-${s} k`, hd);
    // The codes of the rotated keys: the kernel's q8 of its own rotated k equals the reference's of the same values.
    const ref = new KvCache("q8", a.kv_heads, hd);
    const zero = new Float32Array(a.kv_heads * hd);
    for (let p = 0; p < pos0; p++) ref.append(zero);
    for (let t = 0; t < nb; t++) ref.append(kb.f32.subarray(t * a.kv_heads * hd, (t + 1) * a.kv_heads * hd));
    const w = a.kv_heads * hd;
    const data = cache.data as Buffer;
    expectExact(new Int8Array(data.bytes.buffer, data.bytes.byteOffset + pos0 * w, nb * w), ref.codes.subarray(pos0 * w, (pos0 + nb) * w), `q8 codes ${s}`, hd);
    expectExact((cache.scales as Buffer).f32.subarray(pos0 * a.kv_heads, (pos0 + nb) * a.kv_heads), ref.scales.subarray(pos0 * a.kv_heads, (pos0 + nb) * a.kv_heads), `q8 scales ${s}`);
  });
});

// ---- attention ---------------------------------------------------------------------------------

function cacheOf(kind: "q8" | "f32", heads: number, dim: number, length: number, seed: number, scale: number): KvCache {
  const c = new KvCache(kind, heads, dim);
  const x = randomF32(length * heads * dim, seed, scale, "cache");
  for (let p = 0; p < length; p++) c.append(x.subarray(p * heads * dim, (p + 1) * heads * dim));
  return c;
}

function upload(ref: KvCache, capacity: number): KvCacheRef {
  const c = allocateKvCache(dev, ref.kind, ref.heads, ref.dim, capacity);
  const n = ref.length * ref.heads * ref.dim;
  if (ref.kind === "q8") {
    (c.data as Buffer).bytes.set(new Uint8Array(ref.codes.buffer, 0, n));
    (c.scales as Buffer).f32.set(ref.scales.subarray(0, ref.length * ref.heads));
  } else (c.data as Buffer).f32.set(ref.values.subarray(0, n));
  return c;
}

interface AttnCase {
  shape: ShapeName;
  kind: "q8" | "f32";
  nb: number;
  pos0: number;
  /** A QSA selection of this many positions per row (the preset's topk); 0: causal. */
  topk: number;
}

// The same bound as spec/kernels/attention.test.ts: f32 online softmax and dot products (here
// over 256 terms) against the reference's f64.
const ATTN_TOL = { abs: 2e-6, rel: 1e-5 };

describe("attention at the real head shapes", () => {
  const cases: AttnCase[] = [
    { shape: "80b", kind: "q8", nb: 1, pos0: 700, topk: 0 },
    { shape: "80b", kind: "f32", nb: 1, pos0: 700, topk: 0 },
    { shape: "80b", kind: "q8", nb: 5, pos0: 90, topk: 0 },
    { shape: "80b", kind: "q8", nb: 1, pos0: 2500, topk: SHAPES["80b"].attention.qsa!.topk },
    { shape: "30b", kind: "q8", nb: 1, pos0: 700, topk: 0 },
    { shape: "30b", kind: "f32", nb: 3, pos0: 200, topk: 0 },
  ];
  test.each(cases)("$shape $kind, nb $nb, pos0 $pos0, topk $topk", (c) => {
    const a = attn(c.shape);
    const { nb, pos0 } = c;
    const [H, Hkv, hd] = [a.heads, a.kv_heads, a.head_dim];
    const seed = nb + pos0;
    const K = cacheOf(c.kind, Hkv, hd, pos0 + nb, seed, 1.5);
    const V = cacheOf(c.kind, Hkv, hd, pos0 + nb, seed + 1, 1);
    const q = randomF32(nb * H * hd, seed, 1.5, "q");
    const r = rng(seed, "selection");
    const selection = Array.from({ length: nb }, (_, t) => {
      const count = pos0 + t + 1;
      if (!c.topk || count <= c.topk) return Array.from({ length: count }, (_, s) => s);
      const chosen = new Set<number>([pos0 + t]);
      while (chosen.size < c.topk) chosen.add(r.int(count));
      return [...chosen].sort((x, y) => x - y);
    });
    const expected = new Float32Array(nb * H * hd);
    for (let t = 0; t < nb; t++)
      for (let h = 0; h < H; h++) {
        const off = (t * H + h) * hd;
        attendHead(q.subarray(off, off + hd), K, V, Math.floor((h * Hkv) / H), selection[t]!, expected.subarray(off, off + hd));
      }
    let sel: { list: Buffer; counts: Buffer; topk: number } | undefined;
    if (c.topk) {
      const list = outputI32(dev, nb * c.topk);
      const counts = outputI32(dev, nb);
      selection.forEach((s, t) => {
        list.i32.set(s, t * c.topk!);
        counts.i32[t] = s.length;
      });
      sel = { list, counts, topk: c.topk };
    }
    const qb = uploadF32(dev, q);
    const o = outputF32(dev, nb * H * hd);
    const base = { rows: nb, pos0, heads: H, selection: sel };
    const { splits } = attentionSplits(base);
    const partials = splits > 1 ? dev.buffer(attentionPartialBytes(nb, H, hd, splits)) : undefined;
    run(dev, (ctx) => encodeAttention(ctx, { ...base, q: rows(qb, H * hd), k: upload(K, pos0 + nb), v: upload(V, pos0 + nb), o: rows(o, H * hd), partials }));
    if (nb === 1 && !c.topk) expect(splits).toBeGreaterThan(1); // decode: the split path and its combine
    expectClose(o.f32.subarray(0, nb * H * hd), expected, ATTN_TOL, `attention-${c.shape} ${c.kind} nb=${nb}`, hd);
  });
});

// ---- router and expert lists at 512 experts -----------------------------------------------------

// Softmax in f32 against f64: a few ulps (spec/kernels/moe.test.ts).
const WEIGHT_TOL = { rel: 2e-6, abs: 1e-7 };

describe("router top-k and expert lists at the real expert counts", () => {
  const cases = (Object.keys(SHAPES) as ShapeName[]).flatMap((s) => [1, 7, 64].map((nb) => [s, nb] as const));
  test.each(cases)("%s, nb %i", (s, nb) => {
    const { experts: E, top_k: k, norm_topk_prob: norm } = SHAPES[s].moe;
    const r = rng(nb * E, "logits");
    // On a grid of 1/16 so that ties are common: ranks must take the lower id.
    const logits = Float32Array.from({ length: nb * E }, () => Math.round(r.symmetric() * 96) / 16);
    const ids = outputI32(dev, nb * k);
    const weights = outputF32(dev, nb * k);
    const lists = { offsets: outputI32(dev, E + 1), pairs: outputI32(dev, nb * k), active: outputI32(dev, E + 1) };
    run(dev, (ctx) => {
      encodeRouterTopK(ctx, rows(uploadF32(dev, logits), E), { ids, weights }, nb, { experts: E, top_k: k, norm_topk_prob: norm });
      encodeExpertLists(ctx, ids, lists, nb, k, E);
    });
    const want = Array.from({ length: nb }, (_, row) => routerTopK(logits.subarray(row * E, (row + 1) * E), k, norm));
    const gotIds = readI32(ids, nb * k);
    expectExact(gotIds, want.flatMap((w) => w.experts), `router ids ${s} nb=${nb}`, k);
    expectClose(readF32(weights, nb * k), want.flatMap((w) => w.weights), WEIGHT_TOL, `router-${s} weights nb=${nb}`, k);
    const off = readI32(lists.offsets, E + 1);
    const pairs = readI32(lists.pairs, nb * k);
    for (let e = 0; e < E; e++) {
      const seg = Array.from(pairs.subarray(off[e]!, off[e + 1]!)).sort((x, y) => x - y);
      expectExact(seg, [...gotIds.keys()].filter((p) => gotIds[p] === e), `lists ${s} expert ${e}`);
    }
    expect(off[E]).toBe(nb * k);
    const used = [...new Set(gotIds)].sort((x, y) => x - y);
    expectExact(readI32(lists.active, used.length + 1), [used.length, ...used], `active experts ${s}`);
  });
});

// ---- the whole q4 MoE -------------------------------------------------------------------------

/**
 * A whole MoE of nb rows at a preset's dimensions with q4 records: router (bf16), lists, the
 * routed experts read through a slot table from a pool holding only the experts the rows use
 * (at slots that are not their ids: 512 records of 1.5 MiB would be most of a gigabyte),
 * the shared expert when the preset has one, and the combine.
 */
function runMoe(s: ShapeName, nb: number) {
  const c = SHAPES[s];
  const d = c.hidden_size;
  const { experts: E, top_k: k, intermediate: I, shared_intermediate: SI } = c.moe;
  const router = hostTensor(randomF32(E * d, 7, 0.5, "router"), "bf16", [E, d]);
  const x = randomF32(nb * d, nb + 1, 1.5, "moe-x");
  // The rows' experts, from the reference's router, decide which records the pool holds.
  const routed = [...new Set(Array.from({ length: nb }, (_, r) => routerTopK(matvec(router.values, x.subarray(r * d, (r + 1) * d), new Float32Array(E), E, d), k, true).experts).flat())];
  const shapes = { gate: [I, d], up: [I, d], down: [d, I] } as const;
  const names = Object.keys(shapes) as (keyof typeof shapes)[];
  const records = new Map<number, Record<keyof typeof shapes, HostTensor>>();
  for (const e of routed)
    records.set(e, Object.fromEntries(names.map((n) => [n, hostTensor(randomF32(shapes[n][0] * shapes[n][1], 100 + e, 0.3, `expert-${n}`), "q4", shapes[n])])) as Record<keyof typeof shapes, HostTensor>);
  const align = (v: number) => Math.ceil(v / PART_ALIGN) * PART_ALIGN;
  let cursor = 0;
  const parts = names.map((name) => {
    const offset = align(cursor);
    cursor = offset + records.get(routed[0]!)![name].bytes.byteLength;
    return { name, dtype: "q4" as const, shape: shapes[name], offset };
  });
  const stride = align(cursor);
  const slots = routed.length + 1;
  const buffer = dev.buffer(stride * slots);
  buffer.bytes.fill(0xff); // slot 0 is never mapped: garbage that must not be read
  const slotOf = new Array<number>(E).fill(-1);
  routed.forEach((e, i) => {
    slotOf[e] = slots - 1 - i;
    for (const p of parts) buffer.bytes.set(records.get(e)![p.name].bytes, slotOf[e]! * stride + p.offset);
  });
  const pool: ExpertPool = { buffers: [buffer], slotsPerBuffer: slots, slots, stride, parts };
  const dense: Record<string, HostTensor> = { router };
  if (SI > 0) {
    dense.gate = hostTensor(randomF32(SI * d, 8, 0.3, "sg"), "q4", [SI, d]);
    dense.up = hostTensor(randomF32(SI * d, 9, 0.3, "su"), "q4", [SI, d]);
    dense.down = hostTensor(randomF32(d * SI, 10, 0.3, "sd"), "q4", [d, SI]);
    dense.expertGate = hostTensor(randomF32(d, 11, 0.5, "seg"), "bf16", [1, d]);
  }
  const { refs } = uploadWeights(dev, dense);
  const xb = uploadF32(dev, x);
  const input = rows(xb, d);
  const ids = outputI32(dev, nb * k);
  const weights = outputF32(dev, nb * k);
  const lists = { offsets: outputI32(dev, E + 1), pairs: outputI32(dev, nb * k), active: outputI32(dev, E + 1) };
  const scratch = { h: rows(outputF32(dev, nb * k * I), I), o: rows(outputF32(dev, nb * k * d), d) };
  const shared =
    SI > 0 ? { h: rows(outputF32(dev, nb * SI), SI), s: rows(outputF32(dev, nb * d), d), sg: rows(outputF32(dev, nb), 1) } : undefined;
  const y = outputF32(dev, nb * d);
  const cfg = { experts: E, top_k: k, norm_topk_prob: true };
  run(dev, (ctx) => {
    encodeRouter(ctx, refs.router!, input, rows(outputF32(dev, nb * E), E), { ids, weights }, nb, cfg);
    encodeExpertLists(ctx, ids, lists, nb, k, E);
    encodeRoutedExperts(ctx, pool, uploadI32(dev, slotOf), lists, input, scratch, nb, k, E);
    if (shared) encodeSharedExpert(ctx, { gate: refs.gate!, up: refs.up!, down: refs.down!, expertGate: refs.expertGate! }, input, shared, nb);
    encodeMoeCombine(ctx, weights, scratch.o, rows(y, d), nb, k, d, shared);
  });
  const mw: MoeWeights = {
    router: router.values,
    shared: SI > 0 ? { gate: dense.gate!.values, up: dense.up!.values, down: dense.down!.values, expertGate: dense.expertGate!.values } : null,
  };
  const config = { hidden_size: d, moe: { ...c.moe, norm_topk_prob: true } } as ModelConfig;
  const expert = (e: number) => {
    const rec = records.get(e);
    if (!rec) throw new Error(`test setup: expert ${e} is not in the pool`);
    return { gate: rec.gate.values, up: rec.up.values, down: rec.down.values };
  };
  const ref = Array.from({ length: nb }, (_, r) => moeRow(mw, config, expert, x.subarray(r * d, (r + 1) * d)));
  return { y: readF32(y, nb * d), ids: readI32(ids, nb * k), ref, d, k };
}

// As spec/kernels/moe.test.ts: y sums k + 1 expert outputs, each two chained f32 dot products,
// here over 2048 then 512 or 768 terms: errors of ~1e-6 relative to the largest output.
const MOE_TOL = { abs: 1e-5, relMax: 2e-5 };

describe("whole q4 MoE at the real expert shapes", () => {
  test.each([["80b", 2], ["30b", 1]] as const)("%s, nb %i", (s, nb) => {
    const { y, ids, ref, d, k } = runMoe(s, nb);
    expectExact(ids, ref.flatMap((r) => r.routing.experts), `router ids ${s}`, k);
    const want = new Float32Array(nb * d);
    ref.forEach((r, i) => want.set(r.y, i * d));
    expectClose(y, want, MOE_TOL, `moe-${s} q4 nb=${nb}`, d);
  });
});
