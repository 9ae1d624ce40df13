// The synthesizer is deterministic, seed-dependent, and writes exactly RandomWeights' values.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { presetConfig } from "../../lib/convert/presets.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import { openModel } from "../../lib/model/format.ts";
import { denseTensorSpecs } from "../../lib/model/tensors.ts";
import { RandomWeights } from "../../lib/model/weights.ts";
import { plannedBytes } from "../../lib/model/writer.ts";

const root = mkdtempSync(join(tmpdir(), "cherenkov-synth-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const FILES = ["cherenkov.json", "dense.bin", "experts.bin", "ple.bin", "tokenizer.json", "tokenizer_config.json"];
const fileHash = (dir: string, f: string) => Bun.hash.xxHash64(readFileSync(join(dir, f)));

describe("synthesize", () => {
  const a = join(root, "a");
  const b = join(root, "b");
  const c = join(root, "c");
  const progress: [number, number][] = [];
  beforeAll(async () => {
    await synthesize({ preset: "tiny", seed: 7, out: a, weights: "q4", onProgress: (d, t) => progress.push([d, t]) });
    await synthesize({ preset: "tiny", seed: 7, out: b, weights: "q4" });
    await synthesize({ preset: "tiny", seed: 8, out: c, weights: "q4" });
  });

  test("the same seed gives the same bytes in every file", () => {
    for (const f of FILES) expect(fileHash(a, f)).toBe(fileHash(b, f));
  });

  test("another seed gives other weights (every tensor's checksum differs), same layout", async () => {
    const ma = await openModel(a);
    const mc = await openModel(c);
    ma.manifest.tensors.forEach((t, i) => {
      const u = mc.manifest.tensors[i]!;
      expect(u.name).toBe(t.name);
      expect(u.offset).toBe(t.offset);
      expect(u.checksum).not.toBe(t.checksum);
    });
    expect(mc.manifest.experts.checksums[0]).not.toBe(ma.manifest.experts.checksums[0]);
    ma.close();
    mc.close();
  });

  test("progress rises to the planned total", () => {
    const total = plannedBytes(presetConfig("tiny"), "q4");
    expect(progress.length).toBeGreaterThan(10);
    for (let i = 1; i < progress.length; i++) expect(progress[i]![0]).toBeGreaterThanOrEqual(progress[i - 1]![0]);
    expect(progress[progress.length - 1]).toEqual([total, total]);
  });

  test("rejects a seed that is not a u32", async () => {
    await expect(synthesize({ preset: "tiny", seed: -1, out: join(root, "bad"), weights: "q4" })).rejects.toThrow(/seed/);
  });
});

test("an f32 synth model equals RandomWeights bit for bit (dense, experts, PLE)", async () => {
  const dir = join(root, "f32");
  await synthesize({ preset: "tiny", seed: 3, out: dir, weights: "f32" });
  const disk = await openModel(dir);
  const mem = new RandomWeights(presetConfig("tiny"), 3);
  const u32 = (a: Float32Array) => new Uint32Array(a.buffer, a.byteOffset, a.length);
  for (const s of denseTensorSpecs(mem.config)) expect(u32(disk.get(s.name))).toEqual(u32(mem.get(s.name)));
  for (let l = 0; l < disk.expertLayout.layers; l++)
    for (let e = 0; e < disk.expertLayout.perLayer; e++) {
      const x = disk.expert(l, e);
      const y = mem.expert(l, e);
      expect(u32(x.gate)).toEqual(u32(y.gate));
      expect(u32(x.up)).toEqual(u32(y.up));
      expect(u32(x.down)).toEqual(u32(y.down));
    }
  const ple = mem.config.ple!;
  for (const layer of ple.layers)
    for (let o = 0; o < ple.orders.length; o++)
      for (let j = 0; j < ple.heads; j++) expect(u32(disk.pleTable(layer, o, j))).toEqual(u32(mem.pleTable(layer, o, j)));
  disk.close();
});

test("expert records built in worker threads are the same bytes as on the main thread", async () => {
  const inline = join(root, "inline");
  const threaded = join(root, "threaded");
  await synthesize({ preset: "tiny", seed: 9, out: inline, weights: "q4", workers: 0 });
  await synthesize({ preset: "tiny", seed: 9, out: threaded, weights: "q4", workers: 2 });
  for (const f of ["experts.bin", "cherenkov.json"]) expect(fileHash(threaded, f)).toBe(fileHash(inline, f));
});
