// OpenAI's Responses API (/v1/responses) for text and function tools: what the Vercel AI SDK's
// default OpenAI provider calls. Input items become chat turns for the model's template;
// output is a message item (output_text) and function_call items. Output items are kept in
// memory (item-store.ts) so that item_reference inputs resolve; whole responses are not
// (previous_response_id is refused: a request carries its conversation).
import { z } from "zod";
import type { GenerationResult, TokenLogprob } from "../api/model.ts";
import type { TemplateMessage } from "../model/tokenizer.ts";
import { ApiError, fieldError } from "./errors.ts";
import { chatLogprobs, finishReason } from "./openai.ts";
import { checkContext, checkModel, checkTools, samplingOptions, templateMessage, type Prepared, type RequestLimits } from "./prepare.ts";
import { parseRequest, samplingFields } from "./schemas.ts";
import type { ItemStore } from "./item-store.ts";
import type { ToolCall } from "./tool-calls.ts";
import { parseToolCalls } from "./tool-calls.ts";

const FunctionTool = z.object({
  type: z.literal("function", { error: 'only "function" tools are supported' }),
  name: z.string().min(1, "must not be empty"),
  description: z.string().nullish(),
  parameters: z.record(z.string(), z.unknown()).nullish(),
  strict: z.boolean().nullish(),
});

export const ResponsesRequest = z.object({
  model: z.string().nullish(),
  input: z.union([z.string().min(1, "must not be empty"), z.array(z.record(z.string(), z.unknown())).min(1, "must contain at least one item")], {
    error: (i) => (i.input === undefined ? "is required" : "must be a string or an array of input items"),
  }),
  instructions: z.string().nullish(),
  max_output_tokens: z.number().int("must be an integer").min(1, "must be at least 1").nullish(),
  stream: z.boolean().nullish(),
  ...samplingFields,
  tools: z.array(FunctionTool).nullish(),
  tool_choice: z
    .union([z.string(), z.object({ type: z.string() }).passthrough()])
    .nullish()
    .refine((v) => v == null || v === "auto" || v === "none", 'only "auto" and "none" are supported (a call cannot be forced)'),
  parallel_tool_calls: z.boolean().nullish(),
  previous_response_id: z
    .string()
    .nullish()
    .refine((v) => v == null, "responses are not stored here: send the whole conversation in input"),
  background: z
    .boolean()
    .nullish()
    .refine((v) => v !== true, "background responses are not supported"),
  text: z
    .object({ format: z.object({ type: z.string() }).passthrough().nullish() })
    .passthrough()
    .nullish()
    .refine((v) => v?.format == null || v.format.type === "text", 'only {"format": {"type": "text"}} is supported'),
  include: z.array(z.string()).nullish(),
  top_logprobs: z.number().int("must be an integer").min(0, "must be in [0, 20]").max(20, "must be in [0, 20]").nullish(),
  metadata: z.record(z.string(), z.string()).nullish(),
  /** false: this response's items are not kept for item_reference (default true, as OpenAI). */
  store: z.boolean().nullish(),
  user: z.string().nullish(),
});
export type ResponsesRequest = z.infer<typeof ResponsesRequest>;

export interface PreparedResponse extends Prepared {
  req: ResponsesRequest;
}

/** Text of a content field: a string or parts of type input_text / output_text. */
function contentText(content: unknown, path: string): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) throw fieldError(path, "must be a string or an array of content parts");
  return content
    .map((p, i) => {
      const part = p as { type?: unknown; text?: unknown };
      if (part?.type !== "input_text" && part?.type !== "output_text")
        throw fieldError(`${path}[${i}].type`, `only input_text and output_text parts are supported (got ${JSON.stringify(part?.type)})`);
      if (typeof part.text !== "string") throw fieldError(`${path}[${i}].text`, "is required");
      return part.text;
    })
    .join("\n");
}

