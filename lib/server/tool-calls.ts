// Tool calls in the model's own output, as chat templates teach them (Qwen, Hermes):
//   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
// and Qwen3-Coder's XML form:
//   <tool_call>\n<function=f>\n<parameter=x>\nvalue\n</parameter>\n</function>\n</tool_call>
// parsed into OpenAI's tool_calls. Text outside the blocks stays the message's content; a block
// that does not parse stays text (never a half-made call).

const OPEN = "<tool_call>";
const CLOSE = "</tool_call>";

export interface ToolCall {
  id: string;
  name: string;
  /** The arguments as a JSON object's text (OpenAI's `function.arguments`). */
  arguments: string;
}

export const newCallId = () => `call_${crypto.randomUUID().replaceAll("-", "").slice(0, 24)}`;

/** One block's inside as a call, or null when it is neither form. */
function parseBlock(inside: string): ToolCall | null {
  const body = inside.trim();
  if (body.startsWith("<function=")) {
    const fn = /^<function=([^>\s]+)>([\s\S]*?)(?:<\/function>|$)/.exec(body);
    if (!fn) return null;
    const args: Record<string, unknown> = {};
    for (const p of fn[2]!.matchAll(/<parameter=([^>\s]+)>\n?([\s\S]*?)\n?<\/parameter>/g)) {
      const raw = p[2]!;
      try {
        args[p[1]!] = JSON.parse(raw);
      } catch {
        args[p[1]!] = raw;
      }
    }
    return { id: newCallId(), name: fn[1]!, arguments: JSON.stringify(args) };
  }
  try {
    const v = JSON.parse(body) as { name?: unknown; arguments?: unknown; parameters?: unknown };
    if (typeof v !== "object" || v === null || typeof v.name !== "string" || v.name === "") return null;
    const a = v.arguments ?? v.parameters ?? {};
    const args = typeof a === "string" ? a : JSON.stringify(a);
    return { id: newCallId(), name: v.name, arguments: args };
  } catch {
    return null;
  }
}

/** The text split into content and calls. */
export function parseToolCalls(text: string): { content: string; calls: ToolCall[] } {
  const calls: ToolCall[] = [];
  let content = "";
  let at = 0;
  for (;;) {
    const start = text.indexOf(OPEN, at);
    if (start < 0) break;
    const end = text.indexOf(CLOSE, start + OPEN.length);
    // an unclosed block (the answer ran out of tokens) is tried as it is
    const inside = text.slice(start + OPEN.length, end < 0 ? text.length : end);
    const call = parseBlock(inside);
    const after = end < 0 ? text.length : end + CLOSE.length;
    if (call) {
      calls.push(call);
      content += text.slice(at, start);
    } else content += text.slice(at, after);
    at = after;
  }
  content += text.slice(at);
  // the blank lines a model writes around its calls are not an answer
  return { content: calls.length > 0 && content.trim() === "" ? "" : content, calls };
}

/**
 * For streams: passes text through until a tool call may begin, then keeps the rest for
 * parseToolCalls at the end (so no markup of a call is ever streamed as content).
 */
export class ToolCallSplitter {
  private held = "";
  private inCall = false;

  /** The text that is certainly content. */
  push(text: string): string {
    if (this.inCall) {
      this.held += text;
      return "";
    }
    const all = this.held + text;
    const start = all.indexOf(OPEN);
    if (start >= 0) {
      this.inCall = true;
      this.held = all.slice(start);
      return all.slice(0, start);
    }
    // hold a tail that could be the start of "<tool_call>"
    let keep = 0;
    for (let n = Math.min(OPEN.length - 1, all.length); n > 0; n--)
      if (all.endsWith(OPEN.slice(0, n))) {
        keep = n;
        break;
      }
    this.held = all.slice(all.length - keep);
    return all.slice(0, all.length - keep);
  }

  /** After the last piece: content not yet released and the calls. */
  finish(): { content: string; calls: ToolCall[] } {
    const rest = this.held;
    this.held = "";
    if (!this.inCall) return { content: rest, calls: [] };
    const r = parseToolCalls(rest);
    // content after or between blocks (rare) is released at the end
    return { content: r.calls.length > 0 ? r.content : rest, calls: r.calls };
  }
}
