/**
 * LM-head rows and prefill time of one prompt through the public API (Model.generate, one
 * generated token): the rows come from the dispatches themselves (spec/engine-step/lm-head-count.ts).
 * Before logit rows (issue 19 item 3) every prompt row ran the LM head; now only the last.
 *
 *   bun spec/bench/lm-head-rows.ts [MODEL_DIR] [--prompt 300] [--chunk 512]
 *
 * The backend is CHERENKOV_BACKEND (cpu, metal, cuda) or the platform default.
 */
import { parseArgs } from "node:util";
import { Model } from "../../lib/api/model.ts";
import { countLmHead } from "../engine-step/lm-head-count.ts";
import { BACKEND } from "../selected-backend.ts";

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: { prompt: { type: "string", default: "300" }, chunk: { type: "string", default: "512" } },
});
const dir = positionals[0] ?? new URL("../../examples/models/qwen4-exp-tiny", import.meta.url).pathname;
const tokens = Number(opts.prompt);
const model = await Model.load(dir, { backend: BACKEND, prefillChunk: Number(opts.chunk) });
try {
  const prompt = Array.from({ length: tokens }, (_, i) => 32 + (i % 64));
  const probe = countLmHead({ vocab: model.config.vocab_size, d: model.config.hidden_size });
  let prefillMs: number;
  try {
    prefillMs = (await model.generate(prompt, { maxTokens: 1, stopAtEos: false })).timings.prefillMs;
  } finally {
    probe.stop();
  }
  console.log(JSON.stringify({ backend: BACKEND, model: dir, promptTokens: tokens, chunk: Number(opts.chunk), lmHeadRows: probe.count.rows, lmHeadDispatches: probe.count.dispatches, prefillMs: Math.round(prefillMs * 10) / 10 }));
} finally {
  await model.close();
}
