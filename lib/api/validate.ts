// What callers of the library pass, checked before it is used: prompts and generation options
// are plain JavaScript values at run time whatever their TypeScript types say, and a value of
// the wrong shape must be refused by name, never reinterpreted (a string of stop strings split
// into characters, a `{}` prompt generating, `stop: [""]` ignored). Numeric ranges of the
// sampling options stay with samplingParams (lib/reference/sampling.ts), which names them.
import { z } from "zod";
import type { ChatMessage } from "../model/tokenizer.ts";

/** A value passed to the API does not have the shape the API documents. */
export class InvalidArgumentError extends TypeError {
  override name = "InvalidArgumentError";
}

const describe = (e: z.ZodError, what: string) =>
  e.issues.map((i) => `${[what, ...i.path].join(".").replace(/\.(\d+)/g, "[$1]")}: ${i.message}`).join("; ");

const TokenIds = z.array(z.number().int("must be an integer token id").nonnegative("must be a token id >= 0"));
const Message = z.object({
  role: z.string().min(1, "must be a non-empty string"),
  content: z.string({ error: "must be a string (the message's text)" }),
});
const Messages = z.array(Message).min(1);

/** The three shapes of a prompt (text, token ids, chat messages), as one value. */
export type ParsedPrompt = { kind: "text"; text: string } | { kind: "ids"; ids: number[] } | { kind: "chat"; messages: ChatMessage[] };

/**
 * Checks a prompt's shape: a string, an array of integer token ids, or a non-empty array of
 * {role, content: string} messages. Ids are checked against `vocabSize` (0..vocabSize-1).
 */
export function parsePrompt(prompt: unknown, vocabSize: number, what = "prompt"): ParsedPrompt {
  if (typeof prompt === "string") return { kind: "text", text: prompt };
  if (!Array.isArray(prompt))
    throw new InvalidArgumentError(`${what}: expected a string, an array of token ids or an array of chat messages, got ${kindOf(prompt)}`);
  if (prompt.length > 0 && prompt.every((x) => typeof x === "number")) {
    const r = TokenIds.safeParse(prompt);
    if (!r.success) throw new InvalidArgumentError(describe(r.error, what));
    return { kind: "ids", ids: checkVocab(r.data, vocabSize, what) };
  }
  if (prompt.length > 0 && prompt.every((x) => typeof x === "object" && x !== null && !Array.isArray(x))) {
    const r = Messages.safeParse(prompt);
    if (!r.success) throw new InvalidArgumentError(describe(r.error, what));
    return { kind: "chat", messages: prompt as ChatMessage[] };
  }
  if (prompt.length === 0) return { kind: "ids", ids: [] };
  throw new InvalidArgumentError(`${what}: an array must hold only token ids (numbers) or only chat messages ({role, content}); [0] is ${kindOf(prompt[0])}`);
}

/** Refuses ids at or past the vocabulary (the embedding has no row for them). */
export function checkVocab(ids: readonly number[], vocabSize: number, what = "prompt"): number[] {
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i]!;
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize)
      throw new InvalidArgumentError(`${what}[${i}]: token id ${id} is outside the vocabulary (0..${vocabSize - 1})`);
  }
  return ids as number[];
}

const num = z.number({ error: "must be a number" });
const GenerateOptionsSchema = z.strictObject({
  // ranges are checked where the values are used, with messages naming the value
  maxTokens: num.optional(),
  stopAtEos: z.boolean().optional(),
  stop: z
    .array(z.string({ error: "must be a string" }).min(1, "must not be empty (an empty stop string would end every generation at once)"), {
      error: (i) => (typeof i.input === "string" ? `must be an array of strings: write [${JSON.stringify(i.input)}] for one stop string` : "must be an array of strings"),
    })
    .optional(),
  drafts: z.union([num, z.literal("auto")], { error: 'must be an integer >= 0 or "auto"' }).optional(),
  signal: z.instanceof(AbortSignal, { error: "must be an AbortSignal" }).optional(),
  seed: num.optional(),
  logprobs: z.boolean().optional(),
  topLogprobs: num.optional(),
  temperature: num.optional(),
  topK: num.optional(),
  topP: num.optional(),
  minP: num.optional(),
  repetitionPenalty: num.optional(),
  presencePenalty: num.optional(),
  frequencyPenalty: num.optional(),
});

/** Checks generation options' names and types (an unknown name, e.g. `max_tokens`, is refused). */
export function checkGenerateOptions(opts: unknown, what = "options"): void {
  if (opts === undefined) return;
  const r = GenerateOptionsSchema.safeParse(opts);
  if (!r.success) throw new InvalidArgumentError(describe(r.error, what));
}

function kindOf(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  return typeof v === "object" ? "an object" : `${typeof v} ${JSON.stringify(v)}`;
}
