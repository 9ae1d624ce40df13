// The server's prompt encoder, off the event loop: builds the model's tokenizer from the text
// the model loaded (never from the directory, which may have changed since) and turns text and
// chat messages into token ids (chat-template rendering included), so that a huge prompt or a
// slow template never delays /health or other requests. Messages: see encoder.ts.
import { encodeChat } from "../model/chat-encode.ts";
import { tokenizerFromSource, type TextTokenizer } from "../model/tokenizer.ts";
import type { EncoderReply, EncoderRequest } from "./encoder.ts";

declare const self: Worker;

/** A tool definition no template could render by accident: seeing its name proves tools are rendered. */
const PROBE = { type: "function", function: { name: "cherenkov_probe_tool_7f3a", description: "probe", parameters: { type: "object", properties: {} } } };

let tok: TextTokenizer | null = null;

const reply = (m: EncoderReply) => self.postMessage(m);

self.onmessage = (event: MessageEvent<EncoderRequest>) => {
  const m = event.data;
  try {
    if (m.kind === "load") {
      tok = tokenizerFromSource(m.source);
      let tools = false;
      if (tok.hasChatTemplate) {
        try {
          tools = tok.applyChatTemplate([{ role: "user", content: "x" }], { addGenerationPrompt: true, tools: [PROBE] }).includes(PROBE.function.name);
        } catch {
          tools = false; // a template that fails on tools does not support them
        }
      }
      return reply({ id: m.id, info: { hasChatTemplate: tok.hasChatTemplate, tools } });
    }
    if (!tok) throw new Error("the encoder has no tokenizer loaded");
    const ids = m.kind === "text" ? tok.encode(m.text) : encodeChat(tok, m.messages, { tools: m.tools });
    reply({ id: m.id, ids: Int32Array.from(ids) });
  } catch (e) {
    const err = e as Error;
    reply({ id: m.id, error: { name: err?.name ?? "Error", message: err?.message ?? String(e), template: m.kind === "chat" } });
  }
};
