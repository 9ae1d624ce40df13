/**
 * `bun run bench:prefill`: the engine's prompt processing (prefill) on the default backend
 * (CHERENKOV_BACKEND=cuda|metal|cpu), in two modes, one run:
 *
 * - warm: the pool holds every expert record and they are preloaded (pool 100%, resident
 *   layers), so a prompt reads nothing from disk: prompt tok/s is the GPU's.
 * - cold: a smaller pool (--cold-pool, default 25%), no preload, emptied before each prompt:
 *   every chunk streams the records its rows route to. Printed beside it: the expert bytes the
 *   prompt read, how often a chunk read each record of a layer (at most once is the design:
 *   a chunk acquires each layer's union of routed experts once, lib/gpu/step.ts), and the disk
 *   bound, the disk's direct random-read bandwidth at the record size (measured first,
 *   spec/bench/disk-bandwidth.ts, or --disk) over the bytes the prompt had to read per token
 *   (the records each chunk routed to and read; reads of records it did not route to, the
 *   lookahead's wrong predictions, are counted apart).
 *
 * Each mode loads one engine, prefills a warm-up prompt of one chunk, then each prompt of
 * --prompts (seeded random token ids in the vocabulary) once on a fresh sequence. The prompt
 * runs chunk by chunk (the engine's prefill rows, as one forward() would cut it), so that the
 * pool's per-record read counts (ExpertPool.recordReads) can be taken between chunks.
 *
 *   bun run bench:prefill --model DIR [--prompts 512,2048,8192] [--chunk N] [--cold-pool 25%]
 *                         [--modes warm,cold] [--disk BYTES_PER_S] [--peak-tflops T] [--no-lookahead] [--json]
 *   bun run bench:prefill --preset small ...     (synthesized into a temporary directory; default without --model)
 *   bun run bench:prefill --simulate [--preset 30b-a3b-shape] ...   (routing simulation: spec/bench/prefill-simulate.ts)
 *
 * --chunk is the engine's prefillChunk (default MAX_NB = 1024, the longest step, as bench:decode's
 * prefill; Model.load's default is 512).
 * Every row also gets its weight-matrix TFLOP/s (spec/bench/prefill-flops.ts); with
 * --peak-tflops (the device's matrix peak) the compute bound and the share of it reached.
 * --json prints one object holding every row.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { parseArgs } from "node:util";

import { synthesize } from "../../lib/convert/synth.ts";
import type { PresetName } from "../../lib/convert/presets.ts";
import { Engine, type EngineSequence } from "../../lib/gpu/engine.ts";
import { MAX_NB } from "../../lib/gpu/limits.ts";
import { chunkRanges } from "../../lib/gpu/prefill.ts";
import { openModel } from "../../lib/model/format.ts";
import { Rng } from "../../lib/model/rng.ts";
import { defaultBackend } from "../../lib/shim.ts";
import { diskBandwidth, type DiskBandwidth } from "./disk-bandwidth.ts";
import { weightFlopsPerToken } from "./prefill-flops.ts";
import { SIMULATE_DEFAULTS, simulatePrefill } from "./prefill-simulate.ts";

const { values: opts } = parseArgs({
  options: {
    simulate: { type: "boolean", default: false },
    model: { type: "string" },
    preset: { type: "string" },
    prompts: { type: "string", default: "512,2048,8192" },
    chunk: { type: "string" },
    "cold-pool": { type: "string", default: "25%" },
    modes: { type: "string", default: "warm,cold" },
    warmup: { type: "string" },
    disk: { type: "string" },
    "peak-tflops": { type: "string" },
    "no-lookahead": { type: "boolean", default: false },
    seed: { type: "string", default: "1" },
    json: { type: "boolean", default: false },
    // --simulate only
    prompt: { type: "string" },
    decode: { type: "string" },
    pool: { type: "string" },
    zipf: { type: "string" },
  },
});

if (opts.simulate) {
  const d = SIMULATE_DEFAULTS;
  await simulatePrefill({
    preset: opts.preset ?? d.preset,
    chunk: opts.chunk ?? d.chunk,
    prompt: opts.prompt ?? d.prompt,
    decode: opts.decode ?? d.decode,
    pool: opts.pool ?? d.pool,
    zipf: opts.zipf ?? d.zipf,
    seed: opts.seed,
    json: opts.json,
  });
  process.exit(0);
}
for (const k of ["prompt", "decode", "pool", "zipf"] as const) if (opts[k] !== undefined) throw new Error(`bench:prefill: --${k} belongs to --simulate (the engine run takes --prompts and --cold-pool)`);

/** A positive integer option, or a clear error naming it. */
function positive(name: string, v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new Error(`bench:prefill: --${name} ${JSON.stringify(v)} must be a positive integer`);
  return n;
}

