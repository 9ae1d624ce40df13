// Routing traces of the 64-expert, top-8 models (spec/train/device-run-64x8.sh) for bench:pool:
//   bun spec/train/pool-traces.ts Q4X_DIR Q3N_DIR HELDOUT_JSON [--tokens 4096] [--segment 512]
// Teacher-forced decode of held-out files through lib/reference (RoutingProbe: per token the
// experts and weights every layer routes to, and the one-layer lookahead's predictions for
// layers 1..L-1). Segments: the first --segment tokens of held-out files (each a fresh
// sequence, as separate requests to a server), files taken in order of a CRC-32 of their path
// (which mixes the corpus' packages), until --tokens tokens. HELDOUT_JSON is prepare_data.py's
// heldout.json ([{path, text}]). Writes spec/train/traces/<name>.json.gz in the excerpt-trace
// format of spec/train/measure.ts (bench:pool and readTrace read it), with the paths and token
// ids but not the text.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { openModel } from "../../lib/model/format.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { lookaheadHits, RoutingProbe, type ProbeStep } from "./routing-probe.ts";

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: { tokens: { type: "string", default: "4096" }, segment: { type: "string", default: "512" } },
});
const [q4x, q3n, heldoutPath] = positionals;
if (!q4x || !q3n || !heldoutPath) throw new Error("usage: bun spec/train/pool-traces.ts Q4X_DIR Q3N_DIR HELDOUT_JSON [--tokens N] [--segment N]");
const TOKENS = Number(opts.tokens);
const SEGMENT = Number(opts.segment);
const heldout: { path: string; text: string }[] = JSON.parse(readFileSync(heldoutPath, "utf8"));
const ordered = [...heldout].sort((a, b) => Bun.hash.crc32(a.path) - Bun.hash.crc32(b.path) || (a.path < b.path ? -1 : 1));
const round4 = (x: number) => Math.round(x * 1e4) / 1e4;
/** Routing weights to 2 decimals: enough for a policy to weigh by them, and the traces stay small. */
const round2 = (x: number) => Math.round(x * 100) / 100;

async function trace(name: string, dir: string) {
  const files = await openModel(dir, { verify: true });
  const tok = await loadTokenizer(dir);
  const c = files.config;
  const excerpts = [];
  const all: ProbeStep[] = [];
  const started = performance.now();
  let total = 0;
  for (const doc of ordered) {
    if (total >= TOKENS) break;
    const tokens = tok.encode(doc.text).slice(0, Math.min(SEGMENT, TOKENS - total));
    if (tokens.length < SEGMENT && total + tokens.length < TOKENS) continue; // short files: skipped
    const probe = new RoutingProbe(files);
    const steps = tokens.map((t) => probe.step(t));
    all.push(...steps);
    total += tokens.length;
    excerpts.push({
      path: doc.path,
      tokens,
      experts: steps.map((s) => s.experts.flat()),
      weights: steps.map((s) => s.weights.flat().map(round2)),
      predicted: steps.map((s) => s.predicted.slice(1).flat()),
    });
    console.log(`${name}: ${doc.path}: ${tokens.length} tokens (${total} of ${TOKENS}, ${((performance.now() - started) / 1000).toFixed(0)} s)`);
  }
  files.close();
  const { hits, slots } = lookaheadHits(all);
  const doc = {
    model: name,
    note: "teacher-forced decode of held-out files through lib/reference (q4 weights); spec/train/pool-traces.ts",
    layers: c.num_layers,
    topK: c.moe.top_k,
    experts: c.moe.experts,
    lookaheadHitRate: round4(hits / slots),
    excerpts,
  };
  const out = join(import.meta.dir, "traces", `${name}.json.gz`);
  writeFileSync(out, Bun.gzipSync(JSON.stringify(doc), { level: 9 }));
  console.log(`wrote ${out}: ${total} tokens, ${excerpts.length} segments, lookahead hit rate ${doc.lookaheadHitRate}`);
}

await trace("qwen4-exp-64x8", q4x);
await trace("qwen3-next-64x8", q3n);
