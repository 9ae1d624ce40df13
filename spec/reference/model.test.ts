// Whole-model invariants of the reference: row batches = token by token, QSA selection,
// q8 vs f32 KV, the feature-off presets, bad token ids.
import { describe, expect, test } from "bun:test";
import { presetConfig } from "../../lib/convert/presets.ts";
import { RandomWeights } from "../../lib/model/weights.ts";
import {
  attentionLayer,
  generateGreedy,
  qsaSelect,
  ReferenceModel,
  SequenceState,
  type AttentionWeights,
} from "../../lib/reference/index.ts";
import { maxAbs, maxAbsDiff, randomArray, randomTokens, tinyModel } from "./fixtures.ts";
import { Rng } from "../../lib/model/rng.ts";

describe("a prompt as one row batch = the same prompt token by token", () => {
  const stepwise = (model: ReferenceModel, prompt: number[]) => {
    const state = model.newState();
    return prompt.map((t) => model.forward(state, [t]).logits[0]!);
  };
  const worst = (got: Float32Array[], want: Float32Array[]) =>
    Math.max(...want.map((w, i) => maxAbsDiff(got[i]!, w) / Math.max(1, maxAbs(w))));

  for (const seed of [1, 2]) {
    test(`seed ${seed}, f32 KV: chunked DeltaNet prefill (chunks 1, 3, 7, 64) within 1e-5 of token by token`, () => {
      const model = tinyModel(seed, { kvCache: "f32" });
      const prompt = randomTokens(seed, 20, model.config.vocab_size);
      const want = stepwise(model, prompt);
      for (const deltanetChunk of [1, 3, 7, 64]) {
        const state = model.newState();
        expect(worst(model.forward(state, prompt, { deltanetChunk }).logits, want)).toBeLessThan(1e-5);
        expect(state.length).toBe(prompt.length);
      }
    });

    // q8 turns a 1e-6 difference into a whole rounding step now and then (seen with seed 1,
    // chunk 7): the bound is the q8 step, not the f32 rounding.
    test(`seed ${seed}, q8 KV: chunked prefill within q8 rounding; a recurrent batch bit-identical`, () => {
      const model = tinyModel(seed);
      const prompt = randomTokens(seed, 20, model.config.vocab_size);
      const want = stepwise(model, prompt);
      for (const deltanetChunk of [3, 7, 64]) expect(worst(model.forward(model.newState(), prompt, { deltanetChunk }).logits, want)).toBeLessThan(5e-3);
      const recurrent = model.forward(model.newState(), prompt, { deltanetChunk: 0 }).logits;
      prompt.forEach((_, i) => expect(Array.from(recurrent[i]!)).toEqual(Array.from(want[i]!)));
    });

    test(`seed ${seed}: prefill in chunks of 1, 3 and whole gives the same greedy tokens`, () => {
      const model = tinyModel(seed);
      const prompt = randomTokens(seed, 20, model.config.vocab_size);
      const runs = [1, 3, prompt.length].map((prefillChunk) => generateGreedy(model, prompt, { maxTokens: 12, prefillChunk }));
      expect(runs[0]!.tokens.length).toBe(12);
      expect(runs[1]!.tokens).toEqual(runs[0]!.tokens);
      expect(runs[2]!.tokens).toEqual(runs[0]!.tokens);
      // One trace entry per forward: 20 single-row prefill steps + 11 decode steps.
      expect(runs[0]!.trace.length).toBe(20 + 11);
      expect(runs[2]!.trace.length).toBe(1 + 11);
      for (let i = 0; i < 12; i++) expect(Math.abs(runs[2]!.margins[i]! - runs[0]!.margins[i]!)).toBeLessThan(1e-2);
    });
  }

  test("the routing trace has one entry per layer, row and k, with weights summing to 1", () => {
    const model = tinyModel(3);
    const r = model.forward(model.newState(), [1, 2, 3]);
    const { num_layers, moe } = model.config;
    expect(r.route.tokens).toEqual([1, 2, 3]);
    expect(r.route.experts.length).toBe(num_layers);
    for (let l = 0; l < num_layers; l++) {
      expect(r.route.experts[l]!.length).toBe(3);
      for (let b = 0; b < 3; b++) {
        const ids = r.route.experts[l]![b]!;
        expect(ids.length).toBe(moe.top_k);
        expect(new Set(ids).size).toBe(moe.top_k);
        for (const e of ids) expect(e >= 0 && e < moe.experts).toBe(true);
        const sum = r.route.weights[l]![b]!.reduce((a, w) => a + w, 0);
        expect(sum).toBeCloseTo(1, 5);
      }
    }
  });
});

