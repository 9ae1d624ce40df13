// Turns what spec/train/device-run.sh brought back into the two committed example models:
//   bun spec/train/import-models.ts QWEN4_SRC QWEN3NEXT_SRC [QWEN4_OUT QWEN3NEXT_OUT]
// QWEN4_SRC: the qwen4-exp-*.safetensors shards + config.json (train.py's qwen4/config.json)
// + tokenizer files; QWEN3NEXT_SRC: the model-*.safetensors shards + config.json + tokenizer
// files. Writes examples/models/qwen4-exp-tiny (lib/convert/native.ts) and
// examples/models/qwen3-next-tiny (the Hugging Face converter), both q4, or the two folders
// given (spec/train/device-run-64x8.sh: the 64-expert models, which are not committed).
import { rmSync } from "node:fs";
import { join } from "node:path";
import { convertCheckpoint } from "../../lib/convert/convert.ts";
import { importNative } from "../../lib/convert/native.ts";

const [qwen4Src, qwen3NextSrc, qwen4Out, qwen3NextOut] = process.argv.slice(2);
if (!qwen4Src || !qwen3NextSrc) throw new Error("usage: bun spec/train/import-models.ts QWEN4_SRC QWEN3NEXT_SRC");
const models = join(import.meta.dir, "..", "..", "examples", "models");

const q4x = qwen4Out ?? join(models, "qwen4-exp-tiny");
rmSync(q4x, { recursive: true, force: true });
await importNative(qwen4Src, q4x, { weights: "q4", log: console.log });
console.log(`wrote ${q4x}`);

const q3n = qwen3NextOut ?? join(models, "qwen3-next-tiny");
rmSync(q3n, { recursive: true, force: true });
const r = await convertCheckpoint({ src: qwen3NextSrc, out: q3n, weights: "q4", log: console.log });
console.log(`wrote ${q3n}: ${r.architecture}, ${(r.bytes / 1e6).toFixed(2)} MB`);
