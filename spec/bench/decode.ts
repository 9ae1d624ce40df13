/**
 * `bun run bench:decode`: decode speed of the engine on the CPU backend (the Metal backend
 * when CHERENKOV_BACKEND=metal on a Mac), with the per-phase breakdown of a decode token and
 * the host/GPU handshake latency per layer. Models: the small preset (synthesized into a
 * temporary directory, q4) and examples/models/qwen4-exp-tiny; `--model DIR` adds one.
 *
 * Per model: the prompt runs as one prefill step, then `--tokens` decode steps are timed
 * (phases and handshakes are reset after the prefill). A last table measures the bare event
 * round trip: a command buffer of signal/wait pairs only, released by the same host loop the
 * engine uses, so the handshake's floor is seen apart from the host's pool work.
 *
 * Options: --tokens N (default 32), --prompt N (prompt tokens, default 32), --warmup N (decode
 * tokens run untimed first, plain and speculative alike, default 0: a step's first sights
 * record its tape and build its CUDA graph, and a speculative cycle has one shape per accept
 * count, so a short run of cycles pays more of that than plain decode does), --pool 50% |
 * --pool-slots N, --backing wired|mapped, --io direct|cached, --no-lookahead, --preload |
 * --no-preload (default: the engine's "auto", a preload when the pool holds every record, which
 * makes every MoE layer resident: no handshakes), --drafts N (also
 * time speculative decoding), --model DIR, --only-model (skip the two built-in models; with
 * --model), --json (one JSON object on stdout), --no-round-trip (skip the bare event round trip:
 * its 400 signal/wait pairs would fill a CUDA profile of the run), --auto (also generate
 * `--tokens` tokens through the Model API with `drafts: "auto"` and without, in pairs of
 * alternating order, --auto-runs times each (even; default 4) after a warm-up: issue 18 asks that auto never be
 * slower than plain; the medians are compared, and the pairs' ratios (geometric mean: each pair
 * timed back to back), single runs swing by a few percent), --pairs N (with --drafts: after the
 * runs above, N more of `--tokens` tokens each way timed back to back on two warmed sequences,
 * in alternating order (N even): a ratio of separate runs moves with the host's drift (on the
 * H200 the same cycles' host work took 2x longer in one process than in the next).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { parseArgs } from "node:util";
import { synthesize } from "../../lib/convert/synth.ts";
import { Engine } from "../../lib/gpu/engine.ts";
import { waitForSignal } from "../../lib/gpu/handshake.ts";
import type { EngineOptions } from "../../lib/gpu/load.ts";
import type { ResidentStats } from "../../lib/gpu/resident.ts";
import type { LatencySummary, PhaseStats } from "../../lib/gpu/telemetry.ts";
import { Model } from "../../lib/api/model.ts";
import { openModel } from "../../lib/model/format.ts";
import { defaultBackend, Device } from "../../lib/shim.ts";
import { median } from "./stats.ts";

const ROOT = join(import.meta.dir, "..", "..");
const { values: opts } = parseArgs({
  options: {
    tokens: { type: "string", default: "32" },
    prompt: { type: "string", default: "32" },
    warmup: { type: "string", default: "0" },
    pool: { type: "string" },
    "pool-slots": { type: "string" },
    backing: { type: "string", default: "wired" },
    io: { type: "string", default: "direct" },
    "no-lookahead": { type: "boolean", default: false },
    preload: { type: "boolean", default: false },
    "no-preload": { type: "boolean", default: false },
    drafts: { type: "string", default: "0" },
    model: { type: "string" },
    "only-model": { type: "boolean", default: false },
    json: { type: "boolean", default: false },
    "no-round-trip": { type: "boolean", default: false },
    auto: { type: "boolean", default: false },
    "auto-runs": { type: "string", default: "4" },
    pairs: { type: "string", default: "0" },
  },
});
const log = (s: string) => {
  if (!opts.json) console.log(s);
};
const backend = defaultBackend();
const tokens = Number(opts.tokens);
const warmup = Number(opts.warmup);
if (!Number.isInteger(warmup) || warmup < 0) throw new Error(`--warmup ${opts.warmup}: expected a token count (an integer >= 0)`);
const autoRuns = Number(opts["auto-runs"]);
// An even count: the pairs alternate their order (plain first, then auto first), which balances
// only over pairs of pairs. On the H200 every second run in time came 2-3% slower than the one
// before it, whatever it ran, so with 5 pairs the auto runs sat in the slow place 3 times of 5.
if (!Number.isInteger(autoRuns) || autoRuns < 2 || autoRuns % 2 !== 0)
  throw new Error(`--auto-runs ${opts["auto-runs"]}: expected an even whole number >= 2 (pairs in both orders, as many of each)`);
const promptLen = Number(opts.prompt);
const drafts = Number(opts.drafts);
const pairs = Number(opts.pairs);
if (!Number.isInteger(pairs) || pairs < 0 || pairs % 2 !== 0) throw new Error(`--pairs ${opts.pairs}: expected an even whole number (pairs in both orders, as many of each)`);

function engineOptions(): EngineOptions {
  const o: EngineOptions = { backing: opts.backing as "wired" | "mapped", ioMode: opts.io as "direct" | "cached", lookahead: !opts["no-lookahead"] };
  if (opts.pool) o.pool = opts.pool;
  if (opts["pool-slots"]) o.poolSlots = Number(opts["pool-slots"]);
  if (opts.preload) o.preload = true;
  if (opts["no-preload"]) o.preload = false;
  return o;
}

interface ModelResult {
  model: string;
  layers: number;
  experts: string;
  poolSlots: number;
  records: number;
  backing: string;
  lookahead: boolean;
  promptTokens: number;
  prefillMs: number;
  prefillTokensPerSecond: number;
  decodeTokens: number;
  decodeMs: number;
  tokensPerSecond: number;
  /** Per decode token, ms spent in each phase (phases.ts). */
  phasesPerToken: Record<string, number>;
  hitRate: number;
  lookahead_: { predictions: number; used: number; wasted: number };
  handshakeUs: { all: LatencySummary; perLayer: LatencySummary[] };
  /** Commands (dispatches, signals, waits) encoded per decode token, and host/GPU handshakes per token. */
  commandsPerToken: number;
  handshakesPerToken: number;
  /** The preload and the resident layers (no handshake at their sites) after the decode. */
  resident: ResidentStats;
  /** Expert bytes read from disk during the timed decode (for the disk bound). */
  decodeIoBytes: number;
  /** Commands and signals + waits in the committed command buffers per decode token. */
  committedPerToken: { commands: number; events: number };
  /**
   * Per speculative cycle: commands and signals + waits committed (a cycle's own buffer; the
   * ones prepared for other accept counts and released are not), host/GPU handshakes.
   */
  speculative?: {
    drafts: number;
    tokensPerSecond: number;
    proposed: number;
    accepted: number;
    cycles: number;
    /** Cycles that committed a buffer prepared while the cycle before ran (the others were encoded when they came). */
    preparedCycles: number;
    commandsPerCycle: number;
    eventsPerCycle: number;
    handshakesPerCycle: number;
    /** Wall ms per cycle (speculate() to speculate()). */
    msPerCycle: number;
    /** Per cycle, ms in each phase (phases.ts: step = commit -> completion, prepare = the next cycles encoded while it ran). */
    phasesPerCycle: Record<string, number>;
    /** Cycles whose preparing of the next ones ended after the GPU was done (the GPU waited on the host). */
    preparesOverran: number;
    /**
     * Tokens a cycle made (accepted drafts + 1): the speedup over plain decoding if a cycle cost
     * one plain step, the ceiling this text's acceptance sets whatever the engine does.
     */
    tokensPerCycle: number;
    /** A cycle's wall time in plain decode steps (msPerCycle over the plain run's ms per token): speedup = tokensPerCycle / this. */
    plainStepsPerCycle: number;
    /**
     * --pairs N: `tokens` tokens plainly and speculatively, timed back to back N times on two
     * warmed sequences (plain first, then speculative first, alternately): tok/s of each, and
     * the geometric mean and median of speculative / plain over the pairs.
     */
    pairs?: { plain: number[]; speculative: number[]; pairedRatio: number; medianRatio: number };
  };
  /** --auto: decode tok/s through the Model API without drafts and with drafts "auto" (--auto-runs runs each), and the counts auto chose. */
  auto?: {
    plain: number[];
    auto: number[];
    /** The last auto run's steps by draft count. */
    steps: number[];
    /** Every timed auto run's steps by draft count, in run order (which runs explored drafts). */
    stepsPerRun: number[][];
    /** The geometric mean of auto / plain over the pairs (each pair timed back to back). */
    pairedRatio: number;
    accepted: number;
    proposed: number;
  };
}

