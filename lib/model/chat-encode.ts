// Chat messages to token ids without role injection: the chat template's own markup becomes
// special tokens, while what the messages carry (contents, tool calls, tool definitions) is
// tokenized as text, so "<|im_start|>system" typed by a user stays characters.
//
// How: before rendering, every special-token string inside message values is swapped for a
// placeholder (private-use characters and digits, which templates pass through unchanged);
// the rendered prompt is encoded with special tokens recognized, except at the placeholders,
// whose original text is encoded as plain text.
import type { ChatMessage, TemplateMessage, TextTokenizer } from "./tokenizer.ts";

export interface ChatEncodeOptions {
  /** End with the assistant's header, so the model answers (default true). */
  addGenerationPrompt?: boolean;
  /** Tool definitions for templates that render them (OpenAI's `tools`). */
  tools?: unknown[];
}

const OPEN = "\uE000";
const CLOSE = "\uE001";

/** The prompt the template renders, and its token ids with message values encoded as text. */
export function encodeChat(tok: TextTokenizer, messages: (ChatMessage | TemplateMessage)[], opts: ChatEncodeOptions = {}): number[] {
  const literals: string[] = [];
  const specials = tok.specialTokens.filter((s) => s.length > 0).sort((a, b) => b.length - a.length);
  const pattern = specials.length > 0 ? new RegExp(specials.map(escapeRegExp).join("|"), "g") : null;
  const nonce = String(Math.floor(Math.random() * 1e9));
  const shield = (text: string): string =>
    pattern === null
      ? text
      : text.replace(pattern, (m) => {
          literals.push(m);
          return `${OPEN}${nonce}:${literals.length - 1}${CLOSE}`;
        });
  const rendered = tok.applyChatTemplate(deepMapStrings(messages, shield, ["role"]), {
    addGenerationPrompt: opts.addGenerationPrompt ?? true,
    tools: opts.tools ? deepMapStrings(opts.tools, shield, []) : undefined,
  });
  if (literals.length === 0) return tok.encode(rendered, { addSpecialTokens: false });
  const ids: number[] = [];
  const marker = new RegExp(`${OPEN}${nonce}:(\\d+)${CLOSE}`, "g");
  let at = 0;
  for (const m of rendered.matchAll(marker)) {
    if (m.index > at) ids.push(...tok.encode(rendered.slice(at, m.index), { addSpecialTokens: false }));
    ids.push(...tok.encodeText(literals[Number(m[1])]!));
    at = m.index + m[0].length;
  }
  if (at < rendered.length) ids.push(...tok.encode(rendered.slice(at), { addSpecialTokens: false }));
  return ids;
}

/** A copy of `value` with `f` applied to every string in it (keys named in `keep` untouched). */
function deepMapStrings<T>(value: T, f: (s: string) => string, keep: string[]): T {
  if (typeof value === "string") return f(value) as T;
  if (Array.isArray(value)) return value.map((v) => deepMapStrings(v, f, keep)) as T;
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = keep.includes(k) ? v : deepMapStrings(v, f, keep);
    return out as T;
  }
  return value;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
