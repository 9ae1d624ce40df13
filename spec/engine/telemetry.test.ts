// Telemetry pieces: routed-expert activity, the latency histogram, memory counters, the
// stats() snapshot, and the routing-trace dump (JSON lines) round trip on a reference trace.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { ExpertActivity } from "../../lib/gpu/activity.ts";
import { planPool } from "../../lib/gpu/budget.ts";
import { MemoryTracker } from "../../lib/gpu/memory.ts";
import { createExpertPool } from "../../lib/gpu/residency.ts";
import { IoScheduler } from "../../lib/gpu/streaming.ts";
import { LatencyHistogram, StatsCollector } from "../../lib/gpu/telemetry.ts";
import { parseTrace, readTrace, TraceWriter, type TraceStep } from "../../lib/gpu/trace.ts";
import { generateGreedy } from "../../lib/reference/index.ts";
import { tinyModel, type TinyModel } from "./fixture.ts";

let tiny: TinyModel;
beforeAll(async () => {
  tiny = await tinyModel(5);
});
afterAll(() => tiny.cleanup());

test("activity counts every routed row per layer and expert, rolled-back rows included", () => {
  const act = new ExpertActivity(3, 8);
  // A verify step of 3 rows, top-2, on layer 1; then 2 of its rows are rolled back.
  act.record(1, 3, [0, 5, 5, 2, 0, 7], [0.6, 0.4, 0.7, 0.3, 0.5, 0.5]);
  act.noteRolledBack(2);
  act.recordStep({ experts: [[[1, 2]], [[5, 0]], [[7, 6]]], weights: [[[0.9, 0.1]], [[0.8, 0.2]], [[0.55, 0.45]]] });
  expect(act.count(1, 5)).toBe(3);
  expect(act.count(1, 0)).toBe(3);
  expect(act.count(0, 1)).toBe(1);
  const snap = act.snapshot();
  expect(snap.rows).toEqual([1, 4, 1]);
  expect(snap.rolledBackRows).toBe(2);
  expect(snap.counts[1]).toEqual([3, 0, 1, 0, 0, 3, 0, 1]);
  expect(snap.weights[1]![5]).toBeCloseTo(0.4 + 0.7 + 0.8, 12);
  // Totals: every (row, k) selection counted once.
  expect(snap.counts.flat().reduce((a, b) => a + b, 0)).toBe(6 + 6);
  expect(() => act.record(3, 1, [0])).toThrow(/layer 3 is not in 0\.\.2/);
  expect(() => act.record(0, 1, [8])).toThrow(/expert id 8 is not in 0\.\.7/);
  expect(() => act.record(0, 1, [1, 2], [1])).toThrow(/2 expert ids but 1 weights/);
  act.reset();
  expect(act.snapshot().counts.flat().every((c) => c === 0)).toBe(true);
});

test("latency percentiles land within a bucket (9%) of the true values", () => {
  const h = new LatencyHistogram();
  for (let i = 1; i <= 1000; i++) h.addMs(i / 10); // 100 us .. 100 ms
  const s = h.summary();
  expect(s.count).toBe(1000);
  expect(s.p50Us).toBeGreaterThanOrEqual(50_000);
  expect(s.p50Us).toBeLessThanOrEqual(50_000 * 1.091);
  expect(s.p99Us).toBeGreaterThanOrEqual(99_000);
  expect(s.p99Us).toBeLessThanOrEqual(100_000);
  expect(s.minUs).toBe(100);
  expect(s.maxUs).toBe(100_000);
  expect(s.meanUs).toBeCloseTo(50_050, 0);
  h.reset();
  expect(h.summary().p99Us).toBe(0);
});

test("stats() gathers pool, IO, lookahead, activity, memory and phases into plain JSON", async () => {
  const { stride, layers, perLayer } = tiny.model.expertLayout;
  const plan = planPool({
    deviceMaxWorkingSet: 1 << 30,
    fixedBytes: 4 << 20,
    hostReserveBytes: 0,
    recordStride: stride,
    expertLayers: layers,
    perLayer,
    topK: 2,
    poolFraction: 0.25,
  });
  const io = new IoScheduler();
  const pool = createExpertPool({ backing: "wired", model: tiny.model, capacity: plan.slots, scheduler: io });
  const memory = new MemoryTracker(1 << 30, 0);
  memory.addFixed("dense", 3 << 20);
  memory.addFixed("scratch", 1 << 20);
  memory.setPool(plan, "wired", stride);
  const activity = new ExpertActivity(layers, perLayer);
  const collector = new StatsCollector({ pool, io, activity, memory });

  const p = pool.prefetch(1, [2, 3]);
  const a = pool.acquire(1, [3, 4]);
  activity.record(1, 1, [3, 4]);
  await a.ready;
  await p.ready; // (1,2) is nobody's demand: wait for it too before counting completed bytes
  pool.release(1);
  collector.phases.add("router", 1.5);
  collector.phases.add("router", 0.5);

  const s = collector.stats();
  expect(JSON.parse(JSON.stringify(s))).toEqual(s);
  expect(s.pool).toMatchObject({ backing: "wired", capacity: plan.slots, hits: 1, misses: 1 });
  expect(s.lookahead).toMatchObject({ predictions: 2, used: 1 });
  expect(s.io!.requestedBytes).toBe(3 * stride);
  expect(s.io!.completedBytes).toBe(3 * stride);
  expect(s.io!.requestedByPriority).toEqual({ demand: stride, lookahead: 2 * stride, ngram: 0 });
  expect(s.activity.counts[1]![3]).toBe(1);
  expect(s.memory).toMatchObject({ fixedBytes: 4 << 20, poolSlots: plan.slots, poolBytes: plan.slots * stride, backing: "wired" });
  expect(s.memory.fixed).toEqual({ dense: 3 << 20, scratch: 1 << 20 });
  expect(s.memory.rss).toBeGreaterThan(0);
  expect(s.phases.router).toEqual({ count: 2, totalMs: 2, meanMs: 1, maxMs: 1.5 });
  expect(memory.fixedBytes).toBe(4 << 20);
  await pool.close();
  await io.close();
});

