// The reference's elementary operations: Sinkhorn, hyper-connections with n = 1, q8, top-k
// ties, the PLE hash, RoPE, softplus.
import { describe, expect, test } from "bun:test";
import { parseConfig } from "../../lib/model/config.ts";
import { presetConfig } from "../../lib/convert/presets.ts";
import { Rng } from "../../lib/model/rng.ts";
import {
  argmax,
  dequantizeQ8,
  hcFinalRead,
  KvCache,
  pleRowIndex,
  pleRows,
  quantizeQ8,
  residualSite,
  rmsNorm,
  ropeNeox,
  routerTopK,
  sinkhorn,
  softplus,
  topKIndices,
  topTwoMargin,
} from "../../lib/reference/index.ts";
import { maxAbsDiff, randomArray } from "./fixtures.ts";

describe("sinkhorn", () => {
  const sums = (m: Float32Array, n: number) => {
    const rows = new Array(n).fill(0);
    const cols = new Array(n).fill(0);
    for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) (rows[i] += m[i * n + j]!), (cols[j] += m[i * n + j]!);
    return { rows, cols };
  };

  test("rows and columns of comb sum to ~1 after enough iterations", () => {
    const rng = new Rng(7, "sinkhorn");
    // Moderate logits (the model's range) settle within 20 rounds; wide ones need more.
    for (const [spread, iters] of [[1, 20], [2, 20], [4, 200]] as const) {
      for (const n of [2, 4, 6]) {
        const comb = sinkhorn(randomArray(rng, n * n, spread), n, iters, 1e-6);
        const { rows, cols } = sums(comb, n);
        for (const s of [...rows, ...cols]) expect(Math.abs(s - 1)).toBeLessThan(1e-3);
        for (const v of comb) expect(v).toBeGreaterThan(0);
      }
    }
  });

  test("one iteration balances columns only; more iterations balance rows too", () => {
    const rng = new Rng(8, "sinkhorn");
    const n = 4;
    const logits = randomArray(rng, n * n, 4);
    const once = sums(sinkhorn(logits, n, 1, 1e-6), n);
    for (const s of once.cols) expect(Math.abs(s - 1)).toBeLessThan(1e-5);
    expect(Math.max(...once.rows.map((s) => Math.abs(s - 1)))).toBeGreaterThan(1e-2);
    const many = sums(sinkhorn(logits, n, 50, 1e-6), n);
    expect(Math.max(...many.rows.map((s) => Math.abs(s - 1)))).toBeLessThan(1e-4);
  });
});

describe("hyper-connections with n = 1", () => {
  const d = 32;
  const eps = 1e-6;
  const rng = new Rng(3, "hc1");
  const norm = randomArray(rng, d, 0.1);
  const W = randomArray(rng, d * d, 0.3);
  // A sub-layer: y = W x per row.
  const sub = (nb: number) => (xs: Float32Array) => {
    const ys = new Float32Array(nb * d);
    for (let b = 0; b < nb; b++)
      for (let r = 0; r < d; r++) {
        let acc = 0;
        for (let c = 0; c < d; c++) acc += W[r * d + c]! * xs[b * d + c]!;
        ys[b * d + r] = acc;
      }
    return ys;
  };
  // X + F(RMSNorm(X)), written out by hand.
  const plain = (X: Float32Array, nb: number) => {
    const xs = new Float32Array(nb * d);
    for (let b = 0; b < nb; b++) {
      let ss = 0;
      for (let c = 0; c < d; c++) ss += X[b * d + c]! ** 2;
      const r = 1 / Math.sqrt(ss / d + eps);
      for (let c = 0; c < d; c++) xs[b * d + c] = X[b * d + c]! * r * (1 + norm[c]!);
    }
    const ys = sub(nb)(xs);
    return X.map((v, i) => v + ys[i]!);
  };

  test("a site without hc weights is the plain pre-norm residual", () => {
    const nb = 3;
    const X = randomArray(rng, nb * d, 2);
    const expected = plain(X, nb);
    residualSite(X, nb, d, { streams: 1, eps, sinkhorn_iters: 20 }, null, norm, eps, sub(nb));
    expect(maxAbsDiff(X, expected)).toBeLessThan(1e-5);
  });

  test("the mHC formulas with n = 1 and pre = post = comb = 1 reduce to the plain residual", () => {
    const nb = 3;
    const X = randomArray(rng, nb * d, 2);
    const expected = plain(X, nb);
    // fn = 0 makes every mix 0: pre = sigmoid(40) + eps ~ 1, post = 2 sigmoid(0) = 1, comb = 1.
    const site = { fn: new Float32Array(3 * d), base: new Float32Array([40, 0, 0]), scale: new Float32Array([1, 1, 1]) };
    residualSite(X, nb, d, { streams: 1, eps, sinkhorn_iters: 20 }, site, norm, eps, sub(nb));
    expect(maxAbsDiff(X, expected)).toBeLessThan(1e-4);
  });

  test("the final read with n = 1 is the stream itself", () => {
    const X = randomArray(rng, d);
    expect(Array.from(hcFinalRead(X, 1, d, null, eps))).toEqual(Array.from(X));
  });
});

