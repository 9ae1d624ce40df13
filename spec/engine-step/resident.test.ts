// The resident fast path (lib/gpu/resident.ts, docs/engine.md "Resident layers"): with the
// preload at pool 100% every MoE site runs without a host handshake and without lookahead
// routes, and the tokens stay the golden ones; below 100% every site keeps its handshake; the
// host still checks and records every layer's routing; speculative decoding and rollbacks stay
// exact; a table can never outlive the slots it names; a bad experts.bin fails the preload clearly.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, cpSync, openSync, readFileSync, readSync, rmSync, truncateSync, writeSync } from "node:fs";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import { main } from "../../lib/cli/main.ts";
import { Engine } from "../../lib/gpu/engine.ts";
import type { EngineOptions } from "../../lib/gpu/load.ts";
import { PreloadError, type ResidentStats } from "../../lib/gpu/resident.ts";
import { fsRead, IoReadError, type PositionalReader } from "../../lib/gpu/streaming.ts";
import { readTrace } from "../../lib/gpu/trace.ts";
import { ChecksumMismatchError } from "../../lib/model/errors.ts";
import { openModel } from "../../lib/model/format.ts";
import { generateGreedy } from "../../lib/reference/index.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel, type GoldenRecord } from "../golden/golden.ts";
import { goldenRecord, maxWeightError, ROUTER_WEIGHT_TOLERANCE, tempDir } from "./helpers.ts";
import { BACKEND } from "../selected-backend.ts";

const c = goldenCases.find((x) => x.name === "tiny-all-s1")!;
let dir: string;
let want: GoldenRecord;
const tmp = tempDir("resident");
const L = 4; // the tiny preset's trunk layers

beforeAll(async () => {
  dir = await buildGoldenModel(c);
  want = await goldenRecord(c.name);
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
  tmp.remove();
});

interface Stats {
  pool: { hits: number; misses: number; capacity: number; records: number };
  lookahead: { predictions: number };
  activity: { rows: number[]; counts: number[][]; rolledBackRows: number };
  handshake: { all: { count: number } };
  resident: ResidentStats;
}

interface Run {
  tokens: number[];
  stats: Stats;
  /** Commands encoded and handshakes per decode step (after the prompt). */
  commandsPerToken: number;
  handshakesPerToken: number;
}

/** Greedy decoding of the golden case on an Engine (so commandsEncoded can be read). */
async function run(opts: EngineOptions, n = c.maxTokens, from = dir): Promise<Run> {
  const files = await openModel(from);
  const engine = await Engine.load(files, BACKEND, opts);
  try {
    const seq = engine.newSequence();
    const first = await seq.forward(c.prompt);
    const tokens = [first.next[first.next.length - 1]!];
    const cmds0 = engine.gpu.device.commandsEncoded;
    const hs0 = (engine.stats() as unknown as Stats).handshake.all.count;
    while (tokens.length < n) tokens.push((await seq.forward([tokens[tokens.length - 1]!])).next[0]!);
    const stats = engine.stats() as unknown as Stats;
    return {
      tokens,
      stats,
      commandsPerToken: (engine.gpu.device.commandsEncoded - cmds0) / (n - 1),
      handshakesPerToken: (stats.handshake.all.count - hs0) / (n - 1),
    };
  } finally {
    await engine.close();
    files.close();
  }
}