describe("QSA", () => {
  const attentionLayerIndex = presetConfig("tiny").layer_types.indexOf("attention");

  test("with topk equal to the context it equals dense attention bit for bit; one less and the last row differs", () => {
    const prompt = randomTokens(4, 16, 320);
    const dense = tinyModel(4, { qsa: false });
    const a = dense.forward(dense.newState(), prompt).logits;
    const exact = tinyModel(4, {}, (c) => (c.attention.qsa!.topk = prompt.length));
    const b = exact.forward(exact.newState(), prompt, { collectSelections: true });
    prompt.forEach((_, i) => expect(Array.from(b.logits[i]!)).toEqual(Array.from(a[i]!)));
    expect(b.selected![attentionLayerIndex]!.at(-1)).toEqual(Array.from({ length: 16 }, (_, s) => s));
    const short = tinyModel(4, {}, (c) => (c.attention.qsa!.topk = prompt.length - 1));
    const r = short.forward(short.newState(), prompt, { collectSelections: true });
    prompt.slice(0, -1).forEach((_, i) => expect(Array.from(r.logits[i]!)).toEqual(Array.from(a[i]!)));
    expect(r.selected![attentionLayerIndex]!.at(-1)!.length).toBe(15);
    expect(maxAbsDiff(r.logits.at(-1)!, a.at(-1)!)).toBeGreaterThan(1e-4);
  });

  test("with a small topk, later rows attend to topk positions and differ from dense", () => {
    const dense = tinyModel(4, { qsa: false });
    const sparse = tinyModel(4); // topk 4
    const topk = sparse.config.attention.qsa!.topk;
    const prompt = randomTokens(5, 16, 320);
    const a = dense.forward(dense.newState(), prompt).logits;
    const r = sparse.forward(sparse.newState(), prompt, { collectSelections: true });
    const selected = r.selected![attentionLayerIndex]!;
    let differing = 0;
    prompt.forEach((_, t) => {
      if (t + 1 <= topk) {
        expect(selected[t]).toEqual(Array.from({ length: t + 1 }, (_, s) => s));
        expect(Array.from(r.logits[t]!)).toEqual(Array.from(a[t]!));
      } else {
        expect(selected[t]!.length).toBe(topk);
        if (maxAbsDiff(r.logits[t]!, a[t]!) > 1e-4) differing++;
      }
    });
    expect(differing).toBeGreaterThan(5);
  });

  // Everything recomputed here from the weights and MODEL.md alone (index keys through their own
  // RMSNorm and q8 rounding, not read from the reference's cache), including the exact-zero
  // ties that relu makes common: they must go to the lower position.
  test("the selected set is the top by index score, recomputed independently, exact-zero ties to the lower position", () => {
    const config = presetConfig("tiny");
    const qsa = config.attention.qsa!;
    const w = new RandomWeights(config, 6);
    const l = attentionLayerIndex;
    const get = (n: string) => w.get(`layers.${l}.attn.${n}`);
    const weights: AttentionWeights = {
      q: get("q"), gate: get("gate"), k: get("k"), v: get("v"), q_norm: get("q_norm"), k_norm: get("k_norm"), o: get("o"),
      qsa: { iq: get("iq"), ik: get("ik"), ik_norm: get("ik_norm"), iw: get("iw") },
    };
    const d = config.hidden_size;
    const nb = 48;
    const xs = randomArray(new Rng(6, "qsa-rows"), nb * d, 1.5);
    const state = new SequenceState(config).attention[l]!;
    const trace = { selected: [] as number[][] };
    const ys = attentionLayer(weights, config, state, xs, nb, 0, trace);

    const { heads: Hi, head_dim: di } = qsa;
    const row = (t: number) => xs.subarray(t * d, (t + 1) * d);
    const proj = (W: Float32Array, x: Float32Array, rows: number) => Array.from({ length: rows }, (_, r) => Math.fround(x.reduce((acc, v, c) => acc + W[r * d + c]! * v, 0)));
    // ik: zero-centred RMSNorm, then the q8 rule (scale f32(max|x|/127), exact quotient rounded half away).
    const keys = Array.from({ length: nb }, (_, s) => {
      const raw = proj(get("ik"), row(s), di);
      const r = 1 / Math.sqrt(raw.reduce((a, v) => a + v * v, 0) / di + config.rms_norm_eps);
      const n = raw.map((v, i) => Math.fround(v * r * (1 + get("ik_norm")[i]!)));
      const scale = Math.fround(Math.max(...n.map(Math.abs)) / 127);
      return n.map((v) => {
        const q = Math.min(127, Math.floor(Math.abs(v) / scale + 0.5));
        return q === 0 ? 0 : Math.fround(Math.sign(v) * q * scale);
      });
    });
    let zeroTies = 0;
    for (let t = qsa.topk; t < nb; t++) {
      const iq = proj(get("iq"), row(t), Hi * di);
      const iw = proj(get("iw"), row(t), Hi);
      const scores = Array.from({ length: t + 1 }, (_, s) => {
        let acc = 0;
        for (let h = 0; h < Hi; h++) {
          let dotp = 0;
          for (let i = 0; i < di; i++) dotp += iq[h * di + i]! * keys[s]![i]!;
          acc += iw[h]! * Math.max(0, dotp);
        }
        return Math.fround(acc / Math.sqrt(di));
      });
      // Brute force: s is selected iff fewer than topk positions beat it (higher score, or equal and lower s).
      const beaten = scores.map((sc, s) => scores.filter((o, j) => o > sc || (o === sc && j < s)).length);
      const want = scores.map((_, s) => s).filter((s) => beaten[s]! < qsa.topk);
      expect({ row: t, selected: trace.selected[t] }).toEqual({ row: t, selected: want });
      const kth = [...scores].sort((a, b) => b - a)[qsa.topk - 1]!;
      if (kth === 0 && scores.filter((v) => v === 0).length > 1) zeroTies++;
    }
    // Rows where the k-th score is an exact zero shared by several positions really occur here.
    expect(zeroTies).toBeGreaterThan(2);
    // The same rows through dense attention differ once selection starts.
    const denseState = new SequenceState(config).attention[l]!;
    const dense = attentionLayer({ ...weights, qsa: null }, config, { ...denseState, ik: null }, xs, nb, 0);
    expect(maxAbsDiff(dense.subarray(0, qsa.topk * d), ys.subarray(0, qsa.topk * d))).toBe(0);
    expect(maxAbsDiff(dense.subarray(qsa.topk * d), ys.subarray(qsa.topk * d))).toBeGreaterThan(1e-4);
    // The independently computed keys are the cached ones, bit for bit.
    keys.forEach((k, s) => expect(Array.from(state.ik!.vector(s, 0))).toEqual(k));
  });

  test("qsaSelect breaks score ties toward the lower position and returns positions ascending", () => {
    expect(qsaSelect(new Float32Array([1, 5, 5, 2, 5]), 2)).toEqual([1, 2]);
    expect(qsaSelect(new Float32Array([1, 5, 5, 2, 5]), 3)).toEqual([1, 2, 4]);
    expect(qsaSelect(new Float32Array([9, 0, 9]), 5)).toEqual([0, 1, 2]);
  });
});