describe("q8", () => {
  test("dequantized error is at most scale / 2, scale = max|x| / 127", () => {
    const rng = new Rng(11, "q8");
    for (let trial = 0; trial < 20; trial++) {
      const x = randomArray(rng, 64, 0.1 + trial);
      const q = new Int8Array(64);
      const scale = quantizeQ8(x, q);
      let m = 0;
      for (const v of x) m = Math.max(m, Math.abs(v));
      expect(scale).toBeCloseTo(m / 127, 6);
      const back = dequantizeQ8(q, scale);
      for (let i = 0; i < 64; i++) expect(Math.abs(back[i]! - x[i]!)).toBeLessThanOrEqual(scale / 2 + 1e-6 * m);
      expect(Math.max(...Array.from(q, Math.abs))).toBe(127);
    }
  });

  test("an all-zero vector stays zero (scale 0)", () => {
    const q = new Int8Array(8);
    expect(quantizeQ8(new Float32Array(8), q)).toBe(0);
    expect(Array.from(dequantizeQ8(q, 0))).toEqual(new Array(8).fill(0));
  });

  test("halves round away from zero", () => {
    const q = new Int8Array(3);
    quantizeQ8(new Float32Array([127, 0.5, -0.5]), q); // scale 1
    expect(Array.from(q)).toEqual([127, 1, -1]);
  });

  test("a q8 cache reads back within the bound, an f32 cache exactly", () => {
    const rng = new Rng(12, "kv");
    const q8 = new KvCache("q8", 2, 16);
    const f32 = new KvCache("f32", 2, 16);
    const xs = Array.from({ length: 5 }, () => randomArray(rng, 32, 3));
    for (const x of xs) q8.append(x), f32.append(x);
    xs.forEach((x, p) => {
      for (let h = 0; h < 2; h++) {
        const want = x.subarray(h * 16, (h + 1) * 16);
        expect(Array.from(f32.vector(p, h))).toEqual(Array.from(want));
        const bound = Math.max(...Array.from(want, Math.abs)) / 254 + 1e-6;
        expect(maxAbsDiff(q8.vector(p, h), want)).toBeLessThanOrEqual(bound);
      }
    });
    q8.truncate(2);
    expect(() => q8.vector(2, 0)).toThrow(/not cached/);
  });
});

describe("top-k and argmax ties", () => {
  test("topKIndices ranks by value, equal values by lower index", () => {
    expect(topKIndices([1, 5, 5, 2, 5], 2)).toEqual([1, 2]);
    expect(topKIndices([1, 5, 5, 2, 5], 4)).toEqual([1, 2, 4, 3]);
    expect(topKIndices([0, 0, 0], 2)).toEqual([0, 1]);
  });

  test("the MoE router gives ties to the lower expert and normalises the weights", () => {
    const r = routerTopK(new Float32Array([1, 3, 3, 0, 3]), 2, true);
    expect(r.experts).toEqual([1, 2]);
    expect(r.weights[0]).toBeCloseTo(0.5, 6);
    expect(r.weights[1]).toBeCloseTo(0.5, 6);
    const raw = routerTopK(new Float32Array([0, 2, 1, 2]), 3, false);
    expect(raw.experts).toEqual([1, 3, 2]);
    const z = Math.exp(0) + 2 * Math.exp(2) + Math.exp(1);
    expect(raw.weights[0]).toBeCloseTo(Math.exp(2) / z, 6);
    expect(raw.weights[2]).toBeCloseTo(Math.exp(1) / z, 6);
  });

  test("argmax takes the lowest id on ties; the margin is then 0", () => {
    expect(argmax([0, 3, 1, 3])).toBe(1);
    expect(topTwoMargin([0, 3, 1, 3])).toBe(0);
    expect(topTwoMargin([0, 3, 1, 2.5])).toBeCloseTo(0.5, 9);
  });
});

