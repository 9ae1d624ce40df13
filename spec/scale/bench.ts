/**
 * `bun run bench:scale`: a model larger than the machine's RAM on the streaming engine
 * (issue 23 item 3). Synthesizes the preset into --dir unless a model of that preset is
 * already there, then, in a child process of its own (so that the synthesis's memory is not
 * counted), loads it on the engine, prefills the prompt, decodes --tokens tokens while sampling
 * RSS, and prints: the model's size against RAM, the engine's planned budget (fixed buffers +
 * pool, against the working-set limit less the host reserve), the peak RSS (the kernel's
 * high-water mark where there is one), tokens/s, and the expert bytes read per token against
 * the disk: the disk's direct random-read bandwidth at the record size, measured here first
 * (or --disk BYTES_PER_S), over bytes per token gives the tokens/s the disk allows.
 *
 *   bun run bench:scale [--preset 80b-a3b-shape] [--dir DIR] [--tokens 8] [--prompt 4]
 *                       [--pool 25%] [--backend cpu|metal|cuda] [--disk BYTES_PER_S] [--json]
 *
 * Default --dir: $CHERENKOV_SCALE_DIR, else <tmpdir>/cherenkov-scale-<preset> (kept for the
 * next run: the 80b preset is 51 GB and takes minutes to write). Refuses to synthesize when
 * the disk has less free space than the model needs. --distinct-layers N generates only the
 * first N expert layers' random records and repeats them in the rest (synthesize's
 * distinctExpertLayers): 79 billion random weights take 7 minutes of two idle cores, hours of a
 * loaded machine; each layer still routes with its own router, so the streaming is the same.
 */
import { existsSync, readFileSync, statfsSync } from "node:fs";
import { tmpdir, totalmem } from "node:os";
import { dirname, join } from "node:path";
import { parseArgs } from "node:util";

import { Model } from "../../lib/api/model.ts";
import { presetConfig, presetNames, type PresetName } from "../../lib/convert/presets.ts";
import { formatBytes } from "../../lib/gpu/budget.ts";
import type { EngineBackendStats } from "../../lib/api/backend.ts";
import { readManifest } from "../../lib/model/format.ts";
import { plannedBytes } from "../../lib/model/writer.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import { Rng } from "../../lib/model/rng.ts";
import { defaultBackend, type Backend } from "../../lib/shim.ts";
import { diskBandwidth } from "../bench/disk-bandwidth.ts";

const ROOT = join(import.meta.dir, "..", "..");
const { values: o } = parseArgs({
  options: {
    preset: { type: "string", default: "80b-a3b-shape" },
    dir: { type: "string" },
    tokens: { type: "string", default: "8" },
    prompt: { type: "string", default: "4" },
    pool: { type: "string" },
    backend: { type: "string" },
    disk: { type: "string" },
    seed: { type: "string", default: "1" },
    "distinct-layers": { type: "string" },
    json: { type: "boolean", default: false },
    /** @internal The child's mode: load, decode, print one JSON line. */
    measure: { type: "boolean", default: false },
  },
});

const preset = o.preset as PresetName;
if (!presetNames.includes(preset)) throw new Error(`--preset ${o.preset}: expected one of ${presetNames.join(", ")}`);
const dir = o.dir ?? process.env.CHERENKOV_SCALE_DIR ?? join(tmpdir(), `cherenkov-scale-${preset}`);
const tokens = Number(o.tokens);
const promptTokens = Number(o.prompt);
const backend = (o.backend ?? defaultBackend()) as Backend;

/** What the child measures. */
interface Measured {
  backend: string;
  loadMs: number;
  prefillMs: number;
  decodeMs: number;
  tokens: number;
  tokensPerSecond: number;
  /** Expert bytes read from disk during decode, per decode token. */
  readBytesPerToken: number;
  poolHitRate: number;
  lookaheadAccuracy: number | null;
  workingSetLimit: number;
  hostReserveBytes: number;
  fixedBytes: number;
  poolBytes: number;
  poolReason: string;
  peakRss: number;
  peakRssSource: string;
  rssSamples: number;
}

