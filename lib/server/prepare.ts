// Turns a validated request into what a generation needs: prompt token ids (chat template or
// tokenizer or ids as sent), the completion budget inside the context, stop strings, stream mode.
import type { GenerateOptions, Model } from "../api/model.ts";
import type { TemplateMessage } from "../model/tokenizer.ts";
import type { PromptEncoder } from "./encoder.ts";
import { ApiError, fieldError } from "./errors.ts";
import { ChatCompletionRequest, CompletionRequest, parseRequest } from "./schemas.ts";

export interface RequestLimits {
  model: Model;
  /** The only name accepted in a request's `model` field. */
  modelId: string;
  /** Prompt + completion tokens per request. */
  contextLength: number;
  /** Completion tokens when the request sets none (cut to what the context leaves). */
  defaultMaxTokens: number;
  /** Tokenizes prompts off the event loop (null: the model has no tokenizer). */
  encoder: PromptEncoder | null;
}

/** What a request asks of the sampler (absent fields: the library's defaults, greedy). */
export type Sampling = Pick<
  GenerateOptions,
  "temperature" | "topK" | "topP" | "minP" | "repetitionPenalty" | "presencePenalty" | "frequencyPenalty" | "seed" | "logprobs" | "topLogprobs"
>;

export interface Prepared {
  prompt: number[];
  maxTokens: number;
  stop: string[];
  stream: boolean;
  includeUsage: boolean;
  sampling: Sampling;
  /** Tools were rendered into the prompt: the output is parsed for tool calls. */
  tools: boolean;
}

/** The request's sampling fields (OpenAI's names) as GenerateOptions. */
export function samplingOptions(
  req: {
    temperature?: number | null;
    top_p?: number | null;
    top_k?: number | null;
    min_p?: number | null;
    presence_penalty?: number | null;
    frequency_penalty?: number | null;
    repetition_penalty?: number | null;
    seed?: number | null;
  },
  logprobs: { on: boolean; top: number },
): Sampling {
  const opt = <T>(v: T | null | undefined) => (v == null ? undefined : v);
  const out: Sampling = {
    temperature: opt(req.temperature),
    topP: opt(req.top_p),
    topK: req.top_k == null || req.top_k <= 0 ? undefined : req.top_k,
    minP: opt(req.min_p),
    presencePenalty: opt(req.presence_penalty),
    frequencyPenalty: opt(req.frequency_penalty),
    repetitionPenalty: opt(req.repetition_penalty),
    seed: opt(req.seed),
    ...(logprobs.on ? { logprobs: true, topLogprobs: logprobs.top } : {}),
  };
  for (const k of Object.keys(out) as (keyof Sampling)[]) if (out[k] === undefined) delete out[k];
  return out;
}

export function checkModel({ modelId }: RequestLimits, requested: string | null | undefined): void {
  if (requested != null && requested !== modelId)
    throw new ApiError(404, `the model "${requested}" does not exist: this server runs "${modelId}"`, "model", "model_not_found");
}

export function checkContext(
  { contextLength, defaultMaxTokens }: RequestLimits,
  prompt: number[],
  promptParam: string,
  maxTokens: number | null | undefined,
  maxParam: string,
): number {
  if (prompt.length >= contextLength)
    throw new ApiError(
      400,
      `${promptParam}: the prompt has ${prompt.length} tokens; this server's context is ${contextLength} tokens (prompt + completion)`,
      promptParam,
      "context_length_exceeded",
    );
  const room = contextLength - prompt.length;
  if (maxTokens == null) return Math.min(defaultMaxTokens, room);
  if (maxTokens > room)
    throw new ApiError(
      400,
      `${maxParam}: ${maxTokens} completion tokens do not fit: the prompt has ${prompt.length} tokens and the context is ${contextLength}`,
      maxParam,
      "context_length_exceeded",
    );
  return maxTokens;
}

/**
 * One turn as chat templates read it: "developer" is OpenAI's new name for "system" (templates
 * know the old one), text parts are joined, and a call's arguments are an object (Qwen's
 * templates print a string as it is and an object as JSON; both come out the same).
 */
export function templateMessage(
  role: string,
  content: string | { text?: string }[] | null | undefined,
  toolCalls?: { id: string; function: { name: string; arguments: string } }[] | null,
  toolCallId?: string | null,
  name?: string | null,
): TemplateMessage {
  const m: TemplateMessage = {
    role: role === "developer" ? "system" : role,
    content: content == null ? (toolCalls?.length ? "" : null) : typeof content === "string" ? content : content.map((p) => p.text ?? "").join("\n"),
  };
  if (toolCalls?.length)
    m.tool_calls = toolCalls.map((c) => ({ id: c.id, type: "function" as const, function: { name: c.function.name, arguments: parseArguments(c.function.arguments) } }));
  if (toolCallId != null) m.tool_call_id = toolCallId;
  if (name != null) m.name = name;
  return m;
}

