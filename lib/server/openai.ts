// Response bodies in OpenAI's shapes (chat.completion, chat.completion.chunk, text_completion,
// model list), with log probabilities when asked for. Only what cherenkov produces: one choice.
import type { FinishReason, GenerationResult, TokenLogprob } from "../api/model.ts";
import { parseToolCalls, type ToolCall } from "./tool-calls.ts";

const encoder = new TextEncoder();
const bytesOf = (s: string) => Array.from(encoder.encode(s));

/** Chat's `logprobs`: {content: [{token, logprob, bytes, top_logprobs}], refusal}. */
export function chatLogprobs(lps: TokenLogprob[]) {
  return {
    content: lps.map((e) => ({
      token: e.text,
      logprob: e.logprob,
      bytes: bytesOf(e.text),
      top_logprobs: e.top.map((t) => ({ token: t.text, logprob: t.logprob, bytes: bytesOf(t.text) })),
    })),
    refusal: null,
  };
}

/** The legacy completions `logprobs`: parallel arrays, `text_offset` counted from `offset` (UTF-16 units, as OpenAI's Python counts characters). */
export function completionLogprobs(lps: TokenLogprob[], offset: number) {
  const text_offset: number[] = [];
  for (const e of lps) {
    text_offset.push(offset);
    offset += e.text.length;
  }
  return {
    tokens: lps.map((e) => e.text),
    token_logprobs: lps.map((e) => e.logprob),
    top_logprobs: lps.map((e) => Object.fromEntries(e.top.map((t) => [t.text, t.logprob]))),
    text_offset,
  };
}

export type OpenAIFinishReason = "stop" | "length" | "tool_calls";

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
 * tools written for it read ours. cache_n: prompt tokens a saved checkpoint already held
 * (lib/server/prompt-cache.ts); prompt_n: the ones prefilled.
 */
export function timings(r: GenerationResult & { cachedTokens?: number }) {
  const { prefillMs, decodeMs } = r.timings;
  const { completionTokens } = r.usage;
  const cached = r.cachedTokens ?? 0;
  const promptTokens = r.usage.promptTokens - cached;
  const perToken = (ms: number, n: number) => (n > 0 ? ms / n : 0);
  const perSecond = (ms: number, n: number) => (ms > 0 ? (1000 * n) / ms : 0);
  return {
    cache_n: cached,
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

/** OpenAI's tool_calls entries; `index` for stream deltas. */
export function toolCallEntries(calls: ToolCall[], withIndex = false) {
  return calls.map((c, i) => ({ ...(withIndex ? { index: i } : {}), id: c.id, type: "function" as const, function: { name: c.name, arguments: c.arguments } }));
}

/** With `tools`, the text is parsed for calls: they become tool_calls and finish_reason "tool_calls". */
export function chatCompletion(head: ResponseHead, r: GenerationResult, tools = false) {
  const parsed = tools ? parseToolCalls(r.text) : { content: r.text, calls: [] };
  const called = parsed.calls.length > 0;
  return {
    ...head,
    object: "chat.completion" as const,
    choices: [
      {
        index: 0,
        message: {
          role: "assistant" as const,
          content: called && parsed.content === "" ? null : parsed.content,
          refusal: null,
          ...(called ? { tool_calls: toolCallEntries(parsed.calls) } : {}),
        },
        logprobs: r.logprobs ? chatLogprobs(r.logprobs) : null,
        finish_reason: called ? ("tool_calls" as const) : finishReason(r.finishReason),
      },
    ],
    usage: usage(r),
    timings: timings(r),
  };
}

/** One streamed piece: the first carries the role, the last the finish reason, with include_usage a final one the usage. */
export function chatChunk(
  head: ResponseHead,
  delta: { role?: "assistant"; content?: string; tool_calls?: ReturnType<typeof toolCallEntries> },
  finish: OpenAIFinishReason | null,
  logprobs?: TokenLogprob[],
) {
  return {
    ...head,
    object: "chat.completion.chunk" as const,
    choices: [{ index: 0, delta, logprobs: logprobs && logprobs.length > 0 ? chatLogprobs(logprobs) : null, finish_reason: finish }],
  };
}

export function chatUsageChunk(head: ResponseHead, r: GenerationResult) {
  return { ...head, object: "chat.completion.chunk" as const, choices: [], usage: usage(r), timings: timings(r) };
}

/** `echo`: the prompt text before the completion (log probabilities are the completion's only). */
export function textCompletion(head: ResponseHead, echo: string, r: GenerationResult) {
  return {
    ...head,
    object: "text_completion" as const,
    choices: [{ index: 0, text: echo + r.text, logprobs: r.logprobs ? completionLogprobs(r.logprobs, echo.length) : null, finish_reason: finishReason(r.finishReason) }],
    usage: usage(r),
    timings: timings(r),
  };
}

export function textChunk(head: ResponseHead, text: string, finish: OpenAIFinishReason | null, logprobs: ReturnType<typeof completionLogprobs> | null = null) {
  return { ...head, object: "text_completion" as const, choices: [{ index: 0, text, logprobs, finish_reason: finish }] };
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
