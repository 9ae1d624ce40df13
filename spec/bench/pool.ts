/**
 * `bun run bench:pool`: expert-pool hit rates and reads on routing traces, for pool sizes
 * from 10% to 100% of the expert records: the engine's policies (lib/gpu/residency.ts: LRU,
 * layer-cyclic LC, reuse), each alone, with the trace's recorded lookahead predictions
 * prefetched (+LA) and with a perfect one-layer lookahead (+LA*), against Belady's offline
 * optimum: hit rate, its distance to Belady's in points, reads (misses + prefetches) over
 * Belady's, and the lookahead's wasted reads.
 *
 * Traces, in order of preference:
 *  --traces PATH   a trace file (.jsonl or .json, either gzipped as .gz) or a folder of them;
 *  spec/train/traces/*.json(l)(.gz) when present (trained models' routing);
 *  else (or with --generate) made here: a synthetic model (--preset, default small; --seed) run through the
 *  reference (lib/reference) on a few prompts, plain and speculative (prefill chunk 4).
 *  Synthetic routing is close to uniform: its numbers show the machinery, not real locality.
 * Each model's trace file gets its own table; the excerpts or prompts inside one are replayed
 * back to back (a server keeps its pool across requests). Files that are not traces
 * (summary.json, the held-out corpus) are skipped.
 * Other options: --tokens N (per generated trace, default 64), --sizes 10,25,50 (percent),
 * --save DIR (write the generated traces as JSON lines), --json (one JSON object).
 */
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { parseArgs } from "node:util";
import { synthesize } from "../../lib/convert/synth.ts";
import type { PresetName } from "../../lib/convert/presets.ts";
import { parseTrace, readTraceText, TraceWriter, type TraceStep } from "../../lib/gpu/trace.ts";
import { openModel } from "../../lib/model/format.ts";
import { generateGreedy } from "../../lib/reference/index.ts";
import { POOL_POLICIES, type PoolPolicy } from "../../lib/gpu/residency.ts";
import { accessesOf, largestUnion, simulateBelady, simulateLru, type SimResult } from "./policies.ts";

/** Short names in the tables. */
const NAMES: Record<PoolPolicy, string> = { lru: "LRU", "layer-cyclic": "LC", reuse: "reuse" };

const ROOT = join(import.meta.dir, "..", "..");
const { values: opts } = parseArgs({
  options: {
    traces: { type: "string" },
    preset: { type: "string", default: "small" },
    seed: { type: "string", default: "1" },
    tokens: { type: "string", default: "64" },
    sizes: { type: "string", default: "10,20,25,30,40,50,60,70,80,90,100" },
    save: { type: "string" },
    generate: { type: "boolean", default: false },
    json: { type: "boolean", default: false },
  },
});
const log = (s: string) => {
  if (!opts.json) console.error(s);
};

interface TraceSet {
  source: string;
  files: string[];
  steps: TraceStep[];
  perLayer: number;
}

/** Experts per layer from a trace document's metadata, if it says. */
function perLayerOf(doc: unknown): number | null {
  const d = doc as { perLayer?: unknown; per_layer?: unknown; experts_per_layer?: unknown; config?: { moe?: { experts?: unknown } } };
  const experts = (d as { experts?: unknown })?.experts; // training-run traces: the expert count
  for (const v of [d?.perLayer, d?.per_layer, d?.experts_per_layer, d?.config?.moe?.experts, experts]) if (Number.isInteger(v)) return v as number;
  return null;
}

/** Reads trace files as one set (one model's run). */
function loadTraceFiles(paths: string[], source: string): TraceSet {
  const steps: TraceStep[] = [];
  const used: string[] = [];
  let perLayer = 0;
  for (const p of paths) {
    const text = readTraceText(p);
    steps.push(...parseTrace(text, p));
    used.push(p);
    try {
      perLayer = Math.max(perLayer, perLayerOf(JSON.parse(text)) ?? 0);
    } catch {
      // JSON lines: no metadata
    }
  }
  if (!perLayer) {
    // No metadata: the largest id seen bounds it from below.
    for (const s of steps) for (const l of s.experts) for (const r of l) for (const e of r) perLayer = Math.max(perLayer, e + 1);
  }
  if (!steps.length) throw new Error(`${source}: no routing trace steps`);
  return { source, files: used, steps, perLayer };
}

