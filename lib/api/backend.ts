// What a backend gives the generation loop: sequences that run row batches and report the
// greedy next token of the rows the caller asks for (LogitRows: the LM head is the largest
// matrix, and a prompt needs only its last row's token). The reference (pure TS) and the engine (metal-shim, CPU or
// Metal) both implement it, so Model, sessions, streaming and the CLI are written once.
import type { ModelConfig } from "../model/config.ts";
import type { PenaltyCounts, SamplingParams, TopLogprob } from "../reference/sampling.ts";
import type { LoadedEngineStats } from "../gpu/telemetry.ts";

/** Greedy result of rows: next[i] is the argmax after row i; margins[i] its top-1 minus top-2 logit. */
export interface RowsResult {
  next: number[];
  margins: number[];
  /** With a sample request asking for logprobs: one entry per sampled token (forward: the last row's; speculate: every token of next). */
  logprobs?: TokenLogprobs[];
}

/**
 * Which rows of a forward get logits (the LM head, then the argmax or a draw): "all" (tests
 * comparing every row), "last" (a prompt: only its last row's token is used), or "none" (only
 * the state advances: a prompt whose last token the next step runs).
 */
export type LogitRows = "all" | "last" | "none";

/** Rows [from, from + count) of a row batch. */
export interface RowRange {
  from: number;
  count: number;
}

/** The rows of a batch of `total` rows that `rows` asks logits for. */
export function logitRange(rows: LogitRows, total: number): RowRange {
  switch (rows) {
    case "all":
      return { from: 0, count: total };
    case "last":
      return { from: Math.max(total - 1, 0), count: Math.min(total, 1) };
    case "none":
      return { from: total, count: 0 };
    default:
      throw new Error(`logits: ${JSON.stringify(rows)} is not one of "all", "last", "none"`);
  }
}

/** The part of `range` (rows of a whole call) inside the chunk [start, end), relative to the chunk. */
export function rangeWithin(range: RowRange, start: number, end: number): RowRange {
  const from = Math.max(range.from, start);
  const to = Math.min(range.from + range.count, end);
  return to > from ? { from: from - start, count: to - from } : { from: end - start, count: 0 };
}

/** The logit rows of a forward of `total` rows under `opts` (a sample request needs the last row). */
export function forwardRange(opts: ForwardOptions, total: number): RowRange {
  const range = logitRange(opts.logits ?? "last", total);
  if (opts.sample && range.count === 0) throw new Error('forward: sampling draws the last row\'s token, and logits "none" computes no row');
  return range;
}

/**
 * A forward's result: only the rows it asked logits for. next[i] and margins[i] belong to row
 * `first + i` of the call's tokens; rows outside [first, first + next.length) have none.
 */
export interface ForwardResult extends RowsResult {
  first: number;
}

export interface ForwardOptions {
  signal?: AbortSignal;
  /** Sampling instead of greedy for the last row (which `logits` must then include). */
  sample?: SampleRequest;
  /** Rows to compute logits for (default "last"). */
  logits?: LogitRows;
  /**
   * The step the caller runs next: speculate() with this many drafts (0 or absent: a forward
   * of one row). A GPU engine encodes that step while this one runs; a hint, never required.
   */
  nextDrafts?: number;
}

/**
 * Sampling instead of greedy (docs/sampling.md): forward() draws the last row's token, and
 * speculate() samples drafts from the MTP head and verifies them by rejection sampling.
 */
export interface SampleRequest {
  params: SamplingParams;
  seed: number;
  /** The penalty counts (from Backend.penaltyCounts), or null without penalties. */
  counts: PenaltyCounts | null;
  /** Top alternatives per token's logprobs (0..20), or null for no logprobs. */
  logprobs: number | null;
}

/** log_softmax of the raw logits at the chosen token, and the most likely ones. */
export interface TokenLogprobs {
  logprob: number;
  top: TopLogprob[];
}

/** Result of one speculative step: accepted drafts then the bonus token. */
export interface SpeculativeResult extends RowsResult {
  /** Drafts that were proposed (accepted = next.length - 1). */
  proposed: number;
}

/**
 * A compact copy of a sequence's state (no weights, slots or event counters), made by one
 * backend and resumable only there: DeltaNet S and conv windows, KV caches and QSA index keys
 * up to the length, PLE conv histories, tokens, the MTP cache and its pending hidden rows.
 */
export interface BackendCheckpoint {
  /** Rows (tokens) the copy holds. */
  readonly length: number;
  /** Bytes of state it copies. */
  readonly bytes: number;
}

export interface BackendSequence {
  /** Rows (tokens) the sequence holds. */
  readonly length: number;
  /**
   * Runs `tokens` at positions length.. (prefill chunks are the backend's business); the next
   * tokens of the rows `opts.logits` asks for (by default the last row's only).
   */
  forward(tokens: number[], opts?: ForwardOptions): Promise<ForwardResult>;
  /**
   * Speculative step: `next` is the newest token, not yet run. Proposes up to `drafts` tokens,
   * verifies [next, ...drafts] as one row batch and rolls back to the last accepted row.
   * Absent when the backend or the model cannot draft.
   */
  speculate?(next: number, drafts: number, signal?: AbortSignal, sample?: SampleRequest): Promise<SpeculativeResult>;
  /**
   * Draws the token after the last row from that row's logits if the backend still holds them
   * (the engine: no other step ran since), else null (the caller re-runs the row).
   */
  resample?(sample: SampleRequest): Promise<{ next: number; logprobs?: TokenLogprobs } | null>;
  /** Forgets every row. */
  reset(): void;
  /** A compact copy of the state now (no step of this sequence may be in flight). */
  checkpoint(): BackendCheckpoint;
  dispose(): void;
}

/** The reference backend's stats(): it keeps no telemetry beyond its name. */
export interface ReferenceBackendStats {
  backend: "reference";
}

/** The engine backend's stats(): its name plus everything the loaded engine reports. */
export interface EngineBackendStats extends LoadedEngineStats {
  backend: "cpu" | "metal" | "cuda";
}

/** What a backend's stats() returns (`ModelStats.engine`); `backend` tells which shape. */
export type BackendStats = ReferenceBackendStats | EngineBackendStats;

export interface Backend {
  /** "reference", "cpu" or "metal". */
  readonly name: string;
  readonly config: ModelConfig;
  /** Drafts per step the backend can verify (0 = no speculative decoding). */
  readonly maxDrafts: number;
  /** The longest sequence (tokens) one sequence holds, or null when only memory limits it. */
  readonly maxContext: number | null;
  /** A new sequence, empty or continuing from a checkpoint this backend made. */
  newSequence(from?: BackendCheckpoint): BackendSequence;
  /** Zeroed penalty counts over `config.vocab_size` tokens, in storage the backend's sampler reads. */
  penaltyCounts(): PenaltyCounts;
  /** Backend-specific telemetry (the engine's pool, IO, lookahead, phases ...). */
  stats(): BackendStats;
  close(): Promise<void>;
}

/** The backend asked for cannot run here (not built, or not this platform). */
export class BackendUnavailableError extends Error {
  override name = "BackendUnavailableError";
}

/** Throws the standard AbortError when `signal` is aborted. */
export function throwIfAborted(signal?: AbortSignal): void {
  if (signal?.aborted) throw signal.reason instanceof Error ? signal.reason : new DOMException("generation aborted", "AbortError");
}
