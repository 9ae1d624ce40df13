// Ollama's API (/api/chat, /api/generate, /api/tags, /api/show, /api/version) over the same
// generation path as the OpenAI one: many local tools (Open WebUI, Continue, editors'
// plugins, LangChain's Ollama classes) speak only this. A request is translated into the
// OpenAI request it means and prepared (validated, encoded, fitted to the context) by the
// same code; answers are Ollama's objects, streamed as NDJSON (one JSON object a line), and
// errors are Ollama's `{"error": "..."}`. Defaults are this server's, not Ollama's: greedy
// unless `options.temperature` is given, and --max-tokens unless `options.num_predict`.
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { z } from "zod";

import type { GenerationResult } from "../api/model.ts";
import { ApiError } from "./errors.ts";
import type { ServedResult } from "./generation.ts";
import { prepareChat, prepareCompletion, type Prepared, type RequestLimits } from "./prepare.ts";
import { parseRequest } from "./schemas.ts";
import { parseToolCalls, ToolCallSplitter, type ToolCall } from "./tool-calls.ts";

/** Ollama's `options` this server honours; other keys (num_ctx, num_gpu, ...) are ignored as Ollama ignores unknown ones. */
const Options = z
  .object({
    num_predict: z.number().int("must be an integer").nullish(),
    temperature: z.number().nullish(),
    top_p: z.number().nullish(),
    top_k: z.number().nullish(),
    min_p: z.number().nullish(),
    seed: z.number().nullish(),
    stop: z.array(z.string()).nullish(),
    repeat_penalty: z.number().nullish(),
    presence_penalty: z.number().nullish(),
    frequency_penalty: z.number().nullish(),
  })
  .passthrough()
  .nullish();

const ToolCallIn = z.object({ function: z.object({ name: z.string(), arguments: z.record(z.string(), z.unknown()).nullish() }) });

const Message = z.object({
  role: z.enum(["system", "user", "assistant", "tool"]),
  content: z.string().nullish(),
  images: z.array(z.string()).max(0, "images are not supported (the model reads text)").nullish(),
  tool_calls: z.array(ToolCallIn).nullish(),
  tool_name: z.string().nullish(),
});

/** Fields both endpoints take and refuse alike. */
const common = {
  model: z.string({ error: "is required" }),
  stream: z.boolean().nullish(),
  options: Options,
  format: z.unknown().refine((v) => v == null || v === "", "structured output (format) is not supported").optional(),
  keep_alive: z.unknown().optional(),
  think: z.unknown().optional(),
};

const ChatRequest = z.object({ ...common, messages: z.array(Message), tools: z.array(z.unknown()).nullish() });

const GenerateRequest = z.object({
  ...common,
  prompt: z.string().nullish(),
  system: z.string().nullish(),
  raw: z.boolean().nullish(),
  suffix: z.string().max(0, "fill-in-the-middle (suffix) is not supported").nullish(),
  template: z.string().max(0, "a template other than the model's is not supported").nullish(),
  images: z.array(z.string()).max(0, "images are not supported (the model reads text)").nullish(),
  context: z.array(z.number()).max(0, "context (the old continuation tokens) is not supported: send the whole prompt").nullish(),
});

/** Ollama names carry a tag; this server's model answers to its id with or without ":latest". */
export function ollamaName(modelId: string): string {
  return `${modelId}:latest`;
}

function checkOllamaModel(modelId: string, requested: string): void {
  if (requested !== modelId && requested !== ollamaName(modelId))
    throw new ApiError(404, `model "${requested}" not found: this server runs "${ollamaName(modelId)}"`, "model", "model_not_found");
}

/** Ollama's options as the OpenAI request fields they mean (max_tokens from num_predict > 0). */
function openaiFields(o: z.infer<typeof Options>) {
  return {
    temperature: o?.temperature,
    top_p: o?.top_p,
    top_k: o?.top_k,
    min_p: o?.min_p,
    seed: o?.seed,
    stop: o?.stop,
    repetition_penalty: o?.repeat_penalty,
    presence_penalty: o?.presence_penalty,
    frequency_penalty: o?.frequency_penalty,
    max_tokens: o?.num_predict != null && o.num_predict > 0 ? o.num_predict : undefined,
  };
}

/** num_predict -1 (no limit) or -2 (fill the context): what the context leaves after the prompt. */
function fitted(job: Prepared, limits: RequestLimits, numPredict: number | null | undefined): Prepared {
  return numPredict != null && numPredict < 0 ? { ...job, maxTokens: Math.max(1, limits.contextLength - job.prompt.length) } : job;
}

export interface OllamaJob {
  job: Prepared;
  stream: boolean;
  /** "chat" answers carry `message`, "generate" answers `response`. */
  kind: "chat" | "generate";
  model: string;
}

/** An /api/chat request, prepared as /v1/chat/completions prepares its own. */
export async function prepareOllamaChat(limits: RequestLimits, body: unknown): Promise<OllamaJob> {
  const req = parseRequest(ChatRequest, body);
  checkOllamaModel(limits.modelId, req.model);
  const messages = req.messages.map((m) => ({
    role: m.role,
    content: m.content ?? "",
    ...(m.role === "tool" && m.tool_name ? { name: m.tool_name } : {}),
    ...(m.tool_calls?.length
      ? { tool_calls: m.tool_calls.map((c, i) => ({ id: `call_${i}`, type: "function", function: { name: c.function.name, arguments: JSON.stringify(c.function.arguments ?? {}) } })) }
      : {}),
  }));
  const job = await prepareChat(limits, { messages, tools: req.tools ?? undefined, ...openaiFields(req.options) });
  return { job: fitted(job, limits, req.options?.num_predict), stream: req.stream ?? true, kind: "chat", model: req.model };
}