function traceFilesIn(dir: string): string[] {
  return readdirSync(dir)
    .filter((f) => /\.jsonl?(\.gz)?$/.test(f))
    .sort()
    .map((f) => join(dir, f));
}

async function generatedTraces(): Promise<TraceSet> {
  const preset = opts.preset as PresetName;
  const seed = Number(opts.seed);
  const tokens = Number(opts.tokens);
  const dir = mkdtempSync(join(tmpdir(), "cherenkov-bench-pool-"));
  try {
    log(`synthesizing ${preset} (seed ${seed}) and running the reference for ${tokens} tokens x 4 prompts ...`);
    await synthesize({ preset, seed, out: dir, weights: "q4" });
    const model = await openModel(dir);
    const vocab = model.config.vocab_size;
    let x = seed * 7919 + 17;
    const prompt = (n: number) => Array.from({ length: n }, () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0) >>> 8) % Math.min(vocab, 256));
    const runs = [
      { prompt: prompt(12), drafts: 0 },
      { prompt: prompt(8), drafts: 0 },
      { prompt: prompt(16), drafts: 2 },
      { prompt: prompt(6), drafts: 0 },
    ];
    const steps: TraceStep[] = [];
    const files: string[] = [];
    runs.forEach((r, i) => {
      const gen = generateGreedy(model, r.prompt, { maxTokens: tokens, drafts: r.drafts, prefillChunk: 4 });
      const trace: TraceStep[] = gen.trace.map((s) => ({ ...s, misses: [] }));
      steps.push(...trace);
      if (opts.save) {
        const path = join(opts.save, `${preset}-s${seed}-${i}${r.drafts ? `-drafts${r.drafts}` : ""}.jsonl`);
        const w = TraceWriter.open(path);
        trace.forEach((s) => w.write(s));
        w.close();
        files.push(path);
      }
    });
    const perLayer = model.config.moe.experts;
    model.close();
    return { source: `reference on synthetic ${preset} (seed ${seed}; near-uniform routing)`, files, steps, perLayer };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** One set per model: a recorded folder holds one trace file per model. */
async function traceSets(): Promise<TraceSet[]> {
  if (opts.traces) {
    const st = statSync(opts.traces);
    const files = st.isDirectory() ? traceFilesIn(opts.traces) : [opts.traces];
    if (!files.length) throw new Error(`--traces ${opts.traces}: no .json or .jsonl files`);
    // A folder of JSON lines (e.g. --save output) is one model's run; other folders, one set per file.
    if (files.every((f) => /\.jsonl(\.gz)?$/.test(f))) return [loadTraceFiles(files, opts.traces)];
    return files.map((f) => loadTraceFiles([f], f));
  }
  const recorded = join(ROOT, "spec", "train", "traces");
  const sets: TraceSet[] = [];
  if (existsSync(recorded) && !opts.generate)
    for (const f of traceFilesIn(recorded)) {
      try {
        sets.push(loadTraceFiles([f], `spec/train/traces/${basename(f)}`));
      } catch {
        log(`  spec/train/traces/${basename(f)}: not a routing trace, skipped`);
      }
    }
  return sets.length ? sets : [await generatedTraces()];
}

const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
const ratio = (a: number, b: number) => (b ? (a / b).toFixed(3) : "-");
const sizes = opts.sizes.split(",").map(Number);

/** A policy column: the engine pool's policy, and the lookahead that feeds its prefetches. */
interface Variant {
  name: string;
  policy: PoolPolicy;
  lookahead: "none" | "perfect" | "trace";
}

const VARIANTS: Variant[] = POOL_POLICIES.flatMap((policy) => [
  { name: NAMES[policy], policy, lookahead: "none" as const },
  { name: `${NAMES[policy]}+LA`, policy, lookahead: "trace" as const },
  { name: `${NAMES[policy]}+LA*`, policy, lookahead: "perfect" as const },
]);

