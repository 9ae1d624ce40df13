// Writer and reader together: synthetic tiny models in every weight dtype and feature set
// read back to exactly the values they were written from.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { presetConfig, type Features } from "../../lib/convert/presets.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import { checksum } from "../../lib/model/checksum.ts";
import { decode, encode } from "../../lib/model/codec.ts";
import type { DType } from "../../lib/model/config.ts";
import { openModel, type ModelFiles } from "../../lib/model/format.ts";
import { alignUp, PAGE } from "../../lib/model/manifest.ts";
import { quantizeQ4 } from "../../lib/model/q4.ts";
import { denseTensorSpecs, expertPartSpecs, storageDType } from "../../lib/model/tensors.ts";
import { RandomWeights } from "../../lib/model/weights.ts";
import { ModelWriter } from "../../lib/model/writer.ts";

const root = mkdtempSync(join(tmpdir(), "cherenkov-format-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

const SEED = 42;
const ALL_OFF: Features = { hc: false, qsa: false, ple: false, mtp: false };

async function synth(weights: DType, features: Features = {}): Promise<ModelFiles> {
  const out = join(root, `${weights}-${JSON.stringify(features).replace(/\W/g, "")}`);
  await synthesize({ preset: "tiny", features, seed: SEED, out, weights });
  return openModel(out);
}

/** What a reader must return for a value stored as `dtype`. */
const stored = (v: Float32Array, shape: number[], dtype: DType) => decode(encode(v, shape, dtype), shape, dtype);
const bits = (a: Float32Array) => Array.from(new Uint32Array(a.buffer, a.byteOffset, a.length));

describe.each([
  ["f32", {}],
  ["bf16", {}],
  ["q4", {}],
  ["q4", ALL_OFF],
  ["f32", { hc: false, mtp: false }],
  ["bf16", { qsa: false, ple: false, kvCache: "f32" }],
] as [DType, Features][])("tiny %s %o", (weights, features) => {
  let model: ModelFiles;
  let random: RandomWeights;
  beforeAll(async () => {
    model = await synth(weights, features);
    random = new RandomWeights(presetConfig("tiny", features), SEED);
  });
  afterAll(() => model.close());

  test("the index lists every dense tensor of the config, in order, with its storage dtype", () => {
    const specs = denseTensorSpecs(model.config);
    expect(model.manifest.tensors.map((t) => t.name)).toEqual(specs.map((s) => s.name));
    for (const s of specs) {
      const t = model.tensorInfo(s.name);
      expect(t.shape).toEqual(s.shape);
      expect(t.dtype).toBe(storageDType(s, weights));
    }
    expect(model.config).toEqual(presetConfig("tiny", features));
  });

  test("dense tensors read back as written (bit for bit after the storage dtype)", () => {
    for (const s of denseTensorSpecs(model.config)) {
      const expected = stored(random.get(s.name), s.shape, storageDType(s, weights));
      expect(bits(model.get(s.name))).toEqual(bits(expected));
    }
  });

  test("expert records read back as written", () => {
    const parts = expertPartSpecs(model.config);
    for (let l = 0; l < model.expertLayout.layers; l++)
      for (const e of [0, model.expertLayout.perLayer - 1]) {
        const got = model.expert(l, e);
        const want = random.expert(l, e);
        for (const p of parts) {
          const key = p.name as "gate" | "up" | "down";
          expect(bits(got[key])).toEqual(bits(stored(want[key], p.shape, storageDType(p, weights))));
        }
      }
  });

  test("PLE tables read back as written", () => {
    const ple = model.config.ple;
    expect(model.paths.ple === null).toBe(ple === null);
    if (!ple) return;
    for (const layer of ple.layers)
      for (let o = 0; o < ple.orders.length; o++)
        for (let j = 0; j < ple.heads; j++) {
          const want = random.pleTable(layer, o, j);
          const shape = [ple.rows[o]![j]!, ple.head_dim];
          expect(bits(model.pleTable(layer, o, j))).toEqual(bits(stored(want, shape, weights === "f32" ? "f32" : "bf16")));
        }
  });

  test("every offset is page aligned and the files are padded to whole pages", () => {
    for (const t of model.manifest.tensors) expect(t.offset % PAGE).toBe(0);
    const x = model.expertLayout;
    expect(x.stride % PAGE).toBe(0);
    expect(x.layers).toBe(model.config.num_layers + (model.config.mtp ? 1 : 0));
    for (const p of x.parts) expect(p.offset + p.bytes).toBeLessThanOrEqual(x.stride);
    const denseEnd = Math.max(...model.manifest.tensors.map((t) => t.offset + t.bytes));
    expect(statSync(model.paths.dense).size).toBe(alignUp(denseEnd, PAGE));
    expect(statSync(model.paths.experts).size).toBe(x.layers * x.perLayer * x.stride);
    expect(model.expertOffset(1, 2)).toBe((1 * x.perLayer + 2) * x.stride);
    if (model.manifest.ple) {
      for (const t of model.manifest.ple.tables) expect(t.offset % PAGE).toBe(0);
      expect(statSync(model.paths.ple!).size % PAGE).toBe(0);
    }
  });

  test("checksums in the index are xxhash64 of the stored bytes, and verify() passes", async () => {
    const dense = readFileSync(model.paths.dense);
    for (const t of model.manifest.tensors) expect(checksum(dense.subarray(t.offset, t.offset + t.bytes))).toBe(t.checksum);
    expect(checksum(model.readExpertRecord(1, 3))).toBe(model.manifest.experts.checksums[1 * model.expertLayout.perLayer + 3]!);
    let last = 0;
    let total = 0;
    await model.verify((d, t) => {
      expect(d).toBeGreaterThanOrEqual(last);
      last = d;
      total = t;
    });
    expect(last).toBe(total);
  });
});

describe("ModelWriter", () => {
  const config = presetConfig("tiny", ALL_OFF);
  const specs = denseTensorSpecs(config);

  test("refuses tensors out of order or of the wrong size, naming them", async () => {
    const w = await ModelWriter.create(join(root, "order"), config, { weights: "f32" });
    expect(() => w.addDense("final_norm", new Float32Array(64))).toThrow(/tensor final_norm: expected embed next/);
    expect(() => w.addDense("embed", new Float32Array(5))).toThrow(/tensor embed: got 5 values, shape \[320, 64\] needs 20480/);
    expect(() => w.addExpert(0, 1, random3(config))).toThrow(/expert layer 0 expert 1: expected layer 0 expert 0 next/);
    await expect(w.finish()).rejects.toThrow(/tensor embed was never added/);
    w.abort();
  });

  test("addDenseRaw stores given q4 bytes unchanged; a model missing records is refused", async () => {
    const dir = join(root, "raw");
    const w = await ModelWriter.create(dir, config, { weights: "q4" });
    const random = new RandomWeights(config, 1);
    const embedQ4 = quantizeQ4(random.get("embed"));
    w.addDenseRaw("embed", "q4", embedQ4);
    expect(() => w.addDenseRaw(specs[1]!.name, "q4", new Uint8Array(3))).toThrow(new RegExp(`tensor ${specs[1]!.name.replace(/\./g, "\\.")}: q4 needs`));
    for (const s of specs.slice(1)) w.addDense(s.name, random.get(s.name));
    await expect(w.finish()).rejects.toThrow(/expert layer 0 expert 0 was never added/);
    for (let l = 0; l < w.expertLayout.layers; l++)
      for (let e = 0; e < w.expertLayout.per_layer; e++) w.addExpert(l, e, random.expert(l, e));
    await w.finish();
    const m = await openModel(dir, { verify: true });
    expect(Array.from(m.denseBytes("embed"))).toEqual(Array.from(embedQ4));
    m.close();
  });
});

test("rewriting a directory (force) leaves the old model in place until the new write finishes", async () => {
  const dir = join(root, "rewrite");
  await synthesize({ preset: "tiny", features: ALL_OFF, seed: 1, out: dir, weights: "q4" });
  const w = await ModelWriter.create(dir, presetConfig("tiny", ALL_OFF), { weights: "q4", force: true });
  const old = await openModel(dir, { verify: true });
  old.close();
  w.abort();
});

function random3(config: ReturnType<typeof presetConfig>) {
  return new RandomWeights(config, 0).expert(0, 1);
}