/** The geometric mean of xs[i] / base[i] over the pairs (run i of each was timed beside the other's). */
function pairedRatio(xs: number[], base: number[]): number {
  const logs = xs.map((x, i) => Math.log(x / base[i]!));
  return Math.exp(logs.reduce((x, y) => x + y, 0) / logs.length);
}

/** `n` pairs of `a` and `b` timed back to back, in alternating order (a first, then b first). */
async function alternately(n: number, a: () => Promise<void>, b: () => Promise<void>): Promise<void> {
  for (let i = 0; i < n; i++) {
    if (i % 2 === 0) {
      await a();
      await b();
    } else {
      await b();
      await a();
    }
  }
}

/** Decode tok/s of `tokens` tokens after `prompt` through the Model API, plain and with drafts "auto", alternately. */
async function autoDrafts(dir: string, prompt: number[]): Promise<NonNullable<ModelResult["auto"]>> {
  const model = await Model.load(dir, { backend: backend as "cpu", engine: engineOptions(), prefillChunk: Math.max(prompt.length, 1) });
  try {
    const run = (drafts: "auto" | undefined) => model.generate(prompt, { maxTokens: tokens, stopAtEos: false, ...(drafts ? { drafts } : {}) });
    await run(undefined);
    await run("auto");
    const out: NonNullable<ModelResult["auto"]> = { plain: [], auto: [], steps: [], stepsPerRun: [], pairedRatio: NaN, accepted: 0, proposed: 0 };
    // Pairs in ABBA order (plain first in even pairs, auto first in odd ones): on the H200 the
    // auto runs, always second, came 1-2% behind with no exploration in them; this tells
    // whether the order is why.
    const runAuto = async () => {
      const a = await run("auto");
      out.auto.push(a.timings.tokensPerSecond);
      out.steps = a.drafts?.steps ?? [];
      out.stepsPerRun.push(out.steps);
      out.accepted = a.drafts?.accepted ?? 0;
      out.proposed = a.drafts?.proposed ?? 0;
    };
    const runPlain = async () => {
      out.plain.push((await run(undefined)).timings.tokensPerSecond);
    };
    await alternately(autoRuns, runPlain, runAuto);
    out.pairedRatio = pairedRatio(out.auto, out.plain);
    return out;
  } finally {
    await model.close();
  }
}