interface Row {
  percent: number;
  slots: number;
  belady?: SimResult;
  /** Per variant name (LA rows only when the trace has predictions). */
  results: Record<string, SimResult>;
  skipped?: string;
}

/** Every policy at every pool size on one trace set. */
async function benchSet(set: TraceSet) {
  const steps = accessesOf(set.steps);
  const layers = Math.max(...set.steps.map((s) => s.experts.length));
  const shape = { layers, perLayer: set.perLayer };
  const records = layers * set.perLayer;
  const minimum = largestUnion(steps);
  const hasPredicted = set.steps.some((s) => s.predicted?.some((p) => p.length > 0));
  const variants = VARIANTS.filter((v) => v.lookahead !== "trace" || hasPredicted);
  const rows: Row[] = [];
  for (const p of sizes) {
    const slots = Math.round((p / 100) * records);
    if (slots < minimum) {
      rows.push({ percent: p, slots, results: {}, skipped: `below the largest union (${minimum} records)` });
      continue;
    }
    const row: Row = { percent: p, slots, results: {} };
    for (const v of variants) row.results[v.name] = await simulateLru(steps, shape, slots, v.lookahead, v.policy);
    row.belady = simulateBelady(steps, shape, slots);
    rows.push(row);
  }
  return {
    source: set.source,
    files: set.files.map((f) => basename(f)),
    steps: set.steps.length,
    accesses: steps.reduce((n, a) => n + a.length, 0),
    layers,
    perLayer: set.perLayer,
    records,
    largestUnion: minimum,
    hasPredicted,
    variants: variants.map((v) => v.name),
    rows,
  };
}

function printSet(r: Awaited<ReturnType<typeof benchSet>>): void {
  console.log(`bench:pool  ${r.source}`);
  console.log(`  ${r.steps} steps, ${r.accesses} layer accesses, ${r.layers} layers x ${r.perLayer} experts = ${r.records} records, largest union ${r.largestUnion}\n`);
  const head = ["pool", "slots", "policy", "hit rate", "vs Belady", "reads/Belady", "LA wasted reads"];
  const table: string[][] = [head];
  for (const row of r.rows) {
    if (row.skipped) {
      table.push([`${row.percent}%`, String(row.slots), `(${row.skipped})`]);
      continue;
    }
    const b = row.belady!;
    table.push([`${row.percent}%`, String(row.slots), "Belady", pct(b.hitRate), "", "1.000", ""]);
    for (const name of r.variants) {
      const x = row.results[name]!;
      const wasted = x.wasted === undefined ? "" : `${x.wasted} (${((100 * x.wasted) / Math.max(1, x.reads)).toFixed(1)}% of reads)`;
      table.push(["", "", name, pct(x.hitRate), `${(100 * (x.hitRate - b.hitRate)).toFixed(1)} pt`, ratio(x.reads, b.reads), wasted]);
    }
  }
  const widths = head.map((_, i) => Math.max(...table.map((t) => (t[i] ?? "").length)));
  for (const t of table) console.log("  " + t.map((c, i) => (i < 3 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join("  "));
  console.log("");
}

const results = [];
for (const set of await traceSets()) results.push(await benchSet(set));
if (opts.json) {
  console.log(JSON.stringify({ bench: "pool", sets: results }));
} else {
  results.forEach(printSet);
  console.log("hit rate: demanded experts (per step and layer, the union of its rows) found resident;");
  console.log("reads: records read, misses plus prefetches (the bandwidth a policy costs).");
  console.log("LC: layer-cyclic (the victim is in the layer whose next visit is farthest away, LRU within it).");
  console.log("reuse: the victim is expected back farthest away (layer distance + N (1 - p) / p, p its decayed use rate).");
  console.log("+LA: with the trace's own lookahead predictions prefetched (the lookahead router's sets);");
  console.log("+LA*: with a perfect one-layer lookahead (the next layer's real union is prefetched).");
  console.log("LA wasted reads: prefetched records evicted before any use (bytes = reads x the record size).");
}
