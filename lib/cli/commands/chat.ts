// `cherenkov chat`: an interactive conversation through the model's chat template. Each
// turn renders the whole history again (simple and exact; a long chat re-reads its history).
// Ctrl-C stops the answer being written; at the prompt it (or Ctrl-D, or /exit) quits.
import { createInterface } from "node:readline";

import { DEFAULT_MAX_TOKENS, type GenerateOptions } from "../../api/model.ts";
import { ContextFullError } from "../../gpu/state.ts";
import { defaultModelDir } from "../../model/default-model.ts";
import type { ChatMessage } from "../../model/tokenizer.ts";
import { draftsFlag, maxTokensFlag, parseFlags, stringFlag, UsageError, type FlagSpec } from "../args.ts";
import { loadModelFromFlags, MODEL_FLAGS, MODEL_FLAGS_USAGE, modelDir } from "../engine-flags.ts";
import type { CliIO } from "../io.ts";
import { samplingFlags, SAMPLING_FLAGS, SAMPLING_FLAGS_USAGE } from "../sampling-flags.ts";

export const chatUsage = `cherenkov chat [DIR] [options]
  An interactive chat with the model's chat template, one line per message. /reset forgets
  the conversation (the system prompt stays), /exit or Ctrl-D quits; Ctrl-C stops the
  answer being written (at the prompt it quits).
    --system TEXT        a system prompt for the whole conversation (-sys, --system-prompt)
    -n, --max-tokens N   tokens per answer at most (default ${DEFAULT_MAX_TOKENS}; -1: until the end
                         token or a full context; --n-predict)
    --ignore-eos         go on past the end token
${SAMPLING_FLAGS_USAGE}
${MODEL_FLAGS_USAGE}`;

/** chat's options (each shown with a description by `cherenkov help chat`). */
export const CHAT_FLAGS: FlagSpec = {
  system: { type: "string" },
  "max-tokens": { type: "string", short: "n" },
  "ignore-eos": { type: "boolean" },
  ...SAMPLING_FLAGS,
  ...MODEL_FLAGS,
};

export async function chatCommand(argv: string[], io: CliIO): Promise<number> {
  const { flags, positionals } = parseFlags(
    argv,
    CHAT_FLAGS,
    1,
  );
  const limit = maxTokensFlag(flags, DEFAULT_MAX_TOKENS, 1 << 20);
  const options: GenerateOptions = { maxTokens: limit ?? 1 << 20, drafts: draftsFlag(flags), stopAtEos: !flags["ignore-eos"], ...samplingFlags(flags) };
  const system = stringFlag(flags, "system");
  const dir = modelDir(flags, positionals) ?? (await defaultModelDir());
  await using model = await loadModelFromFlags(flags, dir, io);
  if (!model.tokenizer) throw new UsageError(`${dir} has no tokenizer.json: chat needs text`);

  const start: ChatMessage[] = system ? [{ role: "system", content: system }] : [];
  let history = [...start];
  const interactive = Boolean(process.stdin.isTTY);
  // At a terminal readline reads raw keys, so it must echo them itself: it needs the output.
  const lines = createInterface({ input: process.stdin, output: interactive ? process.stdout : undefined, terminal: interactive, prompt: "> " });
  let answering: AbortController | null = null;
  let quit = false;
  // Ctrl-C: stop the answer being written; at the prompt, quit.
  const onInterrupt = () => {
    if (answering) answering.abort();
    else {
      quit = true;
      lines.close();
    }
  };
  lines.on("SIGINT", onInterrupt);
  process.on("SIGINT", onInterrupt);
  try {
    if (interactive) lines.prompt();
    for await (const line of lines) {
      const text = line.trim();
      if (text === "/exit" || quit) break;
      if (text === "/reset") {
        history = [...start];
        io.stdout("(conversation reset)\n");
      } else if (text !== "") {
        history.push({ role: "user", content: text });
        answering = new AbortController();
        let answer = "";
        try {
          const stream = model.stream(history, { ...options, signal: answering.signal });
          for (let r = await stream.next(); !r.done; r = await stream.next()) {
            answer += r.value.text;
            io.stdout(r.value.text);
          }
        } catch (e) {
          if (e instanceof ContextFullError) io.stdout(` [the context (-c ${model.maxContext}) is full: /reset, or start with a larger -c]`);
          else if (!answering.signal.aborted) throw e;
          else io.stdout(" [stopped]");
        } finally {
          answering = null;
        }
        history.push({ role: "assistant", content: answer });
        io.stdout("\n");
      }
      if (interactive) lines.prompt();
    }
  } finally {
    process.off("SIGINT", onInterrupt);
    lines.close();
  }
  return 0;
}