/** A deterministic prompt of in-vocabulary ids. */
const promptFor = (vocab: number) => Array.from({ length: promptLen }, (_, i) => (37 * i + 11) % Math.min(vocab, 256));

async function benchModel(dir: string, name: string): Promise<ModelResult> {
  const files = await openModel(dir);
  const c = files.config;
  const engine = await Engine.load(files, backend, { ...engineOptions(), prefillChunk: Math.max(promptLen, 1) });
  try {
    const seq = engine.newSequence();
    const prompt = promptFor(c.vocab_size);
    let t0 = performance.now();
    let r = await seq.forward(prompt);
    const prefillMs = performance.now() - t0;
    engine.resetTimings();
    let next = r.next[r.next.length - 1]!;
    for (let i = 0; i < warmup; i++) next = (await seq.forward([next])).next[0]!;
    engine.resetTimings();
    const ioBytes = () => ((engine.stats() as { io: { completedBytes: number } | null }).io?.completedBytes ?? 0);
    const ioBefore = ioBytes();
    const device = engine.gpu.device;
    const commandsBefore = device.commandsEncoded;
    const committedBefore = { commands: device.commandsCommitted, events: device.eventsCommitted };
    t0 = performance.now();
    for (let i = 0; i < tokens; i++) next = (await seq.forward([next])).next[0]!;
    const decodeMs = performance.now() - t0;
    const commandsPerToken = (device.commandsEncoded - commandsBefore) / tokens;
    const committedPerToken = { commands: (device.commandsCommitted - committedBefore.commands) / tokens, events: (device.eventsCommitted - committedBefore.events) / tokens };
    const decodeIoBytes = ioBytes() - ioBefore;
    const s = engine.stats() as {
      phases: PhaseStats;
      pool: { capacity: number; records: number; hitRate: number; backing: string };
      lookahead: { predictions: number; used: number; wasted: number };
      handshake: { all: LatencySummary; perLayer: LatencySummary[] };
      resident: ResidentStats;
    };
    const phasesPerToken: Record<string, number> = {};
    for (const [k, v] of Object.entries(s.phases)) phasesPerToken[k] = v.totalMs / tokens;
    const result: ModelResult = {
      model: name,
      layers: c.num_layers,
      experts: `${c.moe.experts} x top-${c.moe.top_k}`,
      poolSlots: s.pool.capacity,
      records: s.pool.records,
      backing: s.pool.backing,
      lookahead: engine.gpu.lookahead,
      promptTokens: prompt.length,
      prefillMs,
      prefillTokensPerSecond: prompt.length / (prefillMs / 1000),
      decodeTokens: tokens,
      decodeMs,
      tokensPerSecond: tokens / (decodeMs / 1000),
      phasesPerToken,
      hitRate: s.pool.hitRate,
      lookahead_: s.lookahead,
      handshakeUs: s.handshake,
      commandsPerToken,
      committedPerToken,
      handshakesPerToken: s.handshake.all.count / tokens,
      resident: s.resident,
      decodeIoBytes,
    };
    seq.dispose();
    if (drafts > 0 && engine.gpu.maxDrafts > 0) {
      const spec = engine.newSequence();
      r = await spec.forward(prompt, { nextDrafts: drafts }); // the first cycle is encoded while the prompt runs
      next = r.next[r.next.length - 1]!;
      for (let warm = 0; warm < warmup; ) {
        const x = await spec.speculate(next, drafts);
        warm += x.next.length;
        next = x.next[x.next.length - 1]!;
      }
      let made = 0;
      let proposed = 0;
      let accepted = 0;
      let cycles = 0;
      engine.resetTimings();
      const before = { commands: device.commandsCommitted, events: device.eventsCommitted, prepared: engine.speculativeCycles.prepared };
      t0 = performance.now();
      while (made < tokens) {
        const x = await spec.speculate(next, drafts);
        made += x.next.length;
        proposed += x.proposed;
        accepted += x.next.length - 1;
        cycles++;
        next = x.next[x.next.length - 1]!;
      }
      const specMs = performance.now() - t0;
      const tokensPerSecond = made / (specMs / 1000);
      const specStats = engine.stats() as { handshake: { all: LatencySummary }; phases: PhaseStats };
      const handshakes = specStats.handshake.all.count;
      const phasesPerCycle: Record<string, number> = {};
      for (const [k, v] of Object.entries(specStats.phases)) phasesPerCycle[k] = v.totalMs / cycles;
      result.speculative = {
        drafts,
        tokensPerSecond,
        proposed,
        accepted,
        cycles,
        preparedCycles: engine.speculativeCycles.prepared - before.prepared,
        commandsPerCycle: (device.commandsCommitted - before.commands) / cycles,
        eventsPerCycle: (device.eventsCommitted - before.events) / cycles,
        handshakesPerCycle: handshakes / cycles,
        msPerCycle: specMs / cycles,
        phasesPerCycle,
        preparesOverran: specStats.phases["prepare-overran"]?.count ?? 0,
        tokensPerCycle: made / cycles,
        plainStepsPerCycle: specMs / cycles / (decodeMs / tokens),
      };
      spec.dispose();
      if (pairs > 0) result.speculative.pairs = await timedPairs(engine, prompt, drafts);
    }
    await engine.close();
    if (opts.auto) result.auto = await autoDrafts(dir, prompt);
    return result;
  } finally {
    await engine.close();
    files.close();
  }
}