/** The kernel's RSS high-water mark (Linux /proc VmHWM), else getrusage's maxRSS. */
function peakRss(): { bytes: number; source: string } {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync("/proc/self/status", "utf8"));
    if (m) return { bytes: Number(m[1]) * 1024, source: "VmHWM" };
  } catch {}
  const kb = process.resourceUsage().maxRSS;
  return { bytes: kb * (process.platform === "darwin" ? 1 : 1024), source: "getrusage" };
}

async function measure(): Promise<Measured> {
  let sampled = 0;
  let samples = 0;
  const timer = setInterval(() => {
    sampled = Math.max(sampled, process.memoryUsage().rss);
    samples++;
  }, 100);
  const t0 = performance.now();
  await using model = await Model.load(dir, { backend, engine: o.pool ? { pool: o.pool } : {} });
  const loadMs = performance.now() - t0;
  const engineStats = () => model.stats().engine as EngineBackendStats;
  const vocab = model.config.vocab_size;
  const r = new Rng(1, "bench-scale-prompt");
  const prompt = Array.from({ length: promptTokens }, () => r.int(vocab));
  const session = model.session();
  const p0 = performance.now();
  await session.append(prompt);
  const prefillMs = performance.now() - p0;
  const before = engineStats();
  const g = await session.generate({ maxTokens: tokens, stopAtEos: false });
  const after = engineStats();
  clearInterval(timer);
  session.close();
  const read = (s: EngineBackendStats) => s.io?.completedBytes ?? 0;
  const peak = peakRss();
  const m = after.memory;
  return {
    backend: after.backend,
    loadMs,
    prefillMs,
    decodeMs: g.timings.decodeMs,
    tokens: g.tokens.length,
    tokensPerSecond: g.timings.tokensPerSecond,
    readBytesPerToken: (read(after) - read(before)) / g.tokens.length,
    poolHitRate: after.pool.hitRate,
    lookaheadAccuracy: after.lookahead.predictions > 0 ? after.lookahead.accuracy : null,
    workingSetLimit: m.workingSetLimit,
    hostReserveBytes: m.hostReserveBytes,
    fixedBytes: m.fixedBytes,
    poolBytes: m.poolBytes,
    poolReason: m.poolReason,
    peakRss: Math.max(peak.bytes, sampled),
    peakRssSource: peak.source,
    rssSamples: samples,
  };
}

/** True when `dir` holds a model written from `preset` (its config equals the preset's). */
function hasPresetModel(): boolean {
  if (!existsSync(join(dir, "cherenkov.json"))) return false;
  return JSON.stringify(readManifest(dir).config) === JSON.stringify(presetConfig(preset));
}

async function ensureModel(): Promise<number | null> {
  if (hasPresetModel()) return null;
  const need = plannedBytes(presetConfig(preset), "q4");
  const parent = existsSync(dir) ? dir : dirname(dir);
  const fs = statfsSync(parent);
  const free = fs.bavail * fs.bsize;
  if (free < need * 1.02) throw new Error(`bench:scale: ${preset} needs ${formatBytes(need)} in ${dir}, the disk has ${formatBytes(free)} free (--dir elsewhere)`);
  const distinct = o["distinct-layers"] === undefined ? undefined : Number(o["distinct-layers"]);
  process.stderr.write(`bench:scale: synthesizing ${preset} (${formatBytes(need)}) into ${dir}${distinct ? `, the first ${distinct} expert layer(s) repeated in the rest` : ""}\n`);
  const t0 = performance.now();
  let shown = 0;
  await synthesize({
    preset,
    seed: Number(o.seed),
    out: dir,
    weights: "q4",
    force: true,
    distinctExpertLayers: distinct,
    onProgress: (done, total) => {
      if (done - shown < total / 20 && done < total) return;
      shown = done;
      process.stderr.write(`  ${((done / total) * 100).toFixed(0)}% (${((performance.now() - t0) / 1000).toFixed(0)} s)\n`);
    },
  });
  return (performance.now() - t0) / 1000;
}

