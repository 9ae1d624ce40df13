// The text side of a model directory: tokenizer.json through @huggingface/tokenizers and the
// chat template of tokenizer_config.json through @huggingface/jinja.
import { Template } from "@huggingface/jinja";
import { Tokenizer } from "@huggingface/tokenizers";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ModelFormatError } from "./errors.ts";
import { MANIFEST_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE } from "./manifest.ts";

export interface ChatMessage {
  role: string;
  content: string;
}

/** A chat turn as chat templates read it: tool calls and tool results included (OpenAI's names). */
export interface TemplateMessage {
  role: string;
  content: string | null;
  tool_calls?: { id?: string; type: "function"; function: { name: string; arguments: unknown } }[];
  tool_call_id?: string;
  name?: string;
}

export interface TextTokenizer {
  /** Token ids of `text`. Special-token strings in the text become their ids. */
  encode(text: string, opts?: { addSpecialTokens?: boolean }): number[];
  /**
   * Token ids of `text` as plain text: no added token (special or not) is recognized, so
   * "<|im_start|>" typed by a user stays the characters it is (Hugging Face's
   * split_special_tokens). No special tokens are added either.
   */
  encodeText(text: string): number[];
  /** The strings of the special added tokens (<|im_start|>, <|endoftext|>, ...). */
  readonly specialTokens: string[];
  decode(ids: number[], opts?: { skipSpecialTokens?: boolean }): string;
  /** The prompt text the chat template makes of `messages` (and of `tools`, for templates that render them). */
  applyChatTemplate(messages: (ChatMessage | TemplateMessage)[], opts?: { addGenerationPrompt?: boolean; tools?: unknown[] }): string;
  readonly eosTokenIds: number[];
  /** One more than the largest id the tokenizer knows. */
  readonly vocabSize: number;
  readonly hasChatTemplate: boolean;
}

function readJson(dir: string, file: string, required: boolean): Record<string, unknown> | null {
  let text: string;
  try {
    text = readFileSync(join(dir, file), "utf8");
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT" && !required) return null;
    throw new ModelFormatError(
      code === "ENOENT" ? `${file} is missing in ${dir} (the model has no tokenizer)` : `${file}: cannot read: ${code ?? e}`,
      { file },
    );
  }
  try {
    const v = JSON.parse(text);
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new Error("not a JSON object");
    return v;
  } catch (e) {
    throw new ModelFormatError(`${file}: not valid JSON: ${(e as Error).message}`, { file });
  }
}

/** A special token as tokenizer_config.json writes it: a string, or {content: string}. */
function tokenText(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as { content?: unknown }).content === "string") return (v as { content: string }).content;
  return null;
}

export async function loadTokenizer(dir: string): Promise<TextTokenizer> {
  const json = readJson(dir, TOKENIZER_FILE, true)!;
  const config = readJson(dir, TOKENIZER_CONFIG_FILE, false) ?? {};
  let tokenizer: Tokenizer;
  try {
    tokenizer = new Tokenizer(json, config);
  } catch (e) {
    throw new ModelFormatError(`${TOKENIZER_FILE}: cannot build the tokenizer: ${(e as Error).message}`, { file: TOKENIZER_FILE });
  }
  const chatTemplate = typeof config.chat_template === "string" ? config.chat_template : null;
  let template: Template | null = null;

  const eos = new Set<number>();
  const eosText = tokenText(config.eos_token);
  const eosId = eosText === null ? undefined : tokenizer.token_to_id(eosText);
  if (eosId !== undefined) eos.add(eosId);
  // The model's own end token (cherenkov.json) counts too, when it sits next to the tokenizer.
  try {
    const m = JSON.parse(readFileSync(join(dir, MANIFEST_FILE), "utf8"));
    if (typeof m?.config?.eos_token_id === "number") eos.add(m.config.eos_token_id);
  } catch {
    // a tokenizer without a model directory around it is fine
  }
  let maxId = -1;
  for (const id of tokenizer.get_vocab(true).values()) if (id > maxId) maxId = id;

  const specialText = (key: string) => tokenText(config[key]) ?? undefined;
  const specialTokens = [...tokenizer.get_added_tokens_decoder().values()].filter((t) => t.special).map((t) => t.content);
  const idOf = (token: string) => {
    const id = tokenizer.token_to_id(token);
    if (id === undefined) throw new ModelFormatError(`${TOKENIZER_FILE}: the model produced the piece ${JSON.stringify(token)}, which has no id`, { file: TOKENIZER_FILE });
    return id;
  };
  return {
    specialTokens,
    // The library's own pipeline minus its added-token splitter: normalize, pre-tokenize, model.
    encodeText(text) {
      if (text === "") return [];
      const normalized = tokenizer.normalizer ? tokenizer.normalizer._call(text) : text;
      const words = tokenizer.pre_tokenizer ? tokenizer.pre_tokenizer._call(normalized) : [normalized];
      return tokenizer.model!._call(words).map(idOf);
    },
    eosTokenIds: [...eos].sort((a, b) => a - b),
    vocabSize: maxId + 1,
    hasChatTemplate: chatTemplate !== null,
    encode: (text, opts = {}) => tokenizer.encode(text, { add_special_tokens: opts.addSpecialTokens ?? true }).ids,
    // (the library refuses an empty list)
    decode: (ids, opts = {}) => (ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: opts.skipSpecialTokens ?? false })),
    applyChatTemplate(messages, opts = {}) {
      if (chatTemplate === null)
        throw new ModelFormatError(`${TOKENIZER_CONFIG_FILE} has no chat_template (in ${dir})`, { file: TOKENIZER_CONFIG_FILE, field: "chat_template" });
      template ??= new Template(chatTemplate);
      return template.render({
        messages,
        ...(opts.tools && opts.tools.length > 0 ? { tools: opts.tools } : {}),
        add_generation_prompt: opts.addGenerationPrompt ?? false,
        bos_token: specialText("bos_token") ?? "",
        eos_token: specialText("eos_token") ?? "",
      });
    },
  };
}