function parseArguments(text: string): unknown {
  try {
    const v = JSON.parse(text);
    return typeof v === "object" && v !== null ? v : text;
  } catch {
    return text;
  }
}

/**
 * The tools to render, or undefined for none: refused (400) when the model's chat template does
 * not render tools (it would silently ignore them), dropped with tool_choice "none".
 */
export async function checkTools(limits: RequestLimits, tools: unknown[] | null | undefined, choice: unknown, param: string): Promise<unknown[] | undefined> {
  if (tools == null || tools.length === 0 || choice === "none") return undefined;
  if (!(await limits.encoder!.info()).tools)
    throw new ApiError(400, `${param}: the chat template of ${limits.modelId} does not render tools, so the model cannot call them`, param, "tools_unsupported");
  return tools;
}

/** A chat request as token ids and limits: the messages through the model's chat template. */
export async function prepareChat(limits: RequestLimits, body: unknown): Promise<Prepared> {
  const { modelId, encoder } = limits;
  const req = parseRequest(ChatCompletionRequest, body);
  checkModel(limits, req.model);
  if (!encoder) throw new ApiError(400, `${modelId} has no tokenizer: use /v1/completions with token ids`, "messages");
  if (!(await encoder.info()).hasChatTemplate) throw new ApiError(400, `${modelId} has no chat template: use /v1/completions`, "messages");
  const messages: TemplateMessage[] = req.messages.map((m) => templateMessage(m.role, m.content, m.tool_calls, m.tool_call_id, m.name));
  const tools = await checkTools(limits, req.tools, req.tool_choice, "tools");
  // contents are tokenized as text: a special token typed in a message stays characters
  const prompt = await encoder.chat(messages, tools, "messages");
  const maxParam = req.max_completion_tokens != null ? "max_completion_tokens" : "max_tokens";
  if ((req.top_logprobs ?? 0) > 0 && req.logprobs !== true) throw fieldError("top_logprobs", "needs logprobs: true");
  return {
    sampling: samplingOptions(req, { on: req.logprobs === true, top: req.top_logprobs ?? 0 }),
    tools: tools !== undefined,
    prompt,
    maxTokens: checkContext(limits, prompt, "messages", req.max_completion_tokens ?? req.max_tokens, maxParam),
    stop: stopList(req.stop),
    stream: req.stream ?? false,
    includeUsage: req.stream_options?.include_usage ?? false,
  };
}

/** A completion request as token ids and limits; `echo` is the prompt text to repeat, or "". */
export async function prepareCompletion(limits: RequestLimits, body: unknown): Promise<Prepared & { echo: string }> {
  const { model, modelId, encoder } = limits;
  const req = parseRequest(CompletionRequest, body);
  checkModel(limits, req.model);
  let p = req.prompt;
  if (Array.isArray(p) && p.length > 0 && (typeof p[0] === "string" || Array.isArray(p[0]))) {
    if (p.length > 1) throw fieldError("prompt", "batched prompts are not supported: send one prompt per request");
    p = p[0] as string | number[];
  }
  let prompt: number[];
  if (typeof p === "string") {
    if (p === "") throw fieldError("prompt", "must not be empty");
    if (!encoder) throw fieldError("prompt", `${modelId} has no tokenizer: send token ids`);
    prompt = await encoder.text(p, "prompt");
  } else {
    prompt = p as number[];
    if (prompt.length === 0) throw fieldError("prompt", "must not be empty");
    const vocab = model.config.vocab_size;
    const bad = prompt.findIndex((t) => t >= vocab);
    if (bad >= 0) throw fieldError("prompt", `token ${prompt[bad]} at [${bad}] is outside the vocabulary (vocab_size ${vocab})`);
  }
  if (prompt.length === 0) throw fieldError("prompt", "has no tokens");
  return {
    sampling: samplingOptions(req, { on: req.logprobs != null, top: req.logprobs ?? 0 }),
    tools: false,
    prompt,
    maxTokens: checkContext(limits, prompt, "prompt", req.max_tokens, "max_tokens"),
    stop: stopList(req.stop),
    stream: req.stream ?? false,
    includeUsage: req.stream_options?.include_usage ?? false,
    echo: req.echo ? (typeof p === "string" ? p : model.decode(prompt)) : "",
  };
}

function stopList(stop: string | string[] | null | undefined): string[] {
  return stop == null ? [] : typeof stop === "string" ? [stop] : stop;
}
