// bench:prefill (spec/bench/prefill.ts) end to end on a tiny synthesized model, on the selected
// backend (the CPU backend here): the JSON's shape and the invariants its numbers must keep,
// none of them a timing. Warm: pool 100% preloaded, nothing read during a prompt. Cold: a 25%
// pool emptied before each prompt, each record read at most once per chunk, the first chunk
// reads every record it routes to, the disk bound is bandwidth over bytes per token.
import { expect, test } from "bun:test";
import { join } from "node:path";
import { selectedBackend } from "../selected-backend.ts";
import { presetConfig } from "../../lib/convert/presets.ts";
import { planExperts } from "../../lib/model/writer.ts";
import { weightFlopsPerToken } from "./prefill-flops.ts";
import type { ChunkRun, ModeRun } from "./prefill.ts";

const ROOT = join(import.meta.dir, "..", "..");
const backend = selectedBackend();

async function bench(args: string[]): Promise<Record<string, unknown>> {
  const p = Bun.spawn([process.execPath, join(ROOT, "spec/bench/prefill.ts"), ...args, "--json"], {
    cwd: ROOT,
    env: { ...process.env, CHERENKOV_BACKEND: backend },
    stdout: "pipe",
    stderr: "pipe",
  });
  const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
  if (code !== 0) throw new Error(`bench:prefill exited ${code}: ${err}`);
  const lines = out.trim().split("\n");
  expect(lines.length).toBe(1); // --json: one object, nothing else on stdout
  return JSON.parse(lines[0]!) as Record<string, unknown>;
}

test("the engine run: warm reads nothing, cold reads each routed record at most once per chunk, tokens and the disk bound add up", async () => {
  const j = await bench(["--preset", "tiny", "--prompts", "16,40", "--chunk", "16", "--peak-tflops", "0.5"]);
  const tiny = presetConfig("tiny");
  const flops = weightFlopsPerToken(tiny, planExperts(tiny, "q4").parts);
  expect(j).toMatchObject({ bench: "prefill", backend, prompts: [16, 40], expertLayers: 5, perLayer: 8, topK: 2, weightFlopsPerToken: flops, peakTflops: 0.5 });
  const recordBytes = j.recordBytes as number;
  const disk = j.disk as { bytesPerSecond: number; recordBytes: number };
  expect(disk.bytesPerSecond).toBeGreaterThan(0);
  expect(disk.recordBytes).toBe(recordBytes);
  const [warm, cold] = j.modes as ModeRun[];
  expect([warm!.mode, cold!.mode]).toEqual(["warm", "cold"]);
  for (const m of [warm!, cold!]) {
    expect(m.chunkRows).toBe(16);
    expect(m.prompts.map((r) => r.promptTokens)).toEqual([16, 40]);
    for (const r of m.prompts) {
      expect(r.chunks).toBe(Math.ceil(r.promptTokens / 16));
      expect(r.perChunk.map((c: ChunkRun) => c.rows)).toEqual(Array.from({ length: r.chunks }, (_, i) => Math.min(16, r.promptTokens - 16 * i)));
      expect(r.ms).toBeCloseTo(r.perChunk.reduce((s, c) => s + c.ms, 0), 6);
      expect(r.tokensPerSecond).toBeCloseTo(r.promptTokens / (r.ms / 1000), 6);
      for (const c of r.perChunk) {
        // Every chunk routes every trunk layer to top-2 at least; the routing counts and the pool agree on it.
        expect(c.unionRecords).toBeGreaterThanOrEqual(4 * 2);
        expect(c.poolUnionRecords).toBe(c.unionRecords);
      }
      expect(r.readBytesPerToken).toBe(r.readBytes / r.promptTokens);
      expect(r.tflops).toBeCloseTo((r.tokensPerSecond * flops) / 1e12, 12);
      expect(r.computeBoundTokensPerSecond!).toBeCloseTo(0.5e12 / flops, 6);
      expect(r.ratioToComputeBound!).toBeCloseTo(r.tokensPerSecond / r.computeBoundTokensPerSecond!, 9);
    }
  }
  expect([warm!.preloaded, warm!.poolSlots]).toEqual([true, warm!.records]);
  for (const r of warm!.prompts) {
    expect([r.readBytes, r.recordsRead, r.neededBytes, r.maxReadsPerRecord, r.hitRate]).toEqual([0, 0, 0, 0, 1]);
    expect(r.diskBoundTokensPerSecond).toBeUndefined();
  }
  expect(cold!.preloaded).toBe(false);
  expect(cold!.poolSlots).toBe(Math.round(cold!.records / 4));
  for (const r of cold!.prompts) {
    expect(r.maxReadsPerRecord).toBe(1); // read, and never twice in one chunk
    for (const c of r.perChunk) {
      expect(c.maxLayerReadShare).toBeLessThanOrEqual(1);
      // Every read is a routed record's only one, or a prediction the chunk did not route to.
      expect(c.recordsRead).toBe(c.routedRecordsRead + c.unroutedReads);
      expect(c.routedRecordsRead).toBeLessThanOrEqual(c.unionRecords);
    }
    // From an empty pool the first chunk reads every record it routes to.
    expect(r.perChunk[0]!.routedRecordsRead).toBe(r.perChunk[0]!.unionRecords);
    expect(r.recordsRead).toBe(r.perChunk.reduce((s, c) => s + c.recordsRead, 0));
    expect(r.neededBytes).toBe(r.routedRecordsRead * recordBytes);
    // Bytes landed: whole records, every needed one, no more than the reads issued (a cancelled prefetch reads nothing).
    expect(r.readBytes % recordBytes).toBe(0);
    expect(r.readBytes).toBeGreaterThanOrEqual(r.neededBytes);
    expect(r.readBytes).toBeLessThanOrEqual(r.recordsRead * recordBytes);
    expect(r.diskBoundTokensPerSecond!).toBeCloseTo(disk.bytesPerSecond / (r.neededBytes / r.promptTokens), 6);
    expect(r.ratioToDiskBound!).toBeCloseTo(r.tokensPerSecond / r.diskBoundTokensPerSecond!, 9);
  }
}, 120_000);

