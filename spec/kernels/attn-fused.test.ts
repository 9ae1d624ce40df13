// The attention mixer's fused kernels against the unfused ones they replace, bit for bit
// (same float operations in the same order): attn_prep (q/k per-head RMSNorm + RoPE + K/V
// appends, and QSA's index key normed and appended) against rms_norm_f32 x2 (x3) + rope_neox_f32
// + kv_append x2 (x3), and attention with the
// output gate (attn_rows' one-split epilogue, attn_combine_f32) against attention followed
// by ew_sigmoid_mul_f32.
import { afterAll, describe, expect, test } from "bun:test";

import {
  allocateKvCache,
  attentionPartialBytes,
  attentionSplits,
  encodeAttention,
  encodeAttnPrep,
  encodeKvAppend,
  encodeRope,
  type KvCacheRef,
} from "../../lib/gpu/attention.ts";
import { encodeElementwise } from "../../lib/gpu/elementwise.ts";
import { encodeRmsNorm } from "../../lib/gpu/norms.ts";
import type { Buffer } from "../../lib/shim.ts";
import { expectExact, hostTensor, openDevice, outputF32, randomF32, rows, run, uploadF32, uploadWeights } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());
const eps = 1e-6;

function normWeight(n: number, seed: number) {
  return uploadWeights(dev, { w: hostTensor(randomF32(n, seed, 0.5, "norm-w"), "f32", [n]) }).refs.w;
}

/** A cache whose every byte is a sentinel, so writes outside the appended slots show. */
function sentinelCache(kind: "q8" | "f32", heads: number, dim: number, capacity: number): KvCacheRef {
  const c = allocateKvCache(dev, kind, heads, dim, capacity);
  (c.data as Buffer).bytes.fill(0x5a);
  if (c.scales) (c.scales as Buffer).f32.fill(-1);
  return c;
}

const cacheBytes = (c: KvCacheRef) => (c.data as Buffer).bytes;
const cacheScales = (c: KvCacheRef) => (c.scales ? (c.scales as Buffer).f32 : new Float32Array(0));

interface PrepCase {
  kind: "q8" | "f32";
  nb: number;
  pos0: number;
  H: number;
  Hkv: number;
  hd: number;
  rd: number;
  centred: boolean;
  /** QSA index-key width: the key rides in the same dispatch. */
  di?: number;
}