/**
 * --pairs: plain and speculative decoding of `tokens` tokens timed back to back, `pairs` times,
 * on two sequences warmed by `warmup` tokens each. The host's speed drifts from run to run and
 * within one (on the H200's host one process prepared the same cycles 2x slower than the next),
 * and a cycle has more host work than a plain step: a pair sees the same drift on both sides.
 */
async function timedPairs(engine: Engine, prompt: number[], k: number): Promise<NonNullable<NonNullable<ModelResult["speculative"]>["pairs"]>> {
  const plainSeq = engine.newSequence();
  const specSeq = engine.newSequence();
  try {
    let p = (await plainSeq.forward(prompt)).next.at(-1)!;
    let s = (await specSeq.forward(prompt, { nextDrafts: k })).next.at(-1)!;
    for (let i = 0; i < warmup; i++) p = (await plainSeq.forward([p])).next[0]!;
    for (let made = 0; made < warmup; ) {
      const x = await specSeq.speculate(s, k);
      made += x.next.length;
      s = x.next.at(-1)!;
    }
    const plain: number[] = [];
    const speculative: number[] = [];
    const runPlain = async () => {
      const t0 = performance.now();
      for (let i = 0; i < tokens; i++) p = (await plainSeq.forward([p])).next[0]!;
      plain.push(tokens / ((performance.now() - t0) / 1000));
    };
    const runSpeculative = async () => {
      const t0 = performance.now();
      let made = 0;
      while (made < tokens) {
        const x = await specSeq.speculate(s, k);
        made += x.next.length;
        s = x.next.at(-1)!;
      }
      speculative.push(made / ((performance.now() - t0) / 1000));
    };
    await alternately(pairs, runPlain, runSpeculative);
    return { plain, speculative, pairedRatio: pairedRatio(speculative, plain), medianRatio: median(speculative.map((x, i) => x / plain[i]!)) };
  } finally {
    plainSeq.dispose();
    specSeq.dispose();
  }
}