describe("KV cache kinds", () => {
  test("q8 and f32 caches give close but different logits", () => {
    const q8 = tinyModel(7);
    const f32 = tinyModel(7, { kvCache: "f32" });
    const prompt = randomTokens(7, 12, 320);
    const a = q8.forward(q8.newState(), prompt).logits;
    const b = f32.forward(f32.newState(), prompt).logits;
    let total = 0;
    prompt.forEach((_, i) => {
      const diff = maxAbsDiff(a[i]!, b[i]!);
      expect(diff).toBeLessThan(0.05 * Math.max(1, maxAbs(b[i]!)));
      total += diff;
    });
    expect(total).toBeGreaterThan(0);
  });
});

describe("feature-off presets run", () => {
  const sets = [
    { hc: false },
    { qsa: false },
    { ple: false },
    { mtp: false },
    { hc: false, qsa: false, ple: false, mtp: false },
    { kvCache: "f32" as const },
  ];
  for (const f of sets) {
    test(JSON.stringify(f), () => {
      const model = tinyModel(8, f);
      const c = model.config;
      if (f.hc === false) expect(model.weights.has("layers.0.hc_mixer.fn")).toBe(false);
      const prompt = randomTokens(8, 9, c.vocab_size);
      const r = model.forward(model.newState(), prompt);
      for (const row of r.logits) {
        expect(row.length).toBe(c.vocab_size);
        for (const v of row) expect(Number.isFinite(v)).toBe(true);
      }
      const g = generateGreedy(model, prompt, { maxTokens: 6, prefillChunk: 4 });
      expect(g.tokens.length).toBe(6);
      for (const t of g.tokens) expect(t >= 0 && t < c.vocab_size).toBe(true);
      if (f.mtp === false) expect(() => generateGreedy(model, prompt, { maxTokens: 3, drafts: 1 })).toThrow(/MTP/);
    });
  }
});

describe("bad input", () => {
  const model = tinyModel(9);
  test("an out-of-vocabulary token names the id and the vocabulary size", () => {
    expect(() => model.forward(model.newState(), [1, 320])).toThrow(/token id 320 .*vocab_size 320/);
    expect(() => generateGreedy(model, [5, -1], { maxTokens: 2 })).toThrow(/prompt token id -1 .*vocab_size 320/);
    expect(() => generateGreedy(model, [5, 1.5], { maxTokens: 2 })).toThrow(/1\.5/);
  });
  test("a failed forward leaves the state untouched", () => {
    const state = model.newState();
    model.forward(state, [1, 2]);
    expect(() => model.forward(state, [3, 999])).toThrow(/999/);
    expect(state.length).toBe(2);
    expect(state.tokens).toEqual([1, 2]);
  });
  test("empty prompts, states of another model and too many drafts are refused", () => {
    expect(() => generateGreedy(model, [], { maxTokens: 2 })).toThrow(/empty/);
    expect(() => model.forward(new ReferenceModel(new RandomWeights(presetConfig("tiny"), 9)).newState(), [1])).toThrow(/another model/);
    expect(() => generateGreedy(model, [1], { maxTokens: 2, drafts: 4 })).toThrow(/max_drafts/);
  });
});
