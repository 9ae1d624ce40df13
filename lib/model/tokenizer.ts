// The text side of a model directory: tokenizer.json through @huggingface/tokenizers and the
// chat template of tokenizer_config.json through @huggingface/jinja.
import { Template } from "@huggingface/jinja";
import { ByteLevelDecoder, type Decoder, Tokenizer } from "@huggingface/tokenizers";
import { join } from "node:path";
import { renderChatTemplateAsync, renderChatTemplateSync } from "./chat-template.ts";
import { CONFIG_LIMITS } from "./config.ts";
import { ModelFormatError } from "./errors.ts";
import { MANIFEST_FILE, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE } from "./manifest.ts";
import { checksum } from "./checksum.ts";
import { errnoOf, FILE_LIMITS, readRegularFile, readTextFile } from "./safe-read.ts";

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
  /**
   * The text of `ids`, as @huggingface/tokenizers decodes them, in time linear in the ids
   * (see linearDecode). Ids without a piece (past the tokenizer's last piece: the padding rows
   * of an LM head) are skipped, as Hugging Face's Rust tokenizers skip them.
   */
  decode(ids: number[], opts?: { skipSpecialTokens?: boolean }): string;
  /**
   * The prompt text the chat template makes of `messages` (and of `tools`, for templates that
   * render them), rendered in a worker with limits (lib/model/chat-template.ts); blocks this
   * thread until done (at most the time limit).
   */
  applyChatTemplate(messages: (ChatMessage | TemplateMessage)[], opts?: { addGenerationPrompt?: boolean; tools?: unknown[] }): string;
  /** The same without blocking this thread. */
  applyChatTemplateAsync(messages: (ChatMessage | TemplateMessage)[], opts?: { addGenerationPrompt?: boolean; tools?: unknown[] }): Promise<string>;
  readonly eosTokenIds: number[];
  /** One more than the largest id the tokenizer knows. */
  readonly vocabSize: number;
  readonly hasChatTemplate: boolean;
  /** The files' text it was built from (the server's encoder worker builds the same tokenizer from it). */
  readonly source: TokenizerSource;
  /**
   * Characters (UTF-16 units) of the longest vocabulary piece: a text of n units has at least
   * about n / longestPiece tokens, which bounds a prompt's length before tokenizing it.
   */
  readonly longestPiece: number;
}

/** tokenizer.json is absent from `dir` (a model without a tokenizer takes token ids only). */
export class MissingTokenizerError extends ModelFormatError {
  override name = "MissingTokenizerError";
}

/**
 * The text of a tokenizer file, checked against the checksum cherenkov.json recorded for it
 * (cherenkov/2); null when absent and not required.
 */
function readVerified(dir: string, file: string, required: boolean, maxBytes: number, expected?: string): string | null {
  try {
    const bytes = readRegularFile(join(dir, file), file, maxBytes);
    // cherenkov.json (cherenkov/2) records the tokenizer files' checksums: a changed byte is named.
    if (expected !== undefined) {
      const got = checksum(bytes);
      if (got !== expected) throw new ModelFormatError(`${file}: checksum mismatch (expected ${expected}, got ${got}): the file changed after the model was written`, { file });
    }
    return new TextDecoder().decode(bytes);
  } catch (e) {
    const code = errnoOf(e);
    if (code === "ENOENT" && !required) return null;
    if (code === "ENOENT") throw new MissingTokenizerError(`${file} is missing in ${dir} (the model has no tokenizer)`, { file });
    throw e;
  }
}