/** A positive number option (--disk bytes/s, --peak-tflops). */
function positiveNumber(name: string, v: string): number {
  const n = Number(v);
  if (!(Number.isFinite(n) && n > 0)) throw new Error(`bench:prefill: --${name} ${JSON.stringify(v)} must be a positive number`);
  return n;
}

const backend = defaultBackend();
const prompts = opts.prompts.split(",").map((p) => positive("prompts", p.trim()));
// The longest step the engine takes, as bench:decode's prefill figures (docs/performance.md, H200 runs).
const chunk = opts.chunk === undefined ? MAX_NB : positive("chunk", opts.chunk);
const modes = opts.modes.split(",").map((m) => m.trim());
for (const m of modes) if (m !== "warm" && m !== "cold") throw new Error(`bench:prefill: --modes ${JSON.stringify(opts.modes)}: each must be "warm" or "cold"`);
const seed = positive("seed", opts.seed);
const warmupOption = opts.warmup === undefined ? undefined : positive("warmup", opts.warmup);
const peakTflops = opts["peak-tflops"] === undefined ? null : positiveNumber("peak-tflops", opts["peak-tflops"]);
const log = (s: string) => {
  if (!opts.json) console.log(s);
};

/** One chunk of a prompt: its rows, time, and the expert reads it caused. */
export interface ChunkRun {
  rows: number;
  ms: number;
  /** Record reads issued during the chunk (every layer). */
  recordsRead: number;
  /** Sum over layers of the chunk's union of routed experts (distinct records the chunk needed), from the routing counts. */
  unionRecords: number;
  /** The same from the pool's hits + misses (a site counts each distinct expert once): equal to unionRecords. */
  poolUnionRecords: number;
  /** Records the chunk routed to and read (each once at most: the bytes the chunk had to read). */
  routedRecordsRead: number;
  /** Reads of records the chunk did not route to (lookahead predictions that missed). */
  unroutedReads: number;
  /** The most times one record was read during the chunk (at most 1: each routed expert read once per chunk). */
  maxReadsPerRecord: number;
  /** The largest share of one layer's records read during the chunk. */
  maxLayerReadShare: number;
}

/** One prompt prefilled once. */
export interface PromptRun {
  promptTokens: number;
  chunks: number;
  chunkRows: number;
  ms: number;
  tokensPerSecond: number;
  /** Engine phases summed over the prompt's steps (lib/gpu/phases.ts): GPU working or queued, host waiting for reads, commit -> completion. */
  gpuMs: number;
  ioWaitMs: number;
  stepMs: number;
  /** Expert bytes read from disk during the prompt (the IO scheduler's completed bytes). */
  readBytes: number;
  readBytesPerToken: number;
  recordsRead: number;
  unionRecords: number;
  routedRecordsRead: number;
  unroutedReads: number;
  /** routedRecordsRead x record bytes: what the chunks had to read (the disk bound's bytes). */
  neededBytes: number;
  neededBytesPerToken: number;
  /** Max over chunks, layers and records of reads of one record within one chunk. */
  maxReadsPerRecord: number;
  /** Mean over chunks and layers of the share of the layer's records the chunk read. */
  layerReadShare: number;
  maxLayerReadShare: number;
  hitRate: number;
  /** Weight-matrix TFLOP/s reached (tokensPerSecond x weightFlopsPerToken). */
  tflops: number;
  /** With --peak-tflops: the tokens/s that peak allows (peak / weightFlopsPerToken), and this run's share of it. */
  computeBoundTokensPerSecond?: number;
  ratioToComputeBound?: number;
  /** Cold only: the disk's bandwidth over neededBytesPerToken, and this run's share of it. */
  diskBoundTokensPerSecond?: number | null;
  ratioToDiskBound?: number | null;
  perChunk: ChunkRun[];
}

export interface ModeRun {
  mode: "warm" | "cold";
  pool: string;
  poolSlots: number;
  records: number;
  preloaded: boolean;
  lookahead: boolean;
  chunkRows: number;
  warmupTokens: number;
  prompts: PromptRun[];
}