/** Input items as chat turns; consecutive function_call items join one assistant turn. */
function inputMessages(req: ResponsesRequest, store: ItemStore): TemplateMessage[] {
  const out: TemplateMessage[] = [];
  if (req.instructions) out.push({ role: "system", content: req.instructions });
  if (typeof req.input === "string") {
    out.push({ role: "user", content: req.input });
    return out;
  }
  req.input.forEach((given, i) => {
    const at = `input[${i}]`;
    let item = given;
    if (item.type === "item_reference") {
      const id = item.id;
      if (typeof id !== "string") throw fieldError(`${at}.id`, "is required");
      const found = store.get(id);
      if (!found)
        throw fieldError(
          `${at}.id`,
          `item ${JSON.stringify(id)} is not known to this server (it keeps its last ${store.capacity} output items in memory, none across restarts): send the turn itself, or set store: false in the client (Vercel AI SDK: providerOptions.openai.store = false)`,
        );
      item = found.type === "message" ? { type: "message", role: "assistant", content: found.text } : { ...found };
    }
    const type = item.type ?? "message";
    if (type === "message") {
      const role = item.role;
      if (role !== "system" && role !== "developer" && role !== "user" && role !== "assistant")
        throw fieldError(`${at}.role`, "must be one of system, developer, user, assistant");
      out.push(templateMessage(role, contentText(item.content, `${at}.content`)));
    } else if (type === "function_call") {
      const { call_id, name, arguments: args } = item as { call_id?: unknown; name?: unknown; arguments?: unknown };
      if (typeof call_id !== "string") throw fieldError(`${at}.call_id`, "is required");
      if (typeof name !== "string") throw fieldError(`${at}.name`, "is required");
      if (typeof args !== "string") throw fieldError(`${at}.arguments`, "must be a string of JSON");
      const call = { id: call_id, function: { name, arguments: args } };
      const prev = out[out.length - 1];
      const joined = templateMessage("assistant", null, [call]);
      if (prev?.role === "assistant" && prev.tool_calls) prev.tool_calls.push(...joined.tool_calls!);
      else if (prev?.role === "assistant" && !prev.tool_calls) prev.tool_calls = joined.tool_calls;
      else out.push(joined);
    } else if (type === "function_call_output") {
      const { call_id, output } = item as { call_id?: unknown; output?: unknown };
      if (typeof call_id !== "string") throw fieldError(`${at}.call_id`, "is required");
      out.push({ role: "tool", content: contentText(output, `${at}.output`), tool_call_id: call_id });
    } else throw fieldError(`${at}.type`, `only message, function_call and function_call_output items are supported (got ${JSON.stringify(type)})`);
  });
  return out;
}

export async function prepareResponse(limits: RequestLimits, body: unknown, store: ItemStore): Promise<PreparedResponse> {
  const { modelId, encoder } = limits;
  const req = parseRequest(ResponsesRequest, body);
  checkModel(limits, req.model);
  if (!encoder) throw new ApiError(400, `${modelId} has no tokenizer: use /v1/completions with token ids`, "input");
  if (!(await encoder.info()).hasChatTemplate) throw new ApiError(400, `${modelId} has no chat template: use /v1/completions`, "input");
  const messages = inputMessages(req, store);
  // Responses' tools are flat ({type, name, parameters}); templates know chat's nested form.
  const chatTools = req.tools?.map((t) => ({ type: "function", function: { name: t.name, description: t.description ?? undefined, parameters: t.parameters ?? undefined } }));
  const tools = await checkTools(limits, chatTools, req.tool_choice, "tools");
  const prompt = await encoder.chat(messages, tools, "input");
  const logprobs = req.include?.includes("message.output_text.logprobs") ?? false;
  return {
    req,
    prompt,
    maxTokens: checkContext(limits, prompt, "input", req.max_output_tokens, "max_output_tokens"),
    stop: [],
    stream: req.stream ?? false,
    includeUsage: true,
    sampling: samplingOptions(req, { on: logprobs, top: req.top_logprobs ?? 0 }),
    tools: tools !== undefined,
  };
}

const newId = (prefix: string) => `${prefix}_${crypto.randomUUID().replaceAll("-", "")}`;

/** Output items of a finished generation: the message (when there is text) and the calls. */
export interface ResponseOutput {
  messageId: string;
  text: string;
  calls: (ToolCall & { itemId: string })[];
  logprobs: TokenLogprob[];
}

