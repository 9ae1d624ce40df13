// lib/convert/native.ts: a checkpoint under cherenkov's own tensor names (what the training
// script exports) becomes a model directory. Imported from the tiny preset's RandomWeights it
// must give exactly the files `synth` writes from the same values, and every bad checkpoint
// must fail naming the tensor or field.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { importNative, isNativeCheckpoint } from "../../lib/convert/native.ts";
import { presetConfig } from "../../lib/convert/presets.ts";
import { writeSafetensors, type StWriteTensor } from "../../lib/convert/safetensors.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import { openModel } from "../../lib/model/format.ts";
import { RandomWeights } from "../../lib/model/weights.ts";
import { cherenkovTensors } from "./make-check-fixture.ts";

const root = mkdtempSync(join(tmpdir(), "cherenkov-native-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const SEED = 7;
const config = presetConfig("tiny");
const weights = new RandomWeights(config, SEED);

/** A native checkpoint directory of the tiny preset, edited by `change` before writing. */
function checkpoint(name: string, change: (t: Record<string, StWriteTensor>, cfg: Record<string, unknown>) => void = () => {}) {
  const dir = join(root, name);
  mkdirSync(dir, { recursive: true });
  const tensors = cherenkovTensors(weights);
  const cfg = structuredClone(config) as unknown as Record<string, unknown>;
  change(tensors, cfg);
  // two shards, as train.py writes them
  const names = Object.keys(tensors);
  const half = Math.floor(names.length / 2);
  writeSafetensors(join(dir, "a-1-of-2.safetensors"), Object.fromEntries(names.slice(0, half).map((n) => [n, tensors[n]!])));
  writeSafetensors(join(dir, "a-2-of-2.safetensors"), Object.fromEntries(names.slice(half).map((n) => [n, tensors[n]!])));
  writeFileSync(join(dir, "config.json"), JSON.stringify(cfg));
  return dir;
}

describe("importNative", () => {
  test("recognises its checkpoints by config.json", () => {
    expect(isNativeCheckpoint(checkpoint("good"))).toBe(true);
    expect(isNativeCheckpoint(root)).toBe(false);
  });

  test("f32: every tensor, expert and PLE table reads back bit for bit", async () => {
    const out = join(root, "f32");
    await importNative(checkpoint("good"), out, { weights: "f32" });
    const m = await openModel(out, { verify: true });
    try {
      for (const name of ["embed", "layers.0.ple.k", "layers.3.attn.iw", "hc_head.fn", "mtp.fc"]) expect(m.get(name)).toEqual(weights.get(name));
      expect(m.expert(4, 5).down).toEqual(weights.expert(4, 5).down);
      expect(m.pleTable(0, 1, 1)).toEqual(weights.pleTable(0, 1, 1));
    } finally {
      m.close();
    }
  });

  test("q4: the same bytes as synth writes from the same values", async () => {
    const imported = join(root, "q4");
    const synthesized = join(root, "synth-q4");
    await importNative(checkpoint("good"), imported, { weights: "q4" });
    await synthesize({ preset: "tiny", seed: SEED, out: synthesized, weights: "q4" });
    for (const f of ["dense.bin", "experts.bin", "ple.bin"])
      expect(Bun.hash.xxHash64(readFileSync(join(imported, f)))).toBe(Bun.hash.xxHash64(readFileSync(join(synthesized, f))));
  });

  test("a missing tensor is named", async () => {
    const dir = checkpoint("missing", (t) => delete t["experts.2.3.up"]);
    await expect(importNative(dir, join(root, "o1"))).rejects.toThrow("missing tensor experts.2.3.up");
  });

  test("a wrong shape is named", async () => {
    const dir = checkpoint("shape", (t) => (t["layers.1.dn.z"]!.shape = [32, 128]));
    await expect(importNative(dir, join(root, "o2"))).rejects.toThrow(/tensor layers\.1\.dn\.z .*shape \[32, 128\], the config needs \[64, 64\]/);
  });

  test("a tensor the config has no place for is named", async () => {
    const dir = checkpoint("stray", (t) => (t["layers.9.moe.router"] = t["layers.0.moe.router"]!));
    await expect(importNative(dir, join(root, "o3"))).rejects.toThrow("layers.9.moe.router");
  });

  test("a bad config names the field", async () => {
    const dir = checkpoint("config", (_, cfg) => ((cfg.moe as { top_k: number }).top_k = 99));
    await expect(importNative(dir, join(root, "o4"))).rejects.toThrow("config.moe.top_k");
  });
});