function parseObject(text: string, file: string): Record<string, unknown> {
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

/** Checks that a token id from tokenizer.json is an integer the library can index with. */
function checkId(id: unknown, where: string): void {
  if (typeof id !== "number" || !Number.isInteger(id) || id < 0 || id >= CONFIG_LIMITS.vocab_size)
    throw new ModelFormatError(`${TOKENIZER_FILE}: ${where}: id ${JSON.stringify(id)} is not an integer in 0..${CONFIG_LIMITS.vocab_size - 1}`, {
      file: TOKENIZER_FILE,
      field: where,
    });
}

/**
 * Validates every token id of tokenizer.json before the tokenizer library sees it: the
 * library sizes arrays by the largest id (an id of 2^31 makes every load spin).
 */
function checkTokenizerIds(json: Record<string, unknown>): void {
  const added = json.added_tokens;
  if (added !== undefined && added !== null) {
    if (!Array.isArray(added)) throw new ModelFormatError(`${TOKENIZER_FILE}: added_tokens is not an array`, { file: TOKENIZER_FILE, field: "added_tokens" });
    added.forEach((t, i) => checkId((t as { id?: unknown } | null)?.id, `added_tokens.${i}.id`));
  }
  const model = json.model as { vocab?: unknown; unk_id?: unknown } | undefined;
  if (!model || typeof model !== "object") throw new ModelFormatError(`${TOKENIZER_FILE}: model is missing`, { file: TOKENIZER_FILE, field: "model" });
  const vocab = model.vocab;
  if (Array.isArray(vocab)) {
    if (vocab.length > CONFIG_LIMITS.vocab_size)
      throw new ModelFormatError(`${TOKENIZER_FILE}: model.vocab has ${vocab.length} entries, more than ${CONFIG_LIMITS.vocab_size}`, { file: TOKENIZER_FILE, field: "model.vocab" });
    if (model.unk_id !== undefined && model.unk_id !== null) checkId(model.unk_id, "model.unk_id");
  } else if (vocab && typeof vocab === "object") {
    for (const [token, id] of Object.entries(vocab)) checkId(id, `model.vocab[${JSON.stringify(token).slice(0, 40)}]`);
  }
}

/**
 * The bytes a tokenizer was built from, as text: enough to build the same tokenizer again in
 * another thread (the server's encoder worker) without reading the directory a second time.
 */
export interface TokenizerSource {
  /** The model directory (for messages). */
  dir: string;
  tokenizer: string;
  /** tokenizer_config.json, or null when the directory has none. */
  config: string | null;
  /** The index's eos_token_id, when cherenkov.json sits next to the tokenizer. */
  indexEosId: number | null;
}

/** What loadTokenizer needs of an index already read (openModel's): the recorded checksums and the end token. */
export interface TokenizerIndex {
  config?: { eos_token_id?: unknown };
  files?: Record<string, unknown>;
}

/**
 * Loads the tokenizer of `dir`. With `index` (the manifest openModel validated), its recorded
 * checksums are the ones checked; without, cherenkov.json is read here when present.
 */
export async function loadTokenizer(dir: string, index?: TokenizerIndex | null): Promise<TextTokenizer> {
  const m = index === undefined ? readIndexLoosely(dir) : index;
  const sum = (f: string) => (typeof m?.files?.[f] === "string" ? (m.files[f] as string) : undefined);
  const tokenizer = readVerified(dir, TOKENIZER_FILE, true, FILE_LIMITS.tokenizer, sum(TOKENIZER_FILE))!;
  const config = readVerified(dir, TOKENIZER_CONFIG_FILE, false, FILE_LIMITS.tokenizerConfig, sum(TOKENIZER_CONFIG_FILE));
  const id = m?.config?.eos_token_id;
  const indexEosId = typeof id === "number" && Number.isInteger(id) && id >= 0 && id < CONFIG_LIMITS.vocab_size ? id : null;
  return tokenizerFromSource({ dir, tokenizer, config, indexEosId });
}

/** cherenkov.json next to a tokenizer, when it reads as JSON (a bad one is openModel's to report). */
function readIndexLoosely(dir: string): TokenizerIndex | null {
  try {
    return JSON.parse(readTextFile(join(dir, MANIFEST_FILE), MANIFEST_FILE, FILE_LIMITS.manifest));
  } catch (e) {
    if (errnoOf(e) !== "ENOENT" && !(e instanceof ModelFormatError) && !(e instanceof SyntaxError)) throw e;
    return null;
  }
}

/** Builds a tokenizer from the files' text (the same one every time for the same source). */
export function tokenizerFromSource(source: TokenizerSource): TextTokenizer {
  const { dir } = source;
  const json = parseObject(source.tokenizer, TOKENIZER_FILE);
  const config = source.config === null ? {} : parseObject(source.config, TOKENIZER_CONFIG_FILE);
  checkTokenizerIds(json);
  let tokenizer: Tokenizer;
  try {
    tokenizer = new Tokenizer(json, config);
  } catch (e) {
    throw new ModelFormatError(`${TOKENIZER_FILE}: cannot build the tokenizer: ${(e as Error).message}`, { file: TOKENIZER_FILE });
  }
  const chatTemplate = typeof config.chat_template === "string" ? config.chat_template : null;
  if (chatTemplate !== null) {
    // Parsing is bounded by the file's size cap; rendering is what runs in the worker.
    try {
      new Template(chatTemplate);
    } catch (e) {
      throw new ModelFormatError(`${TOKENIZER_CONFIG_FILE}: chat_template does not parse: ${(e as Error).message}`, {
        file: TOKENIZER_CONFIG_FILE,
        field: "chat_template",
      });
    }
  }

  const eos = new Set<number>();
  const eosText = tokenText(config.eos_token);
  const eosId = eosText === null ? undefined : tokenizer.token_to_id(eosText);
  if (eosId !== undefined) eos.add(eosId);
  // The model's own end token (cherenkov.json) counts too, when it sits next to the tokenizer.
  if (source.indexEosId !== null) eos.add(source.indexEosId);
  let maxId = -1;
  let longest = 1;
  for (const [piece, id] of tokenizer.get_vocab(true)) {
    if (piece === undefined) continue; // ids missing from a vocabulary that skips some (the library lists them as undefined)
    if (id > maxId) maxId = id;
    if (piece.length > longest) longest = piece.length;
  }

  const decode = linearDecode(tokenizer);

  const specialText = (key: string) => tokenText(config[key]) ?? undefined;
  const specialTokens = [...tokenizer.get_added_tokens_decoder().values()].filter((t) => t.special).map((t) => t.content);
  const idOf = (token: string) => {
    const id = tokenizer.token_to_id(token);
    if (id === undefined) throw new ModelFormatError(`${TOKENIZER_FILE}: the model produced the piece ${JSON.stringify(token)}, which has no id`, { file: TOKENIZER_FILE });
    return id;
  };
  const requireTemplate = (): string => {
    if (chatTemplate === null)
      throw new ModelFormatError(`${TOKENIZER_CONFIG_FILE} has no chat_template (in ${dir})`, { file: TOKENIZER_CONFIG_FILE, field: "chat_template" });
    return chatTemplate;
  };
  const context = (messages: (ChatMessage | TemplateMessage)[], opts: { addGenerationPrompt?: boolean; tools?: unknown[] }) => ({
    messages,
    ...(opts.tools && opts.tools.length > 0 ? { tools: opts.tools } : {}),
    add_generation_prompt: opts.addGenerationPrompt ?? false,
    bos_token: specialText("bos_token") ?? "",
    eos_token: specialText("eos_token") ?? "",
  });
  return {
    source,
    longestPiece: longest,
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
    decode: (ids, opts = {}) => decode(ids, opts.skipSpecialTokens ?? false),
    applyChatTemplate(messages, opts = {}) {
      return renderChatTemplateSync(requireTemplate(), context(messages, opts));
    },
    applyChatTemplateAsync(messages, opts = {}) {
      try {
        return renderChatTemplateAsync(requireTemplate(), context(messages, opts));
      } catch (e) {
        return Promise.reject(e);
      }
    },
  };
}

/** What linearDecode reads of the library's Tokenizer (0.2.0) beyond its typings. */
interface TokenizerInternals {
  model: { vocab: unknown[] };
  decoder: Decoder | null;
  /** Contents (strings) of the special added tokens and of the config's additional_special_tokens. */
  special_tokens: unknown[];
  clean_up_tokenization_spaces: boolean;
}

/** Flags per id: the id has a piece; the piece passes the ByteLevel decoder verbatim (an added token's); it is special. */
const HAS_PIECE = 1;
const VERBATIM = 2;
const SPECIAL = 4;

/**
 * @huggingface/tokenizers 0.2.0's Tokenizer.decode, in time linear in the ids. The library's
 * decode looks every token up in its list of added tokens (Array.includes for
 * skip_special_tokens; the ByteLevel decoder's added_tokens.find), so one decode of a few ids
 * costs milliseconds with 151,680 reserved added tokens (the byte tokenizer at vocab 151,936).
 * Those lookups are by the piece's string; they are made here once per id, into a byte per id.
 * Then the same steps as the library's: pieces of the ids, the specials dropped when skipping,
 * the decoder (the ByteLevel decoder's split at added tokens done here with the flags, its
 * runs of ordinary pieces through its own convert_tokens_to_string; any other decoder, which
 * looks up no added token, called as is), and the library's decode itself for what it does
 * after the decoder (end_of_word_suffix, clean_up_tokenization_spaces).
 * One difference, by design: an id without a piece is skipped (the library would use the
 * model's unk_token, or null, on which some decoders throw).
 */
function linearDecode(tokenizer: Tokenizer): (ids: number[], skipSpecial: boolean) => string {
  const lib = tokenizer as unknown as TokenizerInternals;
  const vocab = lib.model.vocab;
  const decoder = lib.decoder;
  const byteLevel = decoder instanceof ByteLevelDecoder ? decoder : null;
  const flags = pieceFlags(vocab, byteLevel ? byteLevel.added_tokens.map((t) => t.content) : [], lib.special_tokens);
  const afterDecoder = libraryAfterDecoder(lib);
  return (ids, skipSpecial) => {
    if (ids.length === 0) return ""; // (the library refuses an empty list)
    const drop = skipSpecial ? SPECIAL : 0;
    // (flags[id] is undefined for an id that is no index into the vocabulary)
    const kept = ids.filter((id) => ((flags[id] ?? 0) & (HAS_PIECE | drop)) === HAS_PIECE);
    let text: string;
    if (byteLevel) {
      // The ByteLevel decoder's decode_chain: added tokens' pieces as they are, each run of
      // other pieces as the bytes they spell.
      text = "";
      let run: string[] = [];
      for (const id of kept) {
        if (flags[id]! & VERBATIM) {
          if (run.length > 0) text += byteLevel.convert_tokens_to_string(run);
          run = [];
          text += vocab[id] as string;
        } else run.push(vocab[id] as string);
      }
      if (run.length > 0) text += byteLevel.convert_tokens_to_string(run);
    } else {
      const pieces = kept.map((id) => vocab[id] as string);
      text = decoder ? decoder(pieces) : pieces.join(" ");
    }
    return afterDecoder(text, skipSpecial);
  };
}

/** The flags of every id of `vocab` (the library's model.vocab: added tokens included). */
function pieceFlags(vocab: unknown[], verbatim: unknown[], special: unknown[]): Uint8Array {
  // Set.has matches as the library's includes/find(===) do (SameValueZero; the pieces are strings).
  const isVerbatim = new Set(verbatim);
  const isSpecial = new Set(special);
  const flags = new Uint8Array(vocab.length);
  for (let id = 0; id < vocab.length; id++) {
    const piece = vocab[id];
    if (piece === undefined || piece === null) continue;
    flags[id] = HAS_PIECE | (isVerbatim.has(piece) ? VERBATIM : 0) | (isSpecial.has(piece) ? SPECIAL : 0);
  }
  return flags;
}

/**
 * The library's decode after its decoder ran, applied to `text`: its own decode, called on a
 * view of the tokenizer whose one piece is `text` and whose decoder passes it through (with
 * the real decoder's end_of_word_suffix), so the suffix replacement, the trim when skipping and
 * clean_up_tokenization are the library's code, on the whole text as it applies them.
 */
function libraryAfterDecoder(lib: TokenizerInternals): (text: string, skipSpecial: boolean) => string {
  const passThrough = lib.decoder && Object.assign((pieces: string[]) => pieces[0], { end_of_word_suffix: lib.decoder.end_of_word_suffix });
  const libraryDecode = Tokenizer.prototype.decode;
  return (text, skipSpecial) => {
    const view = { model: { vocab: [text] }, decoder: passThrough, special_tokens: [], clean_up_tokenization_spaces: lib.clean_up_tokenization_spaces };
    return libraryDecode.call(view as unknown as Tokenizer, [0], { skip_special_tokens: skipSpecial });
  };
}