/** Seeded random ids in [0, vocab). */
const promptOf = (n: number, vocab: number, stream: string) => {
  const r = new Rng(seed, stream);
  return Array.from({ length: n }, () => r.int(vocab));
};

/** Waits until the engine's IO scheduler has nothing queued or in flight (a prompt's late prefetches). */
async function ioSettled(engine: Engine): Promise<void> {
  const io = engine.gpu.scheduler;
  if (!io) return;
  for (let i = 0; i < 10_000; i++) {
    const s = io.stats();
    if (s.inFlight === 0 && s.queued === 0) return;
    await Bun.sleep(1);
  }
  throw new Error("bench:prefill: the engine's reads did not settle within 10 s");
}

/** Rows routed so far to each record (index layer * perLayer + e), from the engine's expert activity. */
function routedRows(engine: Engine): Float64Array {
  const { activity, pool } = engine.gpu;
  const out = new Float64Array(pool.layers * pool.perLayer);
  for (let l = 0; l < pool.layers; l++) for (let e = 0; e < pool.perLayer; e++) out[l * pool.perLayer + e] = activity.count(l, e);
  return out;
}

/** Prefills `tokens` on `seq` chunk by chunk, as forward() cuts them, taking the pool's read counts between chunks. */
async function prefill(engine: Engine, seq: EngineSequence, tokens: number[], flopsPerToken: number): Promise<PromptRun> {
  const g = engine.gpu;
  const pool = g.pool;
  const E = pool.perLayer;
  const completed = () => g.scheduler?.stats().completedBytes ?? 0;
  const stats0 = pool.poolStats();
  const bytes0 = completed();
  const perChunk: ChunkRun[] = [];
  let shareSum = 0;
  let shareCount = 0;
  for (const [a, b] of chunkRanges(tokens.length, g.prefillRows)) {
    const reads0 = pool.recordReads();
    const routed0 = routedRows(engine);
    const ps0 = pool.poolStats().perLayer;
    const t0 = performance.now();
    await seq.forward(tokens.slice(a, b), { logits: b === tokens.length ? "last" : "none" });
    const ms = performance.now() - t0;
    const reads1 = pool.recordReads();
    const routed1 = routedRows(engine);
    const ps1 = pool.poolStats().perLayer;
    const c: ChunkRun = { rows: b - a, ms, recordsRead: 0, unionRecords: 0, poolUnionRecords: 0, routedRecordsRead: 0, unroutedReads: 0, maxReadsPerRecord: 0, maxLayerReadShare: 0 };
    for (let l = 0; l < pool.layers; l++) {
      let layerReads = 0;
      let union = 0;
      for (let k = l * E; k < (l + 1) * E; k++) {
        const d = reads1[k]! - reads0[k]!;
        const routed = routed1[k]! > routed0[k]!;
        layerReads += d;
        if (routed) union++;
        if (routed && d > 0) c.routedRecordsRead++;
        if (!routed) c.unroutedReads += d;
        c.maxReadsPerRecord = Math.max(c.maxReadsPerRecord, d);
      }
      c.recordsRead += layerReads;
      c.unionRecords += union;
      // A site's union as the pool saw it: its distinct experts, each counted once as a hit or a miss.
      c.poolUnionRecords += ps1.hits[l]! - ps0.hits[l]! + ps1.misses[l]! - ps0.misses[l]!;
      c.maxLayerReadShare = Math.max(c.maxLayerReadShare, layerReads / E);
      if (union > 0) {
        shareSum += layerReads / E;
        shareCount++;
      }
    }
    perChunk.push(c);
  }
  const ms = perChunk.reduce((s, c) => s + c.ms, 0);
  const st = engine.stats();
  const phase = (k: string) => st.phases[k]?.totalMs ?? 0;
  const hits = st.pool.hits - stats0.hits;
  const misses = st.pool.misses - stats0.misses;
  const readBytes = completed() - bytes0;
  const routedRecordsRead = perChunk.reduce((s, c) => s + c.routedRecordsRead, 0);
  const tokensPerSecond = tokens.length / (ms / 1000);
  const computeBound = peakTflops === null ? null : (peakTflops * 1e12) / flopsPerToken;
  return {
    promptTokens: tokens.length,
    chunks: perChunk.length,
    chunkRows: g.prefillRows,
    ms,
    tokensPerSecond,
    gpuMs: phase("gpu"),
    ioWaitMs: phase("io-wait"),
    stepMs: phase("step"),
    readBytes,
    readBytesPerToken: readBytes / tokens.length,
    recordsRead: perChunk.reduce((s, c) => s + c.recordsRead, 0),
    unionRecords: perChunk.reduce((s, c) => s + c.unionRecords, 0),
    routedRecordsRead,
    unroutedReads: perChunk.reduce((s, c) => s + c.unroutedReads, 0),
    neededBytes: routedRecordsRead * pool.recordBytes,
    neededBytesPerToken: (routedRecordsRead * pool.recordBytes) / tokens.length,
    maxReadsPerRecord: Math.max(0, ...perChunk.map((c) => c.maxReadsPerRecord)),
    layerReadShare: shareCount ? shareSum / shareCount : 0,
    maxLayerReadShare: Math.max(0, ...perChunk.map((c) => c.maxLayerReadShare)),
    hitRate: hits + misses ? hits / (hits + misses) : 0,
    tflops: (tokensPerSecond * flopsPerToken) / 1e12,
    ...(computeBound === null ? {} : { computeBoundTokensPerSecond: computeBound, ratioToComputeBound: tokensPerSecond / computeBound }),
    perChunk,
  };
}

