// Imports a qwen4-exp checkpoint saved under cherenkov's own tensor names (what
// spec/train/train.py exports): a directory with config.json (a qwen4-exp config) and
// *.safetensors holding every dense tensor by its name in lib/model/tensors.ts, the routed
// experts as `experts.{l}.{e}.{gate|up|down}` and the PLE tables as `ple.{l}.{o}.{j}`.
// Every tensor is checked (presence, shape, no strays) before anything is written; then the
// model is streamed tensor by tensor through ModelWriter. Tokenizer files are copied along.
import { existsSync, readFileSync } from "node:fs";
import { basename, join } from "node:path";
import { ConfigError, dims, parseConfig, type DType, type ModelConfig } from "../model/config.ts";
import type { Manifest } from "../model/manifest.ts";
import { denseTensorSpecs, expertPartSpecs } from "../model/tensors.ts";
import { expertName, pleTableName } from "../model/weights.ts";
import { ModelWriter } from "../model/writer.ts";
import { ConvertError } from "./hf.ts";
import { Checkpoint } from "./safetensors.ts";

export interface NativeImportOptions {
  /** Write into a non-empty `out`, replacing its model files (default: refuse). */
  force?: boolean;
  /** Storage of the weights (default q4). */
  weights?: DType;
  /** Where tokenizer.json / tokenizer_config.json are (default: the source directory). */
  tokenizerDir?: string;
  /** Informational lines. */
  log?: (line: string) => void;
}

/** Every tensor a native checkpoint of `config` must hold: name -> shape. */
export function nativeTensorShapes(config: ModelConfig): Map<string, number[]> {
  const want = new Map<string, number[]>();
  for (const s of denseTensorSpecs(config)) want.set(s.name, s.shape);
  const parts = expertPartSpecs(config);
  for (let l = 0; l < dims(config).expertLayers; l++)
    for (let e = 0; e < config.moe.experts; e++) for (const p of parts) want.set(`${expertName(l, e)}.${p.name}`, p.shape);
  const p = config.ple;
  if (p)
    for (const l of p.layers)
      p.orders.forEach((_, o) => {
        for (let j = 0; j < p.heads; j++) want.set(pleTableName(l, o, j), [p.rows[o]![j]!, p.head_dim]);
      });
  return want;
}

/** Whether `src` holds a native checkpoint: a config.json that is a qwen4-exp config. */
export function isNativeCheckpoint(src: string): boolean {
  try {
    return JSON.parse(readFileSync(join(src, "config.json"), "utf8"))?.architecture === "qwen4-exp";
  } catch {
    return false;
  }
}

function readConfig(src: string): ModelConfig {
  const path = join(src, "config.json");
  let raw: unknown;
  try {
    raw = JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new ConvertError(`config.json: cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  try {
    return parseConfig(raw, path);
  } catch (e) {
    if (e instanceof ConfigError) throw new ConvertError(e.message);
    throw e;
  }
}

/** Writes the cherenkov model directory `out` from the native checkpoint directory `src`. */
export async function importNative(src: string, out: string, opts: NativeImportOptions = {}): Promise<Manifest> {
  const weights = opts.weights ?? "q4";
  const config = readConfig(src);
  const ckpt = new Checkpoint(src);
  try {
    const want = nativeTensorShapes(config);
    for (const [name, shape] of want) {
      if (!ckpt.has(name)) throw new ConvertError(`missing tensor ${name} in ${src}`, name);
      const info = ckpt.info(name);
      const ok = info.shape.length === shape.length && info.shape.every((x, i) => x === shape[i]);
      if (!ok) throw new ConvertError(`tensor ${name} (${info.file}): shape [${info.shape.join(", ")}], the config needs [${shape.join(", ")}]`, name);
    }
    const strays = ckpt.names.filter((n) => !want.has(n));
    if (strays.length)
      throw new ConvertError(`${strays.length} tensor(s) the config has no place for: ${strays.slice(0, 4).join(", ")}${strays.length > 4 ? ", ..." : ""}`, strays[0]);

    const w = await ModelWriter.create(out, config, { weights, force: opts.force, source: { native: { from: basename(src) } } });
    try {
      for (const s of denseTensorSpecs(config)) w.addDense(s.name, ckpt.readF32(s.name));
      const { layers, per_layer } = w.expertLayout;
      for (let l = 0; l < layers; l++)
        for (let e = 0; e < per_layer; e++) {
          const part = (p: string) => ckpt.readF32(`${expertName(l, e)}.${p}`);
          w.addExpert(l, e, { gate: part("gate"), up: part("up"), down: part("down") });
        }
      const p = config.ple;
      if (p)
        for (const l of p.layers)
          p.orders.forEach((_, o) => {
            for (let j = 0; j < p.heads; j++) w.addPleTable(l, o, j, ckpt.readF32(pleTableName(l, o, j)));
          });
      const tokDir = opts.tokenizerDir ?? src;
      if (existsSync(join(tokDir, "tokenizer.json"))) {
        const json = (f: string) => JSON.parse(readFileSync(join(tokDir, f), "utf8"));
        w.setTokenizer(json("tokenizer.json"), existsSync(join(tokDir, "tokenizer_config.json")) ? json("tokenizer_config.json") : {});
      } else opts.log?.(`no tokenizer.json in ${tokDir}: the model will take token ids only`);
      return await w.finish();
    } catch (e) {
      w.abort();
      throw e;
    }
  } finally {
    ckpt.close();
  }
}