export function responseOutput(r: GenerationResult, tools: boolean, messageId: string): ResponseOutput {
  const parsed = tools ? parseToolCalls(r.text) : { content: r.text, calls: [] };
  return { messageId, text: parsed.content, calls: parsed.calls.map((c) => ({ ...c, itemId: newId("fc") })), logprobs: r.logprobs ?? [] };
}

export const responseLogprobs = (lps: TokenLogprob[]) => outputTextLogprobs(lps);

const outputTextLogprobs = (lps: TokenLogprob[]) =>
  chatLogprobs(lps).content.map((e) => ({ token: e.token, logprob: e.logprob, bytes: e.bytes, top_logprobs: e.top_logprobs }));

export function messageItem(id: string, text: string, status: "in_progress" | "completed" | "incomplete", lps: TokenLogprob[] = []) {
  return {
    type: "message" as const,
    id,
    status,
    role: "assistant" as const,
    content: status === "in_progress" ? [] : [outputText(text, lps)],
  };
}

export function outputText(text: string, lps: TokenLogprob[] = []) {
  return { type: "output_text" as const, text, annotations: [], logprobs: outputTextLogprobs(lps) };
}

export function functionCallItem(c: ToolCall & { itemId: string }) {
  return { type: "function_call" as const, id: c.itemId, call_id: c.id, name: c.name, arguments: c.arguments, status: "completed" as const };
}

/** Keeps a finished response's items for item_reference (unless the request said store: false). */
export function storeOutput(store: ItemStore, req: ResponsesRequest, o: ResponseOutput): void {
  if (req.store === false) return;
  if (o.text !== "" || o.calls.length === 0) store.put(o.messageId, { type: "message", text: o.text });
  for (const c of o.calls) store.put(c.itemId, { type: "function_call", call_id: c.id, name: c.name, arguments: c.arguments });
}

export function outputItems(o: ResponseOutput, status: "completed" | "incomplete") {
  const items: unknown[] = [];
  if (o.text !== "" || o.calls.length === 0) items.push(messageItem(o.messageId, o.text, status, o.logprobs));
  items.push(...o.calls.map(functionCallItem));
  return items;
}

/** The response object; `r` absent while it is still in progress. */
export function responseObject(
  head: { id: string; created_at: number; model: string },
  req: ResponsesRequest,
  r: GenerationResult | null,
  output: unknown[],
) {
  const incomplete = r !== null && finishReason(r.finishReason) === "length";
  return {
    id: head.id,
    object: "response" as const,
    created_at: head.created_at,
    status: r === null ? ("in_progress" as const) : incomplete ? ("incomplete" as const) : ("completed" as const),
    ...(r !== null ? { completed_at: Math.floor(Date.now() / 1000) } : {}),
    error: null,
    incomplete_details: incomplete ? { reason: "max_output_tokens" as const } : null,
    instructions: req.instructions ?? null,
    max_output_tokens: req.max_output_tokens ?? null,
    model: head.model,
    output,
    parallel_tool_calls: req.parallel_tool_calls ?? true,
    previous_response_id: null,
    store: req.store ?? true,
    temperature: req.temperature ?? 0,
    top_p: req.top_p ?? 1,
    text: { format: { type: "text" as const } },
    tool_choice: req.tool_choice ?? "auto",
    tools: (req.tools ?? []).map((t) => ({ ...t, strict: t.strict ?? false })),
    truncation: "disabled" as const,
    metadata: req.metadata ?? {},
    usage:
      r === null
        ? null
        : {
            input_tokens: r.usage.promptTokens,
            input_tokens_details: { cached_tokens: 0 },
            output_tokens: r.usage.completionTokens,
            output_tokens_details: { reasoning_tokens: 0 },
            total_tokens: r.usage.promptTokens + r.usage.completionTokens,
          },
  };
}

export function responseHeadOf(model: string) {
  return { id: newId("resp"), created_at: Math.floor(Date.now() / 1000), model };
}

export { newId as responseItemId };