describe("attn_prep: norms + RoPE + K/V appends in one dispatch", () => {
  const cases: PrepCase[] = [
    { kind: "q8", nb: 1, pos0: 700, H: 8, Hkv: 2, hd: 128, rd: 32, centred: true, di: 128 }, // decode, partial rotary, QSA
    { kind: "q8", nb: 1, pos0: 100_000, H: 4, Hkv: 1, hd: 256, rd: 256, centred: true, di: 0 }, // 8 values a lane, far position
    { kind: "q8", nb: 5, pos0: 3, H: 4, Hkv: 2, hd: 48, rd: 24, centred: false, di: 36 }, // pairs across lanes, uneven tail
    { kind: "q8", nb: 64, pos0: 0, H: 2, Hkv: 1, hd: 16, rd: 16, centred: true, di: 256 }, // prefill chunk, the widest key
    { kind: "f32", nb: 1, pos0: 37, H: 4, Hkv: 2, hd: 64, rd: 16, centred: true, di: 0 },
    { kind: "f32", nb: 5, pos0: 90, H: 6, Hkv: 3, hd: 80, rd: 40, centred: false, di: 32 },
  ];
  test.each(cases)("$kind nb $nb pos0 $pos0 H $H/$Hkv hd $hd rd $rd centred $centred di $di: identical q, k, index keys and caches", (c) => {
    const { nb, pos0, H, Hkv, hd, rd } = c;
    const theta = 1e6;
    const seed = nb * 7 + hd;
    // Row strides wider than the heads (the scratch rows are), and some zero vectors
    // (norm of 0, q8 scale 0).
    const [qw, kw, vw] = [H * hd + 8, Hkv * hd + 4, Hkv * hd + 12];
    const q = randomF32(nb * qw, seed, 2, "q");
    const k = randomF32(nb * kw, seed, 2, "k");
    const v = randomF32(nb * vw, seed, 3, "v");
    k.fill(0, 0, hd);
    v.fill(0, vw - 12 - hd, vw - 12);
    const qNorm = normWeight(hd, seed + 1);
    const kNorm = normWeight(hd, seed + 2);
    const cap = pos0 + nb + 2;
    const di = c.di ?? 0;
    const ikw = di + 4;
    const ik = randomF32(nb * ikw, seed, 2, "ik");
    const ikNorm = di ? normWeight(di, seed + 3) : null;

    // Unfused: the kernels the mixer used before.
    const q1 = uploadF32(dev, q), k1 = uploadF32(dev, k), v1 = uploadF32(dev, v), ik1 = uploadF32(dev, ik);
    const kc1 = sentinelCache(c.kind, Hkv, hd, cap), vc1 = sentinelCache(c.kind, Hkv, hd, cap);
    const ikc1 = di ? sentinelCache(c.kind, 1, di, cap) : null;
    run(dev, (ctx) => {
      if (ikc1) {
        encodeRmsNorm(ctx, rows(ik1, ikw), ikNorm!, rows(ik1, ikw), nb, eps, { centred: c.centred });
        encodeKvAppend(ctx, { rows: nb, pos0, x: rows(ik1, ikw), cache: ikc1 });
      }
      encodeRmsNorm(ctx, rows(q1, qw), qNorm, rows(q1, qw), nb, eps, { heads: H, centred: c.centred });
      encodeRmsNorm(ctx, rows(k1, kw), kNorm, rows(k1, kw), nb, eps, { heads: Hkv, centred: c.centred });
      encodeRope(ctx, { rows: nb, pos0, headDim: hd, rotDim: rd, theta, q: rows(q1, qw), qHeads: H, k: rows(k1, kw), kHeads: Hkv });
      encodeKvAppend(ctx, { rows: nb, pos0, x: rows(k1, kw), cache: kc1 });
      encodeKvAppend(ctx, { rows: nb, pos0, x: rows(v1, vw), cache: vc1 });
    });

    // Fused.
    const q2 = uploadF32(dev, q), k2 = uploadF32(dev, k), v2 = uploadF32(dev, v), ik2 = uploadF32(dev, ik);
    const kc2 = sentinelCache(c.kind, Hkv, hd, cap), vc2 = sentinelCache(c.kind, Hkv, hd, cap);
    const ikc2 = di ? sentinelCache(c.kind, 1, di, cap) : null;
    const before = dev.commandsEncoded;
    run(dev, (ctx) =>
      encodeAttnPrep(ctx, {
        rows: nb, pos0, rotDim: rd, theta, eps, centred: c.centred,
        q: rows(q2, qw), qHeads: H, k: rows(k2, kw), v: rows(v2, vw), qNorm, kNorm, kCache: kc2, vCache: vc2,
        ik: ikc2 ? { x: rows(ik2, ikw), norm: ikNorm!, cache: ikc2 } : undefined,
      }),
    );
    expect(dev.commandsEncoded - before).toBe(1);

    const label = `attn_prep ${c.kind} nb=${nb} hd=${hd}`;
    // q and k (padding columns included: untouched), bit for bit.
    expectExact(new Uint32Array(q2.f32.buffer, q2.f32.byteOffset, q.length), new Uint32Array(q1.f32.buffer, q1.f32.byteOffset, q.length), `${label} q`, qw);
    expectExact(new Uint32Array(k2.f32.buffer, k2.f32.byteOffset, k.length), new Uint32Array(k1.f32.buffer, k1.f32.byteOffset, k.length), `${label} k`, kw);
    // The whole cache buffers, sentinels around the appended slots included.
    expectExact(cacheBytes(kc2), cacheBytes(kc1), `${label} K data`, hd);
    expectExact(cacheBytes(vc2), cacheBytes(vc1), `${label} V data`, hd);
    expectExact(cacheScales(kc2), cacheScales(kc1), `${label} K scales`);
    expectExact(cacheScales(vc2), cacheScales(vc1), `${label} V scales`);
    if (ikc1 && ikc2) {
      expectExact(new Uint32Array(ik2.f32.buffer, ik2.f32.byteOffset, ik.length), new Uint32Array(ik1.f32.buffer, ik1.f32.byteOffset, ik.length), `${label} ik`, ikw);
      expectExact(cacheBytes(ikc2), cacheBytes(ikc1), `${label} ik data`, di);
      expectExact(cacheScales(ikc2), cacheScales(ikc1), `${label} ik scales`);
      // The key was appended at the last row's position, and nothing after it.
      if (c.kind === "q8") {
        expect(cacheScales(ikc2)[pos0 + nb - 1]).not.toBe(-1);
        expect(cacheScales(ikc2)[pos0 + nb]).toBe(-1);
      } else expect(ik2.f32[(nb - 1) * ikw]).not.toBe(ik[(nb - 1) * ikw]);
    }
    // The append wrote something (not sentinel) at the last row's slots and nothing after.
    const last = (pos0 + nb - 1) * Hkv;
    if (c.kind === "q8") {
      expect(cacheScales(kc2)[last]).not.toBe(-1);
      expect(cacheScales(vc2)[last + Hkv]).toBe(-1);
    } else {
      const sentinel = new Float32Array(new Uint8Array(4).fill(0x5a).buffer)[0];
      expect((kc2.data as Buffer).f32[last * hd]).not.toBe(sentinel);
      expect((vc2.data as Buffer).f32[(last + Hkv) * hd]).toBe(sentinel);
    }
  });

  test("bad shapes are refused with the reason", () => {
    const qb = uploadF32(dev, new Float32Array(64));
    const args = (over: object) => ({
      rows: 1, pos0: 0, rotDim: 16, theta: 1e4, eps, q: rows(qb, 32), qHeads: 2, k: rows(qb, 16), v: rows(qb, 16),
      qNorm: normWeight(16, 1), kNorm: normWeight(16, 2), kCache: allocateKvCache(dev, "q8", 1, 16, 4), vCache: allocateKvCache(dev, "q8", 1, 16, 4), ...over,
    });
    expect(() => run(dev, (ctx) => encodeAttnPrep(ctx, args({ vCache: allocateKvCache(dev, "f32", 1, 16, 4) })))).toThrow(/differ in kind/);
    expect(() => run(dev, (ctx) => encodeAttnPrep(ctx, args({ kNorm: normWeight(8, 3) })))).toThrow(/k norm: weight has 8 values, expected 16/);
    expect(() => run(dev, (ctx) => encodeAttnPrep(ctx, args({ rotDim: 15 })))).toThrow(/rotary dim 15/);
    expect(() => run(dev, (ctx) => encodeAttnPrep(ctx, args({ pos0: 4 })))).toThrow(/capacity 4/);
    const ik = (cache: KvCacheRef, n = 16) => ({ ik: { x: rows(qb, 16), norm: normWeight(n, 4), cache } });
    expect(() => run(dev, (ctx) => encodeAttnPrep(ctx, args(ik(allocateKvCache(dev, "f32", 1, 16, 4)))))).toThrow(/index-key cache \(f32, 1 heads of 16\) needs the K cache's kind/);
    expect(() => run(dev, (ctx) => encodeAttnPrep(ctx, args(ik(allocateKvCache(dev, "q8", 1, 16, 4), 8))))).toThrow(/ik norm: weight has 8 values, expected 16/);
    expect(() => run(dev, (ctx) => encodeAttnPrep(ctx, args({ pos0: 2, ...ik(allocateKvCache(dev, "q8", 1, 16, 2)) })))).toThrow(/index-key cache capacity 2/);
  });
});

interface GateCase {
  kind: "q8" | "f32";
  nb: number;
  pos0: number;
  H: number;
  Hkv: number;
  hd: number;
  splitLen?: number;
}

describe("attention with the output gate: attention then sigmoid_mul, bit for bit", () => {
  const cases: GateCase[] = [
    { kind: "q8", nb: 1, pos0: 30, H: 4, Hkv: 2, hd: 32 }, // decode, one split: attn_rows' epilogue
    { kind: "q8", nb: 1, pos0: 300, H: 4, Hkv: 2, hd: 128 }, // decode, 5 splits: attn_combine_f32
    { kind: "q8", nb: 5, pos0: 10, H: 4, Hkv: 2, hd: 48 }, // prefill rows, one split
    { kind: "q8", nb: 5, pos0: 10, H: 4, Hkv: 2, hd: 32, splitLen: 4 }, // many splits, empty ones
    { kind: "f32", nb: 3, pos0: 70, H: 2, Hkv: 1, hd: 16 },
    { kind: "f32", nb: 1, pos0: 200, H: 2, Hkv: 1, hd: 16, splitLen: 64 },
  ];
  test.each(cases.map((c) => ({ ...c, split: c.splitLen ?? "auto" })))("$kind nb $nb pos0 $pos0 hd $hd split $split", (c) => {
    const { nb, pos0, H, Hkv, hd } = c;
    const seed = 3 * nb + pos0;
    const len = pos0 + nb;
    const kc = allocateKvCache(dev, c.kind, Hkv, hd, len);
    const vc = allocateKvCache(dev, c.kind, Hkv, hd, len);
    const kx = uploadF32(dev, randomF32(len * Hkv * hd, seed, 1.5, "k"));
    const vx = uploadF32(dev, randomF32(len * Hkv * hd, seed, 1, "v"));
    run(dev, (ctx) => {
      encodeKvAppend(ctx, { rows: len, pos0: 0, x: rows(kx, Hkv * hd), cache: kc });
      encodeKvAppend(ctx, { rows: len, pos0: 0, x: rows(vx, Hkv * hd), cache: vc });
    });
    const width = H * hd;
    const qb = uploadF32(dev, randomF32(nb * width, seed, 1.5, "q"));
    const gate = randomF32(nb * (width + 4), seed, 4, "gate");
    gate[1] = 100; // sigmoid saturates at both ends
    gate[2] = -100;
    const gb = uploadF32(dev, gate);
    const base = { rows: nb, pos0, heads: H, splitLen: c.splitLen };
    const { splits } = attentionSplits(base);
    const partials = splits > 1 ? dev.buffer(attentionPartialBytes(nb, H, hd, splits)) : undefined;
    const o1 = outputF32(dev, nb * width);
    const o2 = outputF32(dev, nb * width);
    run(dev, (ctx) => {
      encodeAttention(ctx, { ...base, q: rows(qb, width), k: kc, v: vc, o: rows(o1, width), partials });
      encodeElementwise(ctx, "sigmoid_mul", rows(o1, width), rows(gb, width + 4), rows(o1, width), nb, width);
    });
    const before = dev.commandsEncoded;
    run(dev, (ctx) => encodeAttention(ctx, { ...base, q: rows(qb, width), k: kc, v: vc, o: rows(o2, width), partials, gate: rows(gb, width + 4) }));
    expect(dev.commandsEncoded - before).toBe(splits > 1 ? 2 : 1);
    if (nb === 1 && pos0 >= 64 && !c.splitLen) expect(splits).toBeGreaterThan(1);
    const n = nb * width + 16; // the guard after the rows too
    expectExact(new Uint32Array(o2.f32.buffer, o2.f32.byteOffset, n), new Uint32Array(o1.f32.buffer, o1.f32.byteOffset, n), `gated attention ${c.kind} nb=${nb}`, hd);
    expect(o2.f32.subarray(0, nb * width).some((x) => x !== 0)).toBe(true);
  });
});