test("a routing trace dumped as JSON lines reads back identically (reference trace with verify steps)", () => {
  const gen = generateGreedy(tiny.model, [3, 1, 4, 1, 5], { maxTokens: 6, drafts: 2 });
  expect(gen.trace.some((s) => s.tokens.length > 1)).toBe(true);
  const path = join(tiny.dir, "trace.jsonl");
  const w = TraceWriter.open(path);
  const written: TraceStep[] = gen.trace.map((s, i) => ({
    ...s,
    misses: s.experts.map((rows) => [...new Set(rows.flat())].filter((e) => (e + i) % 3 === 0)),
    ...(i % 2 ? { predicted: s.experts.map((rows) => rows[0]!.slice(0, 1)) } : {}),
  }));
  for (const s of written) w.write(s);
  w.close();
  expect(w.steps).toBe(gen.trace.length);
  const back = readTrace(path);
  expect(back).toEqual(written);
  // Weights survive exactly (JSON keeps every double).
  expect(back[0]!.weights[0]![0]![0]).toBe(gen.trace[0]!.weights[0]![0]![0]!);
  expect(() => w.write(written[0]!)).toThrow(/already closed/);
});

test("traces also read as a JSON document (array, {trace}, tuples), and bad lines name file and line", () => {
  const step = { tokens: [7], experts: [[[1, 2]], [[3, 0]]], weights: [[[0.5, 0.5]], [[0.9, 0.1]]], misses: [[1], []] };
  const tuple = [step.tokens, step.experts, step.weights, step.misses];
  expect(parseTrace(JSON.stringify([step, step]), "a.json")).toEqual([step, step]);
  expect(parseTrace(JSON.stringify({ trace: [tuple] }), "b.json")).toEqual([step]);
  expect(parseTrace(JSON.stringify(tuple), "c.json")).toEqual([step]);
  // A reference Generation has no misses: they read as empty.
  expect(parseTrace(JSON.stringify({ tokens: [1], trace: [{ tokens: [7], experts: step.experts, weights: step.weights }] }), "g.json")[0]!.misses).toEqual([]);
  const path = join(tiny.dir, "bad.jsonl");
  writeFileSync(path, `${JSON.stringify(step)}\n{"tokens":[1],"experts":[[[0.5]]]}\n`);
  expect(() => readTrace(path)).toThrow(new RegExp(`${path.replace(/[.]/g, "\\.")}:2: experts must be \\[layer\\]\\[row\\]\\[k\\] integers`));
  writeFileSync(path, `${JSON.stringify(step)}\n{oops\n`);
  expect(() => readTrace(path)).toThrow(/bad\.jsonl:2: not valid JSON/);
  expect(() => readTrace(join(tiny.dir, "missing.jsonl"))).toThrow(/cannot read .*missing\.jsonl: ENOENT/);
  // Gzipped traces (the committed 64-expert ones) read the same; a .gz that is not gzip fails naming the file.
  const gz = join(tiny.dir, "steps.jsonl.gz");
  writeFileSync(gz, Bun.gzipSync(`${JSON.stringify(step)}\n${JSON.stringify(step)}\n`));
  expect(readTrace(gz)).toEqual([step, step]);
  writeFileSync(gz, JSON.stringify(step));
  expect(() => readTrace(gz)).toThrow(/steps\.jsonl\.gz is not valid gzip/);
});

test("training-run traces (spec/train/traces: flattened [layer][k] per decode step) read as steps", () => {
  // 3 layers, top-2: experts[t] = [l0k0, l0k1, l1k0, l1k1, l2k0, l2k1]; predicted[t] covers layers 1..2.
  const doc = {
    model: "m",
    layers: 3,
    topK: 2,
    experts: 8,
    excerpts: [
      { path: "a.py", tokens: [5, 6], experts: [[1, 2, 3, 4, 5, 6], [7, 0, 1, 2, 3, 4]], weights: [[0.6, 0.4, 0.5, 0.5, 0.9, 0.1], [1, 0, 1, 0, 1, 0]], predicted: [[3, 1, 5, 2], [1, 2, 3, 4]] },
      { tokens: [9], experts: [[0, 1, 2, 3, 4, 5]] },
    ],
  };
  const steps = parseTrace(JSON.stringify(doc), "t.json");
  expect(steps.length).toBe(3);
  expect(steps[0]).toEqual({
    tokens: [5],
    experts: [[[1, 2]], [[3, 4]], [[5, 6]]],
    weights: [[[0.6, 0.4]], [[0.5, 0.5]], [[0.9, 0.1]]],
    misses: [],
    predicted: [[], [3, 1], [5, 2]],
  });
  expect(steps[2]).toEqual({ tokens: [9], experts: [[[0, 1]], [[2, 3]], [[4, 5]]], weights: [], misses: [] });
  const bad = { ...doc, excerpts: [{ path: "b.py", tokens: [1], experts: [[1, 2, 3]] }] };
  expect(() => parseTrace(JSON.stringify(bad), "t.json")).toThrow(/t\.json: excerpt 0 \(b\.py\): step 0: experts has 3 ids, expected layers x topK = 6/);
});
