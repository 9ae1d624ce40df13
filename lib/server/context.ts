// How many tokens (prompt + completion) one request may use: what the operator asked for, else
// what the model directory declares, never more than the backend can hold.
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
 * The longest sequence the backend holds, when it says: the engine sizes its KV caches for
 * `maxContext` and reports it in its stats; the reference has no limit (null).
 */
export function backendContextLimit(model: Model): number | null {
  const engine = model.stats().engine as { maxContext?: unknown; engine?: { maxContext?: unknown } };
  const v = engine.maxContext ?? engine.engine?.maxContext;
  return typeof v === "number" && Number.isInteger(v) && v > 0 ? v : null;
}

export function resolveContextLength(model: Model, requested: number | undefined): number {
  const limit = backendContextLimit(model);
  if (requested !== undefined) {
    if (!Number.isInteger(requested) || requested < 2) throw new Error(`contextLength: ${requested} must be an integer >= 2`);
    if (limit !== null && requested > limit)
      throw new Error(`contextLength: ${requested} is more than the ${model.backendName} backend holds (${limit}); load the model with engine: { maxContext: ${requested} }`);
    return requested;
  }
  const wanted = declaredContextLength(model.dir) ?? DEFAULT_CONTEXT;
  return limit === null ? wanted : Math.min(wanted, limit);
}
