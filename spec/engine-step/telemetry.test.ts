// The engine's telemetry: routing traces (equal to the reference's routing, step by step),
// stats() (activity, pool, IO, lookahead, memory, phases, handshake latency per layer) that
// add up, CHERENKOV_LAYERS bisecting, and the CLI's engine flags.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import { main } from "../../lib/cli/main.ts";
import { readTrace } from "../../lib/gpu/trace.ts";
import { openModel } from "../../lib/model/format.ts";
import { generateGreedy } from "../../lib/reference/index.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { greedy, openEngine, maxWeightError, ROUTER_WEIGHT_TOLERANCE, tempDir } from "./helpers.ts";
import { BACKEND } from "../selected-backend.ts";

const c = goldenCases.find((x) => x.name === "tiny-all-s2")!;
const N = 8;
let dir: string;
const tmp = tempDir("engine-telemetry");

beforeAll(async () => {
  dir = await buildGoldenModel(c);
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
  tmp.remove();
});

interface Stats {
  pool: { hits: number; misses: number; capacity: number; records: number; backing: string; perLayer: { hits: number[]; misses: number[] } };
  io: { requestedBytes: number; completedBytes: number; reads: number; requestedByPriority: { demand: number; lookahead: number } } | null;
  lookahead: { predictions: number; used: number; wasted: number };
  activity: { rows: number[]; counts: number[][] };
  memory: { poolSlots: number; fixed: Record<string, number> };
  phases: Record<string, { count: number; totalMs: number }>;
  handshake: { all: { count: number }; perLayer: { count: number; meanUs: number }[] };
  setup: { layersRun: number; notes: string[] };
}

describe("routing traces", () => {
  test("the engine's trace equals the reference's routing, step by step", async () => {
    const path = join(tmp.dir, "trace.jsonl");
    const backend = await openEngine(dir, { trace: path, pool: "50%" });
    await greedy(backend, c.prompt, N);
    await backend.close();
    const steps = readTrace(path);
    const files = await openModel(dir);
    const ref = generateGreedy(files, c.prompt, { maxTokens: N });
    files.close();
    // One step per forward on both: the prefill, then N - 1 decode rows.
    expect(steps).toHaveLength(N);
    expect(ref.trace).toHaveLength(N);
    steps.forEach((s, i) => {
      expect(s.tokens).toEqual(ref.trace[i]!.tokens);
      expect(s.experts).toEqual(ref.trace[i]!.experts);
      expect(maxWeightError(s.weights, ref.trace[i]!.weights)).toBeLessThan(ROUTER_WEIGHT_TOLERANCE);
      expect(s.misses).toHaveLength(4);
    });
    // Step 0 (prefill) routes every row: with a cold pool, every expert of its union misses.
    expect(steps[0]!.misses[0]!.length).toBe(new Set(steps[0]!.experts[0]!.flat()).size);
    expect(steps.some((s) => s.predicted !== undefined)).toBe(true);
  });
});

describe("stats()", () => {
  test("activity, pool, IO, lookahead, phases and handshakes add up", async () => {
    const backend = await openEngine(dir, { pool: "50%" });
    const { tokens } = await greedy(backend, c.prompt, N);
    expect(tokens).toHaveLength(N);
    const s = backend.stats() as unknown as Stats;
    await backend.close();
    expect(JSON.parse(JSON.stringify(s))).toEqual(s);
    const rows = c.prompt.length + N - 1;
    const L = 4;
    for (let l = 0; l < L; l++) {
      expect(s.activity.rows[l]).toBe(rows);
      expect(s.activity.counts[l]!.reduce((a, b) => a + b, 0)).toBe(rows * 2);
    }
    expect(s.activity.rows[L]).toBe(0); // the MTP head never ran
    expect(s.pool.capacity).toBe(s.pool.records / 2);
    expect(s.pool.hits + s.pool.misses).toBeGreaterThan(0);
    expect(s.io!.reads).toBeGreaterThanOrEqual(s.pool.misses);
    expect(s.io!.completedBytes).toBeLessThanOrEqual(s.io!.requestedBytes);
    expect(s.io!.requestedByPriority.lookahead).toBeGreaterThan(0);
    expect(s.lookahead.predictions).toBeGreaterThan(0);
    expect(s.lookahead.used + s.lookahead.wasted).toBeLessThanOrEqual(s.lookahead.predictions);
    expect(s.memory.poolSlots).toBe(s.pool.capacity);
    expect(s.memory.fixed["dense.bin"]).toBeGreaterThan(0);
    expect(s.phases.step!.count).toBe(N);
    expect(s.phases.handshake!.count).toBe(N * L);
    expect(s.handshake.all.count).toBe(N * L);
    for (let l = 0; l < L; l++) expect(s.handshake.perLayer[l]!.count).toBe(N);
  });

  test("with every trunk record resident (pool 100% without preload, all experts routed once) steps route no lookahead, and the tokens stay those without it", async () => {
    const run = async (lookahead: boolean) => {
      const backend = await openEngine(dir, { pool: "100%", lookahead, preload: false });
      const seq = backend.newSequence();
      const tokens: number[] = [];
      let covered = -1; // the step after which every expert of every trunk layer had been routed
      const predictionsAt: number[] = [];
      let r = await seq.forward(c.prompt);
      for (let step = 0; step < 48; step++) {
        tokens.push(r.next[r.next.length - 1]!);
        const s = backend.stats() as unknown as Stats;
        predictionsAt.push(s.lookahead.predictions);
        if (covered < 0 && s.activity.counts.slice(0, 4).every((counts) => counts.every((n) => n > 0))) covered = step;
        r = await seq.forward([tokens[tokens.length - 1]!]);
      }
      await backend.close();
      return { tokens, covered, predictionsAt };
    };
    const on = await run(true);
    const off = await run(false);
    expect(on.tokens).toEqual(off.tokens);
    expect(on.covered).toBeGreaterThanOrEqual(0); // the test needs full coverage to say anything
    expect(on.covered).toBeLessThan(40);
    // Before coverage the lookahead predicted; from the step after it, never again.
    expect(on.predictionsAt[on.covered]!).toBeGreaterThan(0);
    expect(new Set(on.predictionsAt.slice(on.covered + 1))).toEqual(new Set([on.predictionsAt[on.covered + 1]!]));
  });

  test("without the lookahead nothing is predicted; the mapped backing reads nothing itself", async () => {
    const backend = await openEngine(dir, { pool: "50%", lookahead: false, backing: "mapped" });
    await greedy(backend, c.prompt, 4);
    const s = backend.stats() as unknown as Stats;
    await backend.close();
    expect(s.lookahead.predictions).toBe(0);
    expect(s.io).toBeNull();
    expect(s.pool.backing).toBe("mapped");
    expect(s.pool.misses).toBeGreaterThan(0);
  });

  test("CHERENKOV_LAYERS=N runs only the first N blocks", async () => {
    const saved = process.env.CHERENKOV_LAYERS;
    process.env.CHERENKOV_LAYERS = "2";
    try {
      const backend = await openEngine(dir);
      const { tokens } = await greedy(backend, c.prompt, 3);
      const s = backend.stats() as unknown as Stats;
      await backend.close();
      expect(tokens).toHaveLength(3);
      expect(s.setup.layersRun).toBe(2);
      expect(s.setup.notes.join(" ")).toContain("first 2 of 4 blocks");
      expect(s.activity.rows.slice(0, 2)).toEqual([c.prompt.length + 2, c.prompt.length + 2]);
      expect(s.activity.rows.slice(2)).toEqual([0, 0, 0]);
    } finally {
      if (saved === undefined) delete process.env.CHERENKOV_LAYERS;
      else process.env.CHERENKOV_LAYERS = saved;
    }
  });
});

