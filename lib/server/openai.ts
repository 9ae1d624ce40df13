// Response bodies in OpenAI's shapes (chat.completion, chat.completion.chunk, text_completion,
// model list). Only what cherenkov produces: one choice, no logprobs, no tool calls.
import type { FinishReason, GenerationResult } from "../api/model.ts";

export type OpenAIFinishReason = "stop" | "length";

/** The end token and a stop string both end the text naturally: OpenAI calls both "stop". */
export function finishReason(r: FinishReason): OpenAIFinishReason {
  return r === "length" ? "length" : "stop";
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export function usage(r: GenerationResult): Usage {
  const { promptTokens, completionTokens } = r.usage;
  return { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
}

/**
 * Extension: where the time went, under the names llama.cpp's server uses (`timings`), so
 * tools written for it read ours. cache_n is 0: every request runs its whole prompt.
 */
export function timings(r: GenerationResult) {
  const { prefillMs, decodeMs } = r.timings;
  const { promptTokens, completionTokens } = r.usage;
  const perToken = (ms: number, n: number) => (n > 0 ? ms / n : 0);
  const perSecond = (ms: number, n: number) => (ms > 0 ? (1000 * n) / ms : 0);
  return {
    cache_n: 0,
    prompt_n: promptTokens,
    prompt_ms: prefillMs,
    prompt_per_token_ms: perToken(prefillMs, promptTokens),
    prompt_per_second: perSecond(prefillMs, promptTokens),
    predicted_n: completionTokens,
    predicted_ms: decodeMs,
    predicted_per_token_ms: perToken(decodeMs, completionTokens),
    predicted_per_second: perSecond(decodeMs, completionTokens),
    ...(r.drafts ? { draft_n: r.drafts.proposed, draft_n_accepted: r.drafts.accepted } : {}),
  };
}

/** What every object of one response shares. */
export interface ResponseHead {
  id: string;
  created: number;
  model: string;
  system_fingerprint: string;
}

export function responseHead(prefix: "chatcmpl" | "cmpl", model: string, fingerprint: string): ResponseHead {
  return { id: `${prefix}-${crypto.randomUUID().replaceAll("-", "")}`, created: Math.floor(Date.now() / 1000), model, system_fingerprint: fingerprint };
}

export function chatCompletion(head: ResponseHead, r: GenerationResult) {
  return {
    ...head,
    object: "chat.completion" as const,
    choices: [
      { index: 0, message: { role: "assistant" as const, content: r.text, refusal: null }, logprobs: null, finish_reason: finishReason(r.finishReason) },
    ],
    usage: usage(r),
    timings: timings(r),
  };
}

/** One streamed piece: the first carries the role, the last the finish reason, with include_usage a final one the usage. */
export function chatChunk(
  head: ResponseHead,
  delta: { role?: "assistant"; content?: string },
  finish: OpenAIFinishReason | null,
) {
  return {
    ...head,
    object: "chat.completion.chunk" as const,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  };
}

export function chatUsageChunk(head: ResponseHead, r: GenerationResult) {
  return { ...head, object: "chat.completion.chunk" as const, choices: [], usage: usage(r), timings: timings(r) };
}

export function textCompletion(head: ResponseHead, text: string, r: GenerationResult) {
  return {
    ...head,
    object: "text_completion" as const,
    choices: [{ index: 0, text, logprobs: null, finish_reason: finishReason(r.finishReason) }],
    usage: usage(r),
    timings: timings(r),
  };
}

export function textChunk(head: ResponseHead, text: string, finish: OpenAIFinishReason | null) {
  return { ...head, object: "text_completion" as const, choices: [{ index: 0, text, logprobs: null, finish_reason: finish }] };
}

export function textUsageChunk(head: ResponseHead, r: GenerationResult) {
  return { ...head, object: "text_completion" as const, choices: [], usage: usage(r), timings: timings(r) };
}

export interface ModelObject {
  id: string;
  object: "model";
  created: number;
  owned_by: string;
}

export function modelObject(id: string, created: number): ModelObject {
  return { id, object: "model", created, owned_by: "cherenkov" };
}
