// Request bodies of /v1/chat/completions, /v1/completions and /v1/responses (zod). Sampling
// parameters are checked against the ranges the library accepts (GenerateOptions), so a bad
// one is a 400 naming the field; what cherenkov cannot do (logit_bias, n > 1) is refused.
import { z } from "zod";
import { ApiError, fieldError } from "./errors.ts";

/** A schema-level message that still says "is required" when the field is absent. */
const unlessMissing = (message: string) => (issue: { input: unknown }) => (issue.input === undefined ? "is required" : message);

/** A number in [lo, hi] (or (lo, hi] with `loOpen`), absent or null. */
function range(lo: number, hi: number, loOpen = false) {
  return z
    .number()
    .nullish()
    .refine((v) => v == null || ((loOpen ? v > lo : v >= lo) && v <= hi), `must be a number in ${loOpen ? "(" : "["}${lo}, ${hi}]`);
}

/** The sampling knobs every generation endpoint takes (OpenAI's, plus top_k, min_p, repetition_penalty as vLLM and llama.cpp take them). */
export const samplingFields = {
  temperature: range(0, 100),
  top_p: range(0, 1, true),
  /** -1 and 0 mean off (vLLM writes -1, llama.cpp 0). */
  top_k: z.number().int("must be an integer").min(-1, "must be >= -1 (-1 or 0: off)").nullish(),
  min_p: range(0, 1),
  presence_penalty: range(-100, 100),
  frequency_penalty: range(-100, 100),
  repetition_penalty: range(0, 100, true),
  seed: z.number().int("must be an integer").min(0, "must be >= 0").max(2 ** 53 - 1, "must be below 2^53").nullish(),
};

/** OpenAI's limit is 4; llama.cpp's is none. */
const MAX_STOP_STRINGS = 16;

const stopField = z
  .union([z.string(), z.array(z.string())], { error: unlessMissing("must be a string or an array of strings") })
  .nullish()
  // after the union, whose one message would otherwise hide this one
  .refine((v) => !Array.isArray(v) || v.length <= MAX_STOP_STRINGS, `must hold at most ${MAX_STOP_STRINGS} stop strings`)
  .refine((v) => v == null || (typeof v === "string" ? v !== "" : v.every((s) => s !== "")), "stop strings must not be empty");

const maxTokensField = z.number().int("must be an integer").min(1, "must be at least 1").nullish();

/** Fields both endpoints share: output length, stop, streaming, and the refused sampling knobs. */
const common = {
  model: z.string().nullish(),
  stop: stopField,
  max_tokens: maxTokensField,
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  ...samplingFields,
  n: z.number().int().nullish().refine((v) => v == null || v === 1, "only n = 1 is supported (send one request per choice)"),
  logit_bias: z
    .record(z.string(), z.number())
    .nullish()
    .refine((v) => v == null || Object.keys(v).length === 0, "logit_bias is not supported"),
  user: z.string().nullish(),
};

const ContentPart = z
  .object({ type: z.string(), text: z.string().optional() })
  .superRefine((p, ctx) => {
    if (p.type !== "text") ctx.addIssue({ code: "custom", path: ["type"], message: `only "text" content parts are supported (got "${p.type}")` });
    else if (p.text === undefined) ctx.addIssue({ code: "custom", path: ["text"], message: "is required" });
  });

/** A call an assistant turn made (sent back in the history). */
const ToolCallField = z.object({
  id: z.string(),
  type: z.literal("function").optional(),
  function: z.object({ name: z.string(), arguments: z.string() }),
});