/** An /api/generate request: the prompt through the chat template (with `system`), or as it is with `raw`. Null: an empty prompt, which only loads the model. */
export async function prepareOllamaGenerate(limits: RequestLimits, body: unknown): Promise<OllamaJob | { load: true; model: string }> {
  const req = parseRequest(GenerateRequest, body);
  checkOllamaModel(limits.modelId, req.model);
  const prompt = req.prompt ?? "";
  if (prompt === "" && !req.system) return { load: true, model: req.model };
  const fields = openaiFields(req.options);
  const job = req.raw
    ? await prepareCompletion(limits, { prompt, ...fields })
    : await prepareChat(limits, { messages: [...(req.system ? [{ role: "system", content: req.system }] : []), { role: "user", content: prompt }], ...fields });
  return { job: fitted(job, limits, req.options?.num_predict), stream: req.stream ?? true, kind: "generate", model: req.model };
}

const nanoseconds = (ms: number) => Math.round(ms * 1e6);

/** The closing fields of an answer: why it ended, token counts and durations (nanoseconds, as Ollama gives them). */
function closing(r: GenerationResult, totalMs: number) {
  return {
    done: true,
    done_reason: r.finishReason === "length" ? "length" : "stop",
    total_duration: nanoseconds(totalMs),
    load_duration: 0,
    prompt_eval_count: r.usage.promptTokens - ((r as ServedResult).cachedTokens ?? 0),
    prompt_eval_duration: nanoseconds(r.timings.prefillMs),
    eval_count: r.usage.completionTokens,
    eval_duration: nanoseconds(r.timings.decodeMs),
  };
}

const ollamaCalls = (calls: ToolCall[]) => calls.map((c) => ({ function: { name: c.name, arguments: JSON.parse(c.arguments) as unknown } }));

/** A chat message or generate response piece: `text` (and, at the end, tool calls). */
function piece(o: OllamaJob, text: string, calls: ToolCall[] = []) {
  const head = { model: o.model, created_at: new Date().toISOString() };
  if (o.kind === "generate") return { ...head, response: text };
  return { ...head, message: { role: "assistant", content: text, ...(calls.length ? { tool_calls: ollamaCalls(calls) } : {}) } };
}

/** The whole answer (stream: false). */
export function ollamaAnswer(o: OllamaJob, r: GenerationResult, totalMs: number) {
  const parsed = o.job.tools ? parseToolCalls(r.text) : { content: r.text, calls: [] };
  return { ...piece(o, parsed.content, parsed.calls), ...closing(r, totalMs) };
}

/** The streamed answer's lines: each piece of text, then the closing line (with any tool calls). */
export function ollamaStream(o: OllamaJob, t0: number) {
  const splitter = o.job.tools ? new ToolCallSplitter() : null;
  return {
    piece: (text: string) => {
      const content = splitter ? splitter.push(text) : text;
      return content === "" ? null : { ...piece(o, content), done: false };
    },
    last: (r: GenerationResult) => {
      const end = splitter?.finish() ?? { content: "", calls: [] };
      return { ...piece(o, end.content, end.calls), ...closing(r, performance.now() - t0) };
    },
    error: (e: ApiError) => ({ error: e.message }),
    encode: (event: unknown) => new TextEncoder().encode(JSON.stringify(event) + "\n"),
    done: false,
    headers: { "content-type": "application/x-ndjson" },
  };
}

/** /api/generate with an empty prompt: Ollama's way to load a model; it is loaded. */
export function loadedAnswer(model: string) {
  return { model, created_at: new Date().toISOString(), response: "", done: true, done_reason: "load" };
}

/** What /api/tags lists and /api/show describes about the model. */
export interface OllamaModelFacts {
  modelId: string;
  dir: string;
  architecture: string;
  contextLength: number;
  hiddenSize: number;
  layers: number;
  /** A stable digest of the model and server settings (the system fingerprint's hash). */
  digest: string;
  /** The chat template renders tools. */
  tools: boolean;
}

function filesOf(dir: string): { size: number; modified: Date } {
  let size = 0;
  let modified = new Date(0);
  for (const name of readdirSync(dir)) {
    const st = statSync(join(dir, name));
    if (!st.isFile()) continue;
    size += st.size;
    if (st.mtime > modified) modified = st.mtime;
  }
  return { size, modified };
}

function details(f: OllamaModelFacts) {
  return { parent_model: "", format: "cherenkov", family: f.architecture, families: [f.architecture], parameter_size: "", quantization_level: "" };
}

/** /api/tags: the one model this server runs. */
export function ollamaTags(f: OllamaModelFacts) {
  const { size, modified } = filesOf(f.dir);
  const name = ollamaName(f.modelId);
  return { models: [{ name, model: name, modified_at: modified.toISOString(), size, digest: f.digest, details: details(f) }] };
}

const ShowRequest = z.object({ model: z.string().nullish(), name: z.string().nullish() });

/** /api/show: the model's details (`model`, or `name` as older clients send it). */
export function ollamaShow(f: OllamaModelFacts, body: unknown) {
  const req = parseRequest(ShowRequest, body);
  const requested = req.model ?? req.name;
  if (!requested) throw new ApiError(400, "model: is required", "model");
  checkOllamaModel(f.modelId, requested);
  const a = f.architecture;
  return {
    modelfile: "",
    parameters: "",
    template: "",
    details: details(f),
    model_info: { "general.architecture": a, [`${a}.context_length`]: f.contextLength, [`${a}.embedding_length`]: f.hiddenSize, [`${a}.block_count`]: f.layers },
    capabilities: ["completion", ...(f.tools ? ["tools"] : [])],
    modified_at: filesOf(f.dir).modified.toISOString(),
  };
}