if (o.measure) {
  process.stdout.write(JSON.stringify(await measure()) + "\n");
  process.exit(0);
}

const synthSeconds = await ensureModel();
const source = readManifest(dir).writer.source?.synth as { distinctExpertLayers?: number } | undefined;
const m = readManifest(dir);
const modelBytes = ["dense.bin", "experts.bin", "ple.bin"].reduce((s, f) => s + (existsSync(join(dir, f)) ? Bun.file(join(dir, f)).size : 0), 0);
const disk = o.disk ? Number(o.disk) : (await diskBandwidth(dir)).bytesPerSecond;
const args = [process.execPath, import.meta.path, "--measure", "--dir", dir, "--preset", preset, "--tokens", String(tokens), "--prompt", String(promptTokens), "--backend", backend, ...(o.pool ? ["--pool", o.pool] : [])];
const child = Bun.spawnSync(args, { stdout: "pipe", stderr: "inherit" });
if (child.exitCode !== 0) throw new Error(`bench:scale: the measuring process exited ${child.exitCode}`);
const r = JSON.parse(child.stdout.toString().trim().split("\n").pop()!) as Measured;
const ram = totalmem();
const budgetLimit = r.workingSetLimit - r.hostReserveBytes;
const planned = r.fixedBytes + r.poolBytes;
const diskTokensPerSecond = r.readBytesPerToken > 0 ? disk / r.readBytesPerToken : Infinity;
const result = {
  preset,
  dir,
  synthSeconds,
  distinctExpertLayers: source?.distinctExpertLayers ?? null,
  modelBytes,
  ram,
  records: m.experts.layers * m.experts.per_layer,
  recordBytes: m.experts.stride,
  diskBytesPerSecond: disk,
  diskTokensPerSecond,
  ...r,
  plannedBytes: planned,
  budgetLimitBytes: budgetLimit,
};
if (o.json) console.log(JSON.stringify(result));
else {
  const line = (k: string, v: string) => console.log(`${k.padEnd(22)}${v}`);
  line("model", `${preset}: ${formatBytes(modelBytes)} on disk (${(modelBytes / ram).toFixed(2)}x RAM)${synthSeconds !== null ? `, synthesized in ${synthSeconds.toFixed(0)} s` : ", reused"}${source?.distinctExpertLayers ? ` (expert layers repeat the first ${source.distinctExpertLayers})` : ""}`);
  line("RAM", formatBytes(ram));
  line("planned budget", `${formatBytes(planned)} = fixed ${formatBytes(r.fixedBytes)} + pool ${formatBytes(r.poolBytes)} (limit ${formatBytes(budgetLimit)} = working set ${formatBytes(r.workingSetLimit)} - host reserve ${formatBytes(r.hostReserveBytes)})`);
  line("pool", r.poolReason);
  line("peak RSS", `${formatBytes(r.peakRss)} (${r.peakRssSource}; ${r.peakRss <= budgetLimit ? "within" : "OVER"} the budget limit)`);
  line("backend", r.backend);
  line("load", `${(r.loadMs / 1000).toFixed(1)} s; prefill of ${promptTokens} tokens ${(r.prefillMs / 1000).toFixed(1)} s`);
  line("decode", `${r.tokens} tokens in ${(r.decodeMs / 1000).toFixed(1)} s: ${r.tokensPerSecond.toFixed(3)} tokens/s`);
  line("pool hit rate", `${(r.poolHitRate * 100).toFixed(1)}%${r.lookaheadAccuracy !== null ? `, lookahead ${(r.lookaheadAccuracy * 100).toFixed(0)}% accurate` : ""}`);
  line("read per token", `${formatBytes(r.readBytesPerToken)} of expert records`);
  line("disk bound", `${formatBytes(disk)}/s direct random reads${o.disk ? " (--disk)" : " (measured, 256 records)"}: at most ${diskTokensPerSecond.toFixed(3)} tokens/s; this run reached ${((r.tokensPerSecond / diskTokensPerSecond) * 100).toFixed(0)}%`);
}
