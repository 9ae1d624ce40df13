// The trained example models in examples/models (docs/training.md): intact, really trained
// (held-out text far below the uniform loss, MTP drafts accepted), speculative decoding equal
// to greedy on them, and the committed routing traces are what these models route.
import { describe, expect, test } from "bun:test";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { openModel } from "../../lib/model/format.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { generateGreedy, ReferenceModel } from "../../lib/reference/index.ts";
import { excerpts, modelDir, MODELS, nll } from "./measure.ts";
import { RoutingProbe } from "./routing-probe.ts";

const MAX_BYTES = 16 * 1024 * 1024;

describe.each(MODELS)("%s", (name) => {
  const dir = modelDir(name);

  test("every checksum holds, and the directory is at most 16 MiB", async () => {
    const m = await openModel(dir, { verify: true });
    m.close();
    const bytes = readdirSync(dir).reduce((s, f) => s + statSync(join(dir, f)).size, 0);
    expect(bytes).toBeLessThanOrEqual(MAX_BYTES);
    const c = m.config;
    if (name.startsWith("qwen4")) {
      expect(c.hc.streams).toBe(4);
      expect(c.attention.qsa).not.toBeNull();
      expect(c.ple).not.toBeNull();
    } else expect(c.hc.streams).toBe(1);
    expect(c.mtp).not.toBeNull();
  });

  test("held-out text costs less than half the uniform loss", async () => {
    const m = await openModel(dir);
    try {
      const tok = await loadTokenizer(dir);
      const tokens = tok.encode(excerpts()[1]!.text).slice(0, 48);
      const model = new ReferenceModel(m);
      const r = model.forward(model.newState(), tokens);
      let sum = 0;
      for (let i = 0; i + 1 < tokens.length; i++) sum += nll(r.logits[i]!, tokens[i + 1]!);
      expect(sum / (tokens.length - 1)).toBeLessThan(Math.log(m.config.vocab_size) / 2);
    } finally {
      m.close();
    }
  });

  test("speculative decoding equals greedy and accepts MTP drafts", async () => {
    const m = await openModel(dir);
    try {
      const tok = await loadTokenizer(dir);
      const model = new ReferenceModel(m);
      const prompt = tok.encode(excerpts()[2]!.text).slice(0, 16);
      const plain = generateGreedy(model, prompt, { maxTokens: 16 });
      const spec = generateGreedy(model, prompt, { maxTokens: 16, drafts: 3 });
      expect(spec.tokens).toEqual(plain.tokens);
      expect(spec.margins).toEqual(plain.margins);
      expect(spec.drafts!.accepted).toBeGreaterThan(0);
    } finally {
      m.close();
    }
  });

  test("the committed trace is this model's routing, and the probe routes as the reference", async () => {
    const trace = JSON.parse(readFileSync(join(import.meta.dir, "traces", `${name}.json`), "utf8"));
    const m = await openModel(dir);
    try {
      const ex = trace.excerpts[0];
      const tokens: number[] = ex.tokens.slice(0, 10);
      const probe = new RoutingProbe(m);
      const model = new ReferenceModel(m);
      const state = model.newState();
      tokens.forEach((t, i) => {
        const s = probe.step(t);
        const r = model.forward(state, [t]);
        expect(s.experts).toEqual(r.route.experts.map((layer) => layer[0]!));
        expect(Array.from(s.logits)).toEqual(Array.from(r.logits[0]!));
        expect(s.experts.flat()).toEqual(ex.experts[i]);
        expect(s.predicted.slice(1).flat()).toEqual(ex.predicted[i]);
      });
    } finally {
      m.close();
    }
  });
});