/** The bare handshake: signal/wait pairs in one command buffer, released by the engine's host loop. */
async function eventRoundTrip(pairs: number, reps: number): Promise<{ pairs: number; reps: number; meanUs: number; p50Us: number }> {
  const device = Device.open({ backend });
  const event = device.event();
  let value = 0;
  const samples: number[] = [];
  try {
    for (let r = 0; r < reps; r++) {
      const cb = device.commandBuffer();
      const base = value;
      for (let i = 0; i < pairs; i++) cb.signal(event, base + 2 * i + 1).wait(event, base + 2 * i + 2);
      value = base + 2 * pairs;
      cb.commit();
      let last = performance.now();
      for (let i = 0; i < pairs; i++) {
        await waitForSignal(cb, event, base + 2 * i + 1, `pair ${i}`);
        const now = performance.now();
        if (i > 0) samples.push(now - last); // release of i-1 -> signal of i seen: one GPU/host round trip
        event.set(base + 2 * i + 2);
        last = performance.now();
      }
      cb.waitUntilCompleted();
      cb.release();
    }
  } finally {
    event.release();
    device.close();
  }
  samples.sort((a, b) => a - b);
  const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
  return { pairs, reps, meanUs: mean * 1000, p50Us: samples[Math.floor(samples.length / 2)]! * 1000 };
}

const pad = (s: string | number, n: number) => String(s).padStart(n);
const fmt = (x: number, d = 1) => x.toFixed(d);