async function runMode(dir: string, mode: "warm" | "cold", disk: DiskBandwidth | null): Promise<ModeRun> {
  const files = await openModel(dir);
  const warm = mode === "warm";
  const pool = warm ? "100%" : opts["cold-pool"];
  const vocab = files.config.vocab_size;
  const flops = weightFlopsPerToken(files.config, files.expertLayout.parts);
  const engine = await Engine.load(files, backend, {
    pool,
    preload: warm,
    // Room for the longest prompt and for the warm-up (one chunk, or --warmup).
    maxContext: Math.max(...prompts, chunk, warmupOption ?? 1),
    lookahead: !opts["no-lookahead"],
    prefillChunk: chunk,
  });
  try {
    const g = engine.gpu;
    // One chunk first: pipelines built, GEMM paths taken, buffers touched.
    const warmupTokens = warmupOption ?? g.prefillRows;
    const w = engine.newSequence();
    await prefill(engine, w, promptOf(warmupTokens, vocab, "bench-prefill-warmup"), flops);
    w.dispose();
    const runs: PromptRun[] = [];
    for (const n of prompts) {
      if (!warm) {
        await ioSettled(engine);
        g.pool.evictAll();
      }
      engine.resetTimings();
      const seq = engine.newSequence();
      const r = await prefill(engine, seq, promptOf(n, vocab, `bench-prefill-${n}`), flops);
      seq.dispose();
      if (!warm && disk) {
        r.diskBoundTokensPerSecond = r.neededBytesPerToken > 0 ? disk.bytesPerSecond / r.neededBytesPerToken : null;
        r.ratioToDiskBound = r.diskBoundTokensPerSecond ? r.tokensPerSecond / r.diskBoundTokensPerSecond : null;
      }
      runs.push(r);
    }
    const s = engine.stats();
    return {
      mode,
      pool,
      poolSlots: s.pool.capacity,
      records: s.pool.records,
      preloaded: s.resident.preloaded,
      lookahead: g.lookahead,
      chunkRows: g.prefillRows,
      warmupTokens,
      prompts: runs,
    };
  } finally {
    await engine.close();
    files.close();
  }
}

const f = (x: number, d = 1) => x.toFixed(d);
const mb = (b: number) => f(b / 1e6, 1);

