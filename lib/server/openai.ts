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

/** Extension: where the time went (llama.cpp's servers report the same). */
export function timings(r: GenerationResult) {
  return { prefill_ms: r.timings.prefillMs, decode_ms: r.timings.decodeMs, tokens_per_second: r.timings.tokensPerSecond };
}

/** What every object of one response shares. */
export interface ResponseHead {
  id: string;
  created: number;
  model: string;
}

export function responseHead(prefix: "chatcmpl" | "cmpl", model: string): ResponseHead {
  return { id: `${prefix}-${crypto.randomUUID().replaceAll("-", "")}`, created: Math.floor(Date.now() / 1000), model };
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