const Message = z
  .object({
    role: z.enum(["system", "developer", "user", "assistant", "tool"], {
      error: unlessMissing("must be one of system, developer, user, assistant, tool"),
    }),
    content: z.union([z.string(), z.array(ContentPart)], { error: unlessMissing("must be a string or an array of content parts") }).nullish(),
    name: z.string().nullish(),
    tool_calls: z.array(ToolCallField).nullish(),
    tool_call_id: z.string().nullish(),
  })
  .superRefine((m, ctx) => {
    // An assistant turn that only called tools has no content; every other turn needs some.
    if (m.content == null && !(m.role === "assistant" && (m.tool_calls?.length ?? 0) > 0))
      ctx.addIssue({ code: "custom", path: ["content"], message: "is required" });
    if (m.tool_calls != null && m.role !== "assistant") ctx.addIssue({ code: "custom", path: ["tool_calls"], message: "only assistant turns carry tool calls" });
  });

/** A function tool as OpenAI's chat API sends it. */
export const FunctionTool = z.object({
  type: z.literal("function", { error: 'only "function" tools are supported' }),
  function: z.object({
    name: z.string().min(1, "must not be empty"),
    description: z.string().nullish(),
    parameters: z.record(z.string(), z.unknown()).nullish(),
    strict: z.boolean().nullish(),
  }),
});

/** "auto" and "none" only: cherenkov cannot force a call ("required", a named function). */
export const toolChoiceField = z
  .union([z.string(), z.object({ type: z.string() }).passthrough()])
  .nullish()
  .refine((v) => v == null || v === "auto" || v === "none", 'only "auto" and "none" are supported (a call cannot be forced)');

export const ChatCompletionRequest = z.object({
  ...common,
  messages: z.array(Message).min(1, "must contain at least one message"),
  max_completion_tokens: maxTokensField,
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int("must be an integer").min(0, "must be in [0, 20]").max(20, "must be in [0, 20]").nullish(),
  tools: z.array(FunctionTool).nullish(),
  tool_choice: toolChoiceField,
  parallel_tool_calls: z.boolean().nullish(),
  response_format: z
    .object({ type: z.string() })
    .nullish()
    .refine((v) => v == null || v.type === "text", 'only {"type": "text"} is supported'),
});
export type ChatCompletionRequest = z.infer<typeof ChatCompletionRequest>;

const tokenIds = z.array(z.number().int("token ids must be integers").min(0, "token ids must be >= 0"));

export const CompletionRequest = z.object({
  ...common,
  prompt: z.union([z.string(), tokenIds, z.array(z.string()), z.array(tokenIds)], {
    error: unlessMissing("must be a string or an array of token ids"),
  }),
  echo: z.boolean().nullish(),
  suffix: z.string().nullish().refine((v) => v == null || v === "", "is not supported"),
  best_of: z.number().int().nullish().refine((v) => v == null || v === 1, "only best_of = 1 is supported"),
  /** The legacy form: how many alternatives per token (0..5); any value turns log probabilities on. */
  logprobs: z.number().int("must be an integer").min(0, "must be in [0, 5]").max(5, "must be in [0, 5]").nullish(),
});
export type CompletionRequest = z.infer<typeof CompletionRequest>;

/** ["messages", 0, "content"] -> "messages[0].content" */
export function fieldPath(path: PropertyKey[]): string {
  return path.map((p, i) => (typeof p === "number" ? `[${p}]` : i === 0 ? String(p) : `.${String(p)}`)).join("");
}

/** Validates `body` against `schema`; the error names the first wrong field (param) and lists all. */
export function parseRequest<T extends z.ZodType>(schema: T, body: unknown): z.infer<T> {
  if (typeof body !== "object" || body === null || Array.isArray(body))
    throw new ApiError(400, "the request body must be a JSON object", null, "invalid_body");
  const r = schema.safeParse(body, { error: (issue) => (issue.input === undefined ? "is required" : undefined) });
  if (r.success) return r.data;
  const issues = r.error.issues;
  const first = issues[0]!;
  if (issues.length === 1) throw fieldError(fieldPath(first.path), first.message);
  const all = issues.map((i) => `${fieldPath(i.path)}: ${i.message}`).join("; ");
  throw new ApiError(400, all, fieldPath(first.path));
}