function printModel(r: ModelResult): void {
  log(`\n## ${r.model}: ${r.layers} layers, experts ${r.experts}, pool ${r.poolSlots}/${r.records} slots (${r.backing}), lookahead ${r.lookahead ? "on" : "off"}`);
  log(`prefill ${r.promptTokens} tokens: ${fmt(r.prefillMs, 0)} ms (${fmt(r.prefillTokensPerSecond)} tok/s)`);
  log(`decode ${r.decodeTokens} tokens: ${fmt(r.decodeMs, 0)} ms, **${fmt(r.tokensPerSecond, 2)} tok/s**, ${fmt(r.decodeMs / r.decodeTokens, 1)} ms/token; pool hit rate ${fmt(100 * r.hitRate)}%` +
    `; lookahead predictions ${r.lookahead_.predictions} (used ${r.lookahead_.used}, wasted ${r.lookahead_.wasted})`);
  const res = r.resident;
  log(`resident: ${res.fullyResident ? "fully resident" : "not fully resident"}, ${res.residentLayers}/${res.layers} expert layers without handshakes; preload ${res.preload}` +
    (res.preloaded ? `: ${res.preloadRecords} records in ${fmt(res.preloadMs, 0)} ms` : ": none") + (res.unavailable ? ` (${res.unavailable})` : ""));
  log(`per decode token: ${fmt(r.commandsPerToken, 0)} commands encoded (${fmt(r.committedPerToken.commands, 0)} committed, ${fmt(r.committedPerToken.events, 1)} signals + waits), ${fmt(r.handshakesPerToken, 1)} host/GPU handshakes`);
  const sp = r.speculative;
  if (sp)
    log(
      `speculative, ${sp.drafts} drafts: ${fmt(sp.tokensPerSecond, 2)} tok/s (${fmt(sp.tokensPerSecond / r.tokensPerSecond, 2)}x plain), accepted ${sp.accepted}/${sp.proposed} in ${sp.cycles} cycles (${sp.preparedCycles} prepared ahead); ` +
        `per cycle ${fmt(sp.commandsPerCycle, 1)} commands committed, ${fmt(sp.eventsPerCycle, 1)} signals + waits, ${fmt(sp.handshakesPerCycle, 1)} handshakes; ` +
        `${fmt(sp.msPerCycle, 3)} ms a cycle: ${["encode", "step", "gpu", "prepare"].map((k) => `${k} ${fmt(sp.phasesPerCycle[k] ?? 0, 3)}`).join(", ")} ms; ` +
        `${sp.preparesOverran} of ${sp.cycles} cycles' prepares ended after the GPU was done; ` +
        `${fmt(sp.tokensPerCycle, 2)} tokens a cycle (at most ${fmt(sp.tokensPerCycle, 2)}x plain on this text, at a cycle costing one plain step), a cycle cost ${fmt(sp.plainStepsPerCycle, 2)} plain steps`,
    );
  if (sp?.pairs)
    log(
      `${sp.pairs.plain.length} pairs of ${r.decodeTokens} tokens timed back to back: speculative ${sp.pairs.speculative.map((x) => fmt(x, 0)).join(" / ")} tok/s against plain ` +
        `${sp.pairs.plain.map((x) => fmt(x, 0)).join(" / ")}: **${fmt(sp.pairs.pairedRatio, 2)}x** (geometric mean of the pairs; median ${fmt(sp.pairs.medianRatio, 2)}x)`,
    );
  const au = r.auto;
  if (au)
    log(
      `drafts "auto" through the Model API: ${au.auto.map((x) => fmt(x, 1)).join(" / ")} tok/s against plain ${au.plain.map((x) => fmt(x, 1)).join(" / ")} ` +
        `(medians ${fmt(median(au.auto) / median(au.plain), 3)}x, pairs ${fmt(au.pairedRatio, 3)}x, ${fmt(Math.min(...au.auto) / Math.max(...au.plain), 2)}x at worst); each auto run's steps by draft count ${au.stepsPerRun.map((x) => JSON.stringify(x)).join(" ")}, the last run accepted ${au.accepted}/${au.proposed}`,
    );
  log("\n| phase (per decode token) | ms |");
  log("|---|---|");
  for (const k of ["step", "gpu", "gpu-wait", "handshake", "io-wait", "tail", "encode", "prepare", "prepare-overran"]) if (r.phasesPerToken[k] !== undefined) log(`| ${k} | ${fmt(r.phasesPerToken[k]!, 2)} |`);
  log("\n| layer | handshake mean us | p50 | p99 | max |");
  log("|---|---|---|---|---|");
  r.handshakeUs.perLayer.forEach((h, l) => {
    if (h.count) log(`| ${l === r.layers ? "mtp" : l} | ${pad(fmt(h.meanUs), 6)} | ${fmt(h.p50Us)} | ${fmt(h.p99Us)} | ${fmt(h.maxUs)} |`);
  });
  log(`| all | ${fmt(r.handshakeUs.all.meanUs)} | ${fmt(r.handshakeUs.all.p50Us)} | ${fmt(r.handshakeUs.all.p99Us)} | ${fmt(r.handshakeUs.all.maxUs)} |`);
}

const results: ModelResult[] = [];
const tmp = mkdtempSync(join(tmpdir(), "cherenkov-bench-decode-"));
try {
  log(`# bench:decode (${backend} backend, ${tokens} decode tokens after a ${promptLen}-token prompt)`);
  const small = join(tmp, "small");
  const builtIn = opts["only-model"] && opts.model ? [] : [[small, "small preset (synthetic, q4)"], [join(ROOT, "examples", "models", "qwen4-exp-tiny"), "qwen4-exp-tiny"]];
  if (builtIn.length) await synthesize({ preset: "small", seed: 1, out: small, weights: "q4", workers: 0 });
  for (const [dir, name] of [...builtIn, ...(opts.model ? [[opts.model, basename(opts.model)]] : [])] as [string, string][]) {
    const r = await benchModel(dir, name);
    results.push(r);
    printModel(r);
  }
  const rt = opts["no-round-trip"] ? null : await eventRoundTrip(8, 50);
  if (rt) log(`\nbare event round trip (release -> next signal seen, ${rt.pairs} pairs x ${rt.reps}): mean ${fmt(rt.meanUs)} us, p50 ${fmt(rt.p50Us)} us`);
  if (opts.json) console.log(JSON.stringify({ backend, tokens, warmup, promptTokens: promptLen, models: results, eventRoundTrip: rt }));
} finally {
  rmSync(tmp, { recursive: true, force: true });
}