describe("tokens and handshakes", () => {
  let preloaded: Run;
  let streamed: Run;
  let half: Run;
  beforeAll(async () => {
    preloaded = await run({}); // the default: preload "auto", a pool of 100% on this model
    streamed = await run({ preload: false });
    half = await run({ pool: "50%" });
  });

  test("the golden tokens with the preload, without it and at pool 50%", () => {
    expect(preloaded.tokens).toEqual(want.tokens);
    expect(streamed.tokens).toEqual(want.tokens);
    expect(half.tokens).toEqual(want.tokens);
  });

  test("preloaded at pool 100%: every layer resident from the start, no handshake and no lookahead route in any step", () => {
    const s = preloaded.stats;
    expect(s.pool.capacity).toBe(s.pool.records);
    expect(s.resident).toEqual({
      preload: "auto",
      preloaded: true,
      preloadRecords: s.pool.records, // the trunk layers and the MTP head's
      preloadMs: s.resident.preloadMs,
      layers: L + 1,
      residentLayers: L + 1,
      fullyResident: true,
      unavailable: null,
    });
    expect(s.handshake.all.count).toBe(0); // the prompt's step too
    expect(preloaded.handshakesPerToken).toBe(0);
    expect(s.lookahead.predictions).toBe(0);
    expect(s.pool.misses).toBe(0);
    // The host still saw every layer's routing (read after each step): activity and hits.
    const rows = c.prompt.length + c.maxTokens - 1;
    for (let l = 0; l < L; l++) {
      expect(s.activity.rows[l]).toBe(rows);
      expect(s.activity.counts[l]!.reduce((a, b) => a + b, 0)).toBe(rows * 2);
    }
    expect(s.pool.hits).toBeGreaterThan(0);
  });

  test("below 100% every site keeps its handshake and the lookahead; the resident step encodes 2 commands and a lookahead route fewer per layer", () => {
    const s = half.stats;
    expect(s.resident.residentLayers).toBe(0);
    expect(s.resident.preloaded).toBe(false);
    expect(s.resident.unavailable).toMatch(/the pool holds \d+ of the \d+ expert records/);
    expect(half.handshakesPerToken).toBe(L);
    expect(s.handshake.all.count).toBe(c.maxTokens * L);
    expect(s.lookahead.predictions).toBeGreaterThan(0);
    // A signal and a wait per layer, and L - 1 lookahead routes (read, norm, router: >= 3 commands each).
    expect(preloaded.commandsPerToken).toBeLessThanOrEqual(half.commandsPerToken - 2 * L - 3 * (L - 1));
  });

  test("without the preload at 100%, layers become resident as their experts all land; the steps after need no handshake", () => {
    const s = streamed.stats;
    expect(s.resident.preloaded).toBe(false);
    expect(s.resident.preload).toBe("off");
    expect(s.handshake.all.count).toBeGreaterThan(0); // the prompt's step read the experts
    expect(s.pool.misses).toBeGreaterThan(0);
    expect(s.resident.residentLayers).toBeLessThanOrEqual(L + 1);
    // A resident layer's sites skip the handshake: fewer than one per layer per decode step.
    expect(streamed.handshakesPerToken).toBeLessThan(L);
  });
});

test("routing traces see every layer's ids in the resident path, equal to the reference's routing", async () => {
  const path = join(tmp.dir, "trace.jsonl");
  const N = 6;
  const r = await run({ trace: path }, N);
  expect(r.stats.resident.fullyResident).toBe(true);
  expect(r.stats.handshake.all.count).toBe(0);
  const steps = readTrace(path);
  const files = await openModel(dir);
  const ref = generateGreedy(files, c.prompt, { maxTokens: N });
  files.close();
  expect(steps).toHaveLength(N);
  steps.forEach((s, i) => {
    expect(s.tokens).toEqual(ref.trace[i]!.tokens);
    expect(s.experts).toEqual(ref.trace[i]!.experts);
    expect(maxWeightError(s.weights, ref.trace[i]!.weights)).toBeLessThan(ROUTER_WEIGHT_TOLERANCE);
    expect(s.misses).toEqual([[], [], [], []]);
    expect(s.predicted).toBeUndefined();
  });
});

test("speculative decoding with the MTP head resident equals greedy, with rollbacks, and no handshake", async () => {
  const model = await Model.load(dir, { backend: BACKEND });
  try {
    for (const drafts of [1, 3]) {
      const r = await model.generate(c.prompt, { maxTokens: c.maxTokens, stopAtEos: false, drafts });
      expect(r.tokens).toEqual(want.tokens);
    }
    const s = model.stats().engine as unknown as Stats;
    expect(s.resident.fullyResident).toBe(true);
    expect(s.activity.rows[L]).toBeGreaterThan(0); // the MTP head's sites ran (resident)
    expect(s.activity.rolledBackRows).toBeGreaterThan(0); // some drafts were rejected and rolled back
    expect(s.handshake.all.count).toBe(0);
  } finally {
    await model.close();
  }
});