function printMode(m: ModeRun, disk: DiskBandwidth | null, flopsPerToken: number): void {
  log(`\n## ${m.mode}: pool ${m.pool} (${m.poolSlots}/${m.records} records${m.preloaded ? ", preloaded" : ", emptied before each prompt"}), chunks of ${m.chunkRows} rows, lookahead ${m.lookahead ? "on" : "off"}, warm-up ${m.warmupTokens} tokens`);
  if (m.mode === "warm") {
    log("\n| prompt | chunks | ms | prompt tok/s | GPU ms (share) | io-wait ms | expert MB read | weight TFLOP/s | compute bound tok/s | of bound |");
    log("|---|---|---|---|---|---|---|---|---|---|");
    for (const r of m.prompts)
      log(
        `| ${r.promptTokens} | ${r.chunks} | ${f(r.ms, 0)} | **${f(r.tokensPerSecond)}** | ${f(r.gpuMs, 0)} (${f((100 * r.gpuMs) / r.ms, 0)}%) | ${f(r.ioWaitMs, 1)} | ${mb(r.readBytes)} | ${r.tflops.toPrecision(3)} | ${r.computeBoundTokensPerSecond ? f(r.computeBoundTokensPerSecond, 0) : "-"} | ${r.ratioToComputeBound ? `**${f(100 * r.ratioToComputeBound, 1)}%**` : "-"} |`,
      );
    log(`(weight TFLOP/s: 2 x the weights a prompt row multiplies by, ${(flopsPerToken / 1e9).toPrecision(3)} GFLOP/token, x tok/s; ${peakTflops === null ? "--peak-tflops T adds the compute bound, T over it" : `the compute bound: --peak-tflops ${peakTflops} over it`})`);
    return;
  }
  log(`disk: ${disk ? `${f(disk.bytesPerSecond / 1e9, 2)} GB/s direct random reads of ${disk.recordBytes} B records (${disk.mode}${disk.fallbackReason ? `: ${disk.fallbackReason}` : ""}${disk.records ? `, ${disk.records} records` : ""})` : "not measured"}`);
  log("\n| prompt | chunks | ms | prompt tok/s | expert MB read | needed MB/token | layer read / chunk | max reads of a record in a chunk | unrouted reads | io-wait ms | disk bound tok/s | of bound |");
  log("|---|---|---|---|---|---|---|---|---|---|---|---|");
  for (const r of m.prompts)
    log(
      `| ${r.promptTokens} | ${r.chunks} | ${f(r.ms, 0)} | **${f(r.tokensPerSecond)}** | ${mb(r.readBytes)} | ${f(r.neededBytesPerToken / 1e6, 2)} | ${f(100 * r.layerReadShare, 0)}% (max ${f(100 * r.maxLayerReadShare, 0)}%) | ${r.maxReadsPerRecord} | ${r.unroutedReads} | ${f(r.ioWaitMs, 0)} | ${r.diskBoundTokensPerSecond ? f(r.diskBoundTokensPerSecond) : "-"} | ${r.ratioToDiskBound ? `**${f(100 * r.ratioToDiskBound, 1)}%**` : "-"} |`,
    );
  log("(needed: the records a chunk routed to and read, each once at most; the disk bound is the disk's bandwidth over those bytes per token. Unrouted reads: lookahead predictions the chunk did not route to.)");
}

let tmp: string | null = null;
try {
  let dir = opts.model;
  if (!dir) {
    tmp = mkdtempSync(join(tmpdir(), "cherenkov-bench-prefill-"));
    dir = join(tmp, "model");
    await synthesize({ preset: (opts.preset ?? "small") as PresetName, seed: 1, out: dir, weights: "q4", workers: 0 });
  } else if (opts.preset) throw new Error("bench:prefill: give --model or --preset, not both");
  const files = await openModel(dir);
  const c = files.config;
  const layout = files.expertLayout;
  const flopsPerToken = weightFlopsPerToken(c, layout.parts);
  files.close();
  const name = opts.model ? basename(opts.model) : `${opts.preset ?? "small"} preset (synthetic, q4)`;
  log(`# bench:prefill (${backend} backend): ${name}, ${c.num_layers} layers, ${layout.layers} expert layers x ${layout.perLayer} experts, top-${c.moe.top_k}, ${layout.stride} B records; prompts ${prompts.join(", ")}`);
  let disk: DiskBandwidth | null = null;
  if (modes.includes("cold"))
    disk = opts.disk ? { bytesPerSecond: positiveNumber("disk", opts.disk), records: 0, recordBytes: layout.stride, mode: "--disk", fallbackReason: null } : await diskBandwidth(dir, { backend });
  const runs: ModeRun[] = [];
  for (const m of modes as ("warm" | "cold")[]) {
    const r = await runMode(dir, m, disk);
    runs.push(r);
    printMode(r, disk, flopsPerToken);
  }
  if (opts.json)
    console.log(
      JSON.stringify({
        bench: "prefill",
        backend,
        model: name,
        layers: c.num_layers,
        expertLayers: layout.layers,
        perLayer: layout.perLayer,
        topK: c.moe.top_k,
        recordBytes: layout.stride,
        weightFlopsPerToken: flopsPerToken,
        peakTflops,
        prompts,
        disk,
        modes: runs,
      }),
    );
} finally {
  if (tmp) rmSync(tmp, { recursive: true, force: true });
}