describe("PLE n-gram hash", () => {
  // imul as u32 through BigInt, independently of Math.imul.
  const mul32 = (a: number, b: number) => Number((BigInt(a) * BigInt(b)) & 0xffffffffn);

  test("matches a hand computation, with the pad id before the sequence start", () => {
    const raw = structuredClone(presetConfig("tiny")) as Record<string, unknown> & { ple: Record<string, unknown> };
    raw.ple = { ...raw.ple, orders: [2, 3], heads: 1, rows: [[97], [101]], mult: [[[3, 0x9e3779b1]], [[5, 7, 0xfffffffd]]], pad_id: 11 };
    const config = parseConfig(raw);
    const tokens = [300, 7, 9];
    const row = (t: number, mult: number[], rows: number) => {
      let mix = 0;
      mult.forEach((m, i) => {
        mix = (mix ^ mul32(t - i < 0 ? 11 : tokens[t - i]!, m)) >>> 0;
      });
      return mix % rows;
    };
    // t = 0: order 2 uses (300, pad); order 3 uses (300, pad, pad).
    expect(pleRows(config, tokens, 0)).toEqual([[row(0, [3, 0x9e3779b1], 97)], [row(0, [5, 7, 0xfffffffd], 101)]]);
    expect(pleRows(config, tokens, 2)).toEqual([[row(2, [3, 0x9e3779b1], 97)], [row(2, [5, 7, 0xfffffffd], 101)]]);
    // A fully hand-written case: (7 * 3) ^ (300 * 0x9e3779b1 mod 2^32), mod 97.
    const mix = (21 ^ mul32(300, 0x9e3779b1)) >>> 0;
    expect(pleRowIndex(tokens, 1, [3, 0x9e3779b1], 11, 97)).toBe(mix % 97);
    expect(pleRowIndex(tokens, 0, [3, 0x9e3779b1], 11, 97)).toBe(((900 ^ mul32(11, 0x9e3779b1)) >>> 0) % 97);
  });
});

describe("rope and small functions", () => {
  test("RoPE rotates pairs (i, i + rd/2) of the first rd dims and keeps the rest", () => {
    const x = new Float32Array([1, 2, 3, 4, 5, 6]);
    const y = x.slice();
    ropeNeox(y, 0, 4, 10000);
    expect(Array.from(y)).toEqual(Array.from(x));
    ropeNeox(y, 3, 4, 10000);
    // pair (0, 2) turns by 3 rad, pair (1, 3) by 3 * 10000^(-1/2).
    const a0 = 3;
    const a1 = 3 * Math.pow(10000, -0.5);
    expect(y[0]).toBeCloseTo(1 * Math.cos(a0) - 3 * Math.sin(a0), 5);
    expect(y[2]).toBeCloseTo(3 * Math.cos(a0) + 1 * Math.sin(a0), 5);
    expect(y[1]).toBeCloseTo(2 * Math.cos(a1) - 4 * Math.sin(a1), 5);
    expect(y[3]).toBeCloseTo(4 * Math.cos(a1) + 2 * Math.sin(a1), 5);
    expect([y[4], y[5]]).toEqual([5, 6]);
  });

  test("softplus is stable at both ends", () => {
    expect(softplus(0)).toBeCloseTo(Math.log(2), 12);
    expect(softplus(1000)).toBe(1000);
    expect(softplus(-1000)).toBeGreaterThanOrEqual(0);
    expect(softplus(-1000)).toBeLessThan(1e-300);
  });

  test("rmsNorm is zero-centred by default and plain on request", () => {
    const x = new Float32Array([3, 4]);
    const w = new Float32Array([0.5, -0.5]);
    const r = 1 / Math.sqrt(12.5 + 1e-6);
    const centred = rmsNorm(x, w, 1e-6);
    expect(centred[0]).toBeCloseTo(3 * r * 1.5, 6);
    expect(centred[1]).toBeCloseTo(4 * r * 0.5, 6);
    const plain = rmsNorm(x, w, 1e-6, { zeroCentred: false });
    expect(plain[1]).toBeCloseTo(4 * r * -0.5, 6);
  });
});