test("a table never outlives its slots: after evictAll the layers stream again, and once back in other slots their tables are rewritten", async () => {
  const files = await openModel(dir);
  const engine = await Engine.load(files, BACKEND, {});
  try {
    const g = engine.gpu;
    const E = g.pool.perLayer;
    const seq = engine.newSequence();
    const tokens = [(await seq.forward(c.prompt)).next.at(-1)!];
    const step = async () => tokens.push((await seq.forward([tokens.at(-1)!])).next[0]!);
    await step();
    const layers = [...g.resident.layers];
    const before = layers.map((l) => g.resident.row(l)!.slice(0, E));
    // Every record dropped between steps: no layer may stay resident (its table names empty slots).
    g.pool.evictAll();
    expect(layers.every((l) => g.resident.binding(l) === null)).toBe(true);
    const hs = (engine.stats() as unknown as Stats).handshake.all.count;
    await step();
    expect((engine.stats() as unknown as Stats).handshake.all.count).toBeGreaterThan(hs); // served by the host again
    // Bring every record back in reverse order: other slots than the preload gave them.
    for (const l of layers) {
      const a = g.pool.acquire(l, Array.from({ length: E }, (_, e) => E - 1 - e));
      await a.ready;
      g.pool.release(l);
    }
    while (tokens.length < c.maxTokens) await step();
    expect(tokens).toEqual(want.tokens);
    const after = layers.map((l) => g.resident.row(l)!.slice(0, E));
    expect(after).not.toEqual(before); // a stale table would have read other records
    for (const [i, l] of layers.entries()) {
      expect(g.resident.binding(l)).not.toBeNull();
      expect(Array.from(after[i]!)).toEqual(Array.from(g.pool.hold(l)!));
    }
    // Resident again: the last steps needed no handshake.
    const h1 = (engine.stats() as unknown as Stats).handshake.all.count;
    await step();
    expect((engine.stats() as unknown as Stats).handshake.all.count).toBe(h1);
  } finally {
    await engine.close();
    files.close();
  }
});

describe("preload failures", () => {
  let copies = 0;
  const copy = () => {
    const out = join(tmp.dir, `m${copies++}`);
    cpSync(dir, out, { recursive: true });
    return out;
  };
  const failure = (p: Promise<unknown>) => p.then(() => { throw new Error("expected the load to fail"); }, (e: Error) => e);

  test("a corrupt record fails the load naming experts.bin, the layer and the expert; without the preload the same model loads", async () => {
    const d = copy();
    const x = JSON.parse(readFileSync(join(d, "cherenkov.json"), "utf8")).experts;
    const fd = openSync(join(d, "experts.bin"), "r+");
    const b = new Uint8Array(1);
    const at = (2 * x.per_layer + 5) * x.stride + 100; // layer 2, expert 5
    readSync(fd, b, 0, 1, at);
    writeSync(fd, Uint8Array.of(b[0]! ^ 0x10), 0, 1, at);
    closeSync(fd);
    const e = await failure(Model.load(d, { backend: BACKEND }));
    expect(e).toBeInstanceOf(ChecksumMismatchError);
    expect(e.message).toMatch(/^experts\.bin: record layer 2 expert 5: checksum mismatch/);
    const m = await Model.load(d, { backend: BACKEND, engine: { preload: false, pool: "50%" } });
    await m.close();
  });

  test("an IO error or a truncated experts.bin fails the load naming the file", async () => {
    let reads = 0;
    const reader: PositionalReader = async (file, into, position) => {
      if (++reads === 7) throw Object.assign(new Error("EIO: i/o error, read"), { code: "EIO" });
      return fsRead(file, into, position);
    };
    const e = await failure(Model.load(dir, { backend: BACKEND, engine: { io: { reader } } }));
    expect(e).toBeInstanceOf(IoReadError);
    expect(e.message).toContain(join(dir, "experts.bin"));
    const d = copy();
    const size = readFileSync(join(d, "experts.bin")).length;
    truncateSync(join(d, "experts.bin"), size - 4096);
    const t = await failure(Model.load(d, { backend: BACKEND }));
    expect(t.message).toContain("experts.bin");
  });

  test("preload: true needs a pool that holds every record: a PreloadError, and a usage error on the CLI", async () => {
    const e = await failure(Model.load(dir, { backend: BACKEND, engine: { preload: true, pool: "50%" } }));
    expect(e).toBeInstanceOf(PreloadError);
    expect(e.message).toMatch(/^preload: the pool holds \d+ of the \d+ expert records/);
    let err = "";
    const io = { stdout: () => {}, stderr: (t: string) => void (err += t), stderrIsTTY: false };
    const args = ["run", dir, "--prompt-tokens", "1,2", "--max-tokens", "1", "--backend", BACKEND];
    expect(await main([...args, "--pool", "50%", "--preload"], io)).toBe(2);
    expect(err).toContain("--preload: the pool holds");
    err = "";
    expect(await main([...args, "--preload", "--no-preload"], io)).toBe(2);
    expect(err).toContain("give at most one of --preload and --no-preload");
  });
});