test("--simulate keeps the routing simulation: per-token records against decode's, through the pool policy", async () => {
  const j = await bench(["--simulate", "--preset", "tiny", "--chunk", "16", "--prompt", "64", "--decode", "16", "--pool", "25,100", "--zipf", "0"]);
  expect(j).toMatchObject({ bench: "prefill", preset: "tiny", chunk: 16, prompt: 64, decode: 16 });
  const results = j.results as { poolPercent: number; slots: number; prefillRecordsPerToken: number; decodeRecordsPerToken: number }[];
  // The tiny preset's trunk: 4 layers x 8 experts.
  expect(results.map((r) => [r.poolPercent, r.slots])).toEqual([
    [25, 8],
    [100, 32],
  ]);
  // A pool holding every record reads each at most once over the whole run.
  const full = results[1]!;
  expect(full.prefillRecordsPerToken * 64 + full.decodeRecordsPerToken * 16).toBeLessThanOrEqual(32);
  expect(results[0]!.prefillRecordsPerToken).toBeGreaterThan(0);
  expect(results[0]!.decodeRecordsPerToken).toBeGreaterThan(0); // a quarter of the records cannot hold decode's
});

test("the engine run refuses options that belong to --simulate, naming them", async () => {
  await expect(bench(["--preset", "tiny", "--prompt", "64"])).rejects.toThrow(/--prompt belongs to --simulate/);
});

test("weight FLOPs per prompt token: 2 x every trunk matrix and top_k expert records per layer (30b-a3b-shape by hand)", () => {
  const c = presetConfig("30b-a3b-shape");
  const deltanet = 36 * (8192 * 2048 + 4096 * 2048 + 2 * 32 * 2048 + 2048 * 4096); // qkv, z, b and a, out
  const attention = 12 * (2 * 4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096 + 2048 * 2048 + 128 * 2048 + 16 * 2048); // q and gate, k and v, o, QSA iq, ik, iw
  const everyLayer = 48 * (2 * 24 * 8192 + 128 * 2048); // two hyper-connection mixers, the router
  const ple = 2 * 2 * 2048 * 1024; // k and v of the two PLE layers
  const routed = 48 * 8 * 3 * 768 * 2048; // top-8 records of gate, up, down
  expect(weightFlopsPerToken(c, planExperts(c, "q4").parts)).toBe(2 * (deltanet + attention + everyLayer + ple + routed));
});
