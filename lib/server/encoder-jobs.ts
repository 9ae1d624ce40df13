// The prompt encoder's jobs (messages: see encoder.ts): builds the model's tokenizer from the
// text the model loaded (never from the directory, which may have changed since) and turns
// text and chat messages into token ids, chat-template rendering included. They run in the
// encoder's worker (encoder-worker.ts), or on the server's thread in a bundled app that
// carries no worker file.
import { encodeChat } from "../model/chat-encode.ts";
import { tokenizerFromSource, type TextTokenizer } from "../model/tokenizer.ts";
import type { EncoderReply, EncoderRequest } from "./encoder.ts";

/** A tool definition no template could render by accident: seeing its name proves tools are rendered. */
const PROBE = { type: "function", function: { name: "cherenkov_probe_tool_7f3a", description: "probe", parameters: { type: "object", properties: {} } } };

export class EncoderJobs {
  private tok: TextTokenizer | null = null;

  async run(m: EncoderRequest): Promise<EncoderReply> {
    try {
      if (m.kind === "load") {
        const tok = (this.tok = tokenizerFromSource(m.source));
        let tools = false;
        if (tok.hasChatTemplate) {
          try {
            tools = tok.applyChatTemplate([{ role: "user", content: "x" }], { addGenerationPrompt: true, tools: [PROBE] }).includes(PROBE.function.name);
          } catch {
            tools = false; // a template that fails on tools does not support them
          }
        }
        return { id: m.id, info: { hasChatTemplate: tok.hasChatTemplate, tools } };
      }
      if (!this.tok) throw new Error("the encoder has no tokenizer loaded");
      const ids = m.kind === "text" ? this.tok.encode(m.text) : encodeChat(this.tok, m.messages, { tools: m.tools });
      return { id: m.id, ids: Int32Array.from(ids) };
    } catch (e) {
      const err = e as Error;
      return { id: m.id, error: { name: err?.name ?? "Error", message: err?.message ?? String(e), template: m.kind === "chat" } };
    }
  }
}
