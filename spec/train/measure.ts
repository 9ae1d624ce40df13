// Measures the committed example models with lib/reference on held-out text
// (spec/train/traces/heldout-excerpts.json) and writes what the pool and lookahead benchmarks
// and docs/training.md use:
//   bun spec/train/measure.ts            # both models; about 3 minutes
// - spec/train/traces/<model>.json: per excerpt, the tokens and, per token (teacher-forced,
//   one row per step as a decode runs), the routed experts and weights of every layer and the
//   one-layer lookahead's prediction for layers 1..L-1;
// - spec/train/traces/summary.json: held-out loss (nats/token) of the q4 model through the
//   reference, the lookahead's hit rate, MTP acceptance by draft position, sample generations.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { openModel } from "../../lib/model/format.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { generateGreedy, ReferenceModel } from "../../lib/reference/index.ts";
import { lookaheadHits, RoutingProbe, type ProbeStep } from "./routing-probe.ts";

export const MODELS = ["qwen4-exp-tiny", "qwen3-next-tiny"];
export const TRACE_TOKENS = 256;
const MTP_PROMPT = 32;
const MTP_TOKENS = 48;
const SAMPLE_PROMPTS = ["def ", "def fibonacci(n):", "import os\n", "class Stack:\n    def __init__(self):\n"];

const here = import.meta.dir;
export const modelDir = (name: string) => join(here, "..", "..", "examples", "models", name);

export interface Excerpt {
  path: string;
  text: string;
}
export const excerpts = (): Excerpt[] => JSON.parse(readFileSync(join(here, "traces", "heldout-excerpts.json"), "utf8")).excerpts;

/** -log softmax(logits)[target], in f64. */
export function nll(logits: Float32Array, target: number): number {
  let m = -Infinity;
  for (const v of logits) m = Math.max(m, v);
  let s = 0;
  for (const v of logits) s += Math.exp(v - m);
  return Math.log(s) + m - logits[target]!;
}

const round4 = (x: number) => Math.round(x * 1e4) / 1e4;

async function measure(name: string) {
  const dir = modelDir(name);
  const files = await openModel(dir, { verify: true });
  const tok = await loadTokenizer(dir);
  const model = new ReferenceModel(files);
  const c = model.config;
  const traces = [];
  const allSteps: ProbeStep[] = [];
  let nllSum = 0;
  let nllCount = 0;
  const started = performance.now();
  for (const ex of excerpts()) {
    const tokens = tok.encode(ex.text).slice(0, TRACE_TOKENS);
    const probe = new RoutingProbe(files);
    const steps = tokens.map((t) => probe.step(t));
    steps.forEach((s, i) => {
      if (i + 1 < tokens.length) {
        nllSum += nll(s.logits, tokens[i + 1]!);
        nllCount++;
      }
    });
    allSteps.push(...steps);
    traces.push({
      path: ex.path,
      tokens,
      experts: steps.map((s) => s.experts.flat()),
      weights: steps.map((s) => s.weights.flat().map(round4)),
      predicted: steps.map((s) => s.predicted.slice(1).flat()),
    });
  }
  const { hits, slots } = lookaheadHits(allSteps);
  const perLayer = Array.from({ length: c.num_layers - 1 }, (_, i) => {
    const r = lookaheadHits(allSteps.map((s) => ({ ...s, experts: [[], s.experts[i + 1]!], predicted: [[], s.predicted[i + 1]!] })));
    return round4(r.hits / r.slots);
  });
  const traceSeconds = (performance.now() - started) / 1000;

  // MTP acceptance: speculative greedy from the first tokens of each excerpt, 1..max drafts.
  const maxDrafts = c.mtp?.max_drafts ?? 0;
  const mtp: Record<string, unknown>[] = [];
  for (let drafts = 1; drafts <= maxDrafts; drafts++) {
    const acc = { drafts, steps: 0, proposed: 0, accepted: 0, byPosition: new Array(drafts).fill(0), proposedByPosition: new Array(drafts).fill(0), sameAsGreedy: true };
    for (const ex of excerpts()) {
      const prompt = tok.encode(ex.text).slice(0, MTP_PROMPT);
      const plain = generateGreedy(model, prompt, { maxTokens: MTP_TOKENS });
      const spec = generateGreedy(model, prompt, { maxTokens: MTP_TOKENS, drafts });
      acc.sameAsGreedy &&= JSON.stringify(plain.tokens) === JSON.stringify(spec.tokens);
      const d = spec.drafts!;
      acc.steps += d.proposedByPosition[0]!;
      acc.proposed += d.proposed;
      acc.accepted += d.accepted;
      d.byPosition.forEach((v, j) => (acc.byPosition[j] += v));
      d.proposedByPosition.forEach((v, j) => (acc.proposedByPosition[j] += v));
    }
    mtp.push({
      ...acc,
      acceptanceByPosition: acc.byPosition.map((v, j) => round4(v / acc.proposedByPosition[j])),
      tokensPerVerifyStep: round4(1 + acc.accepted / acc.steps),
    });
  }

  const samples = SAMPLE_PROMPTS.map((prompt) => {
    const g = generateGreedy(model, tok.encode(prompt), { maxTokens: 48 });
    return { prompt, text: tok.decode(g.tokens) };
  });
  files.close();
  const trace = { model: name, note: "teacher-forced decode of held-out text through lib/reference (q4 weights, q8 KV)", layers: c.num_layers, topK: c.moe.top_k, experts: c.moe.experts, excerpts: traces };
  writeFileSync(join(here, "traces", `${name}.json`), JSON.stringify(trace));
  return {
    heldoutNll: round4(nllSum / nllCount),
    heldoutTokens: nllCount,
    lookahead: { hitRate: round4(hits / slots), perLayer, predictedSets: slots / c.moe.top_k },
    mtp,
    samples,
    traceSeconds: Math.round(traceSeconds),
  };
}

if (import.meta.main) {
  const only = process.argv.slice(2);
  const summary: Record<string, unknown> = {};
  for (const name of only.length ? only : MODELS) {
    summary[name] = await measure(name);
    console.log(name, JSON.stringify(summary[name], null, 1));
  }
  writeFileSync(join(here, "traces", "summary.json"), JSON.stringify(summary, null, 1) + "\n");
}