test("Model.load reports its progress in bytes, ending at the total", async () => {
  const calls: [number, number][] = [];
  const model = await Model.load(dir, { backend: BACKEND, onProgress: (done, total) => calls.push([done, total]) });
  await model.close();
  expect(calls.length).toBeGreaterThan(1);
  const [done, total] = calls[calls.length - 1]!;
  expect(done).toBe(total);
  expect(total).toBeGreaterThan(0);
  for (let i = 1; i < calls.length; i++) expect(calls[i]![0]).toBeGreaterThanOrEqual(calls[i - 1]![0]);
});

describe("cherenkov run with engine flags", () => {
  test(`--backend ${BACKEND} --pool 50% --backing mapped --no-lookahead --stats=json --json --trace`, async () => {
    let stdout = "";
    let stderr = "";
    const trace = join(tmp.dir, "cli-trace.jsonl");
    const code = await main(
      ["run", dir, "--prompt-tokens", c.prompt.join(","), "--max-tokens", "5", "--backend", BACKEND, "--pool", "50%", "--backing", "mapped", "--no-lookahead", "--stats=json", "--json", "--trace", trace],
      { stdout: (t) => (stdout += t), stderr: (t) => (stderr += t), stderrIsTTY: false },
    );
    expect({ code, stderr }).toEqual({ code: 0, stderr: "" });
    const out = JSON.parse(stdout) as { tokens: number[]; stats: { backend: string; engine: Stats } };
    expect(out.stats.backend).toBe(BACKEND);
    expect(out.stats.engine.pool.backing).toBe("mapped");
    expect(out.stats.engine.pool.capacity).toBe(out.stats.engine.pool.records / 2);
    expect(out.stats.engine.lookahead.predictions).toBe(0);
    expect(readFileSync(trace, "utf8").trim().split("\n")).toHaveLength(5);
    let err = "";
    const bad = await main(["run", dir, "--prompt-tokens", "1,2", "--backend", BACKEND, "--pool-slots", "1"], { stdout: () => {}, stderr: (t) => (err += t), stderrIsTTY: false });
    expect(bad).toBe(2);
    expect(err).toContain("too small");
  });

  test("--io cached: the wired pool reads through the page cache; bad values and --backing mapped are usage errors", async () => {
    let out = "";
    const code = await main(["run", dir, "--prompt-tokens", c.prompt.join(","), "--max-tokens", "2", "--backend", BACKEND, "--io", "cached", "--stats", "--json"], {
      stdout: (t) => (out += t),
      stderr: () => {},
      stderrIsTTY: false,
    });
    expect(code).toBe(0);
    expect(JSON.parse(out).stats.engine.io.mode).toBe("cached");
    for (const [args, message] of [
      [["--io", "mmap"], /--io/],
      [["--io", "cached", "--backing", "mapped"], "--io applies to --backing wired"],
    ] as const) {
      let err = "";
      const bad = await main(["run", dir, "--prompt-tokens", "1,2", "--backend", BACKEND, ...args], { stdout: () => {}, stderr: (t) => (err += t), stderrIsTTY: false });
      expect(bad).toBe(2);
      expect(err).toMatch(message);
    }
  });
});
