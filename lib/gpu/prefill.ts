// Prefill (the seed's "prefill"): a prompt runs in chunks of up to the engine's step rows,
// each chunk one step through the model layer by layer, so that each layer's experts are
// brought in once for the whole chunk rather than once per token. Chunks run back to back;
// an abort is honoured between them. Only the chunks holding rows the caller wants logits of
// run the LM head (usually the last chunk, for its last row).
import { rangeWithin, throwIfAborted, type ForwardResult, type RowRange, type RowsResult } from "../api/backend.ts";

/** [start, end) of the chunks of `total` rows, at most `rows` each. */
export function chunkRanges(total: number, rows: number): [number, number][] {
  if (!Number.isInteger(rows) || rows < 1) throw new RangeError(`prefill: chunk rows ${rows} must be a positive integer`);
  const out: [number, number][] = [];
  for (let i = 0; i < total; i += rows) out.push([i, Math.min(total, i + rows)]);
  return out;
}

/**
 * Runs `tokens` through `step` chunk by chunk, each asked for the logits of its part of
 * `logits` (rows of the whole call); the results of those rows, in order.
 */
export async function runChunked(
  tokens: readonly number[],
  rows: number,
  logits: RowRange,
  step: (chunk: number[], logits: RowRange) => Promise<RowsResult>,
  signal?: AbortSignal,
): Promise<ForwardResult> {
  const out: ForwardResult = { first: logits.from, next: [], margins: [] };
  for (const [a, b] of chunkRanges(tokens.length, rows)) {
    throwIfAborted(signal);
    const r = await step(tokens.slice(a, b), rangeWithin(logits, a, b));
    out.next.push(...r.next);
    out.margins.push(...r.margins);
    if (r.logprobs) out.logprobs = r.logprobs; // sampled rows are the last chunk's
  }
  return out;
}
