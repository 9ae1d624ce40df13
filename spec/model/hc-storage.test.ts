// Hyper-connection projections (`*.fn`) are stored in f32 whatever the weights dtype
// (DeepSeek-V4 keeps its hc parameters in f32; bf16 moves the small preset's logits by 7e-2 of
// the largest), by the writer, the synthesizer and the converters alike (all go through storageDType). Model directories written
// before this rule hold bf16 fn (examples/models/qwen4-exp-tiny) and still load and run.
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { presetConfig } from "../../lib/convert/presets.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import { openModel, readManifest } from "../../lib/model/format.ts";
import { denseTensorSpecs, storageDType } from "../../lib/model/tensors.ts";
import { RandomWeights } from "../../lib/model/weights.ts";
import { ReferenceModel } from "../../lib/reference/index.ts";

const dir = mkdtempSync(join(tmpdir(), "cherenkov-hcfn-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const isFn = (name: string) => /(^|\.)(hc_mixer|hc_moe|hc_head)\.fn$/.test(name);

test("every dtype stores hc fn as f32; the router stays bf16 in quantized models", () => {
  const specs = denseTensorSpecs(presetConfig("tiny"));
  const fns = specs.filter((s) => isFn(s.name));
  expect(fns.length).toBe(2 * 4 + 1);
  for (const w of ["q4", "bf16", "f16", "f32"] as const) for (const s of fns) expect(storageDType(s, w)).toBe("f32");
  expect(storageDType(specs.find((s) => s.name === "layers.0.moe.router")!, "q4")).toBe("bf16");
});

test("a synthesized q4 model holds hc fn in f32, exactly the generated values", async () => {
  const out = join(dir, "q4");
  await synthesize({ preset: "tiny", seed: 3, out, weights: "q4", workers: 0 });
  const m = readManifest(out);
  const fns = m.tensors.filter((t) => isFn(t.name));
  expect(fns.length).toBe(9);
  for (const t of fns) expect({ name: t.name, dtype: t.dtype }).toEqual({ name: t.name, dtype: "f32" });
  const model = await openModel(out);
  const gen = new RandomWeights(model.config, 3);
  for (const t of fns) expect(Array.from(model.get(t.name))).toEqual(Array.from(gen.get(t.name)));
  model.close();
});

test("an older model directory with bf16 hc fn still loads and runs", async () => {
  const old = join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny");
  const fns = readManifest(old).tensors.filter((t) => isFn(t.name));
  expect(fns.length).toBeGreaterThan(0);
  for (const t of fns) expect(t.dtype).toBe("bf16");
  const files = await openModel(old);
  const model = new ReferenceModel(files);
  const r = model.forward(model.newState(), [1, 2, 3]);
  expect(r.logits.every((row) => row.every(Number.isFinite))).toBe(true);
  files.close();
});
