// Writes the inputs of the torch agreement check: for every case of check-cases.ts, the
// RandomWeights as safetensors under cherenkov names (dense tensors, experts as
// experts.{l}.{e}.{gate|up|down}, PLE tables as ple.{l}.{o}.{j}), the config and the prompt.
// The trained example model's case names its model directory instead (read by the script).
//   bun spec/train/make-check-fixture.ts OUT_DIR
// Then, where torch is, from the repository root:
//   python3 spec/train/check_agreement.py OUT_DIR spec/train/fixtures
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { writeSafetensors, type StWriteTensor } from "../../lib/convert/safetensors.ts";
import { dims, type ModelConfig } from "../../lib/model/config.ts";
import { denseTensorSpecs, expertPartSpecs } from "../../lib/model/tensors.ts";
import { expertName, pleTableName, type Weights } from "../../lib/model/weights.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { caseWeights, CHECK_CASES, TRAINED_CASE } from "./check-cases.ts";

const f32 = (values: Float32Array, shape: number[]): StWriteTensor => ({
  dtype: "F32",
  shape,
  data: new Uint8Array(values.buffer.slice(values.byteOffset, values.byteOffset + values.byteLength)),
});

/** Every tensor of `w` under its cherenkov name, as f32 safetensors entries. */
export function cherenkovTensors(w: Weights): Record<string, StWriteTensor> {
  const c: ModelConfig = w.config;
  const out: Record<string, StWriteTensor> = {};
  for (const s of denseTensorSpecs(c)) out[s.name] = f32(w.get(s.name), s.shape);
  const parts = expertPartSpecs(c);
  for (let l = 0; l < dims(c).expertLayers; l++)
    for (let e = 0; e < c.moe.experts; e++) {
      const ew = w.expert(l, e);
      for (const p of parts) out[`${expertName(l, e)}.${p.name}`] = f32(ew[p.name as "gate" | "up" | "down"], p.shape);
    }
  const p = c.ple;
  if (p)
    for (const l of p.layers)
      p.orders.forEach((_, o) => {
        for (let j = 0; j < p.heads; j++) out[pleTableName(l, o, j)] = f32(w.pleTable(l, o, j), [p.rows[o]![j]!, p.head_dim]);
      });
  return out;
}

if (import.meta.main) {
  const outDir = process.argv[2];
  if (!outDir) throw new Error("usage: bun spec/train/make-check-fixture.ts OUT_DIR");
  for (const c of CHECK_CASES) {
    const dir = join(outDir, c.name);
    mkdirSync(dir, { recursive: true });
    const w = caseWeights(c);
    writeSafetensors(join(dir, "model.safetensors"), cherenkovTensors(w));
    writeFileSync(join(dir, "config.json"), JSON.stringify(w.config, null, 1));
    writeFileSync(join(dir, "case.json"), JSON.stringify({ name: c.name, seed: c.seed, features: c.features, prompt: c.prompt, decode: c.decode, spec: c.spec }));
    console.log(`wrote ${dir}`);
  }
  // The trained model is read from its model directory where the script runs (repository root).
  const t = TRAINED_CASE;
  const dir = join(outDir, t.name);
  mkdirSync(dir, { recursive: true });
  const prompt = (await loadTokenizer(t.dir)).encode(t.text);
  writeFileSync(join(dir, "case.json"), JSON.stringify({ name: t.name, model_dir: t.repoDir, text: t.text, prompt, decode: t.decode, spec: t.spec }));
  console.log(`wrote ${dir} (prompt ${prompt.length} tokens)`);
}
