// How many tokens (prompt + completion) one request may use: what the operator asked for, else
// what the model directory declares, never more than the backend holds.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import type { Model } from "../api/model.ts";

export const DEFAULT_CONTEXT = 4096;

/** The context a model directory declares (tokenizer_config.json model_max_length), when it is sensible. */
export function declaredContextLength(dir: string): number | null {
  try {
    const v = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"))?.model_max_length;
    // Hugging Face writes 1e30 when a tokenizer does not know its model's context.
    return Number.isInteger(v) && v > 0 && v <= 2 ** 31 ? v : null;
  } catch {
    return null;
  }
}

/**
 * The context a request may fill: the operator's choice, else the model's declared one, and
 * never more than the backend holds (the engine sizes its KV caches for `maxContext`; the
 * reference has no limit), so that a prompt that cannot run is refused (400) before any work.
 */
export function resolveContextLength(model: Pick<Model, "dir" | "maxContext" | "backendName">, requested: number | undefined): number {
  const limit = model.maxContext;
  if (requested !== undefined) {
    if (!Number.isInteger(requested) || requested < 2) throw new Error(`contextLength: ${requested} must be an integer >= 2`);
    if (limit !== null && requested > limit)
      throw new Error(`contextLength: ${requested} is more than the ${model.backendName} backend holds (${limit}); load the model with engine: { maxContext: ${requested} }`);
    return requested;
  }
  const wanted = declaredContextLength(model.dir) ?? DEFAULT_CONTEXT;
  return limit === null ? wanted : Math.min(wanted, limit);
}
