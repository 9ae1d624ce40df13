// `cherenkov run`: generation from a prompt through Model (streamed to stdout). Flags follow
// llama.cpp / mlx-lm where they have one (-m, -p, -n, -c, -s, --temp, --top-k, ...).
import { DEFAULT_MAX_TOKENS, type GenerateOptions, type GenerationResult } from "../../api/model.ts";
import { ContextFullError } from "../../gpu/state.ts";
import { defaultModelDir } from "../../model/default-model.ts";
import { MANIFEST_FILE } from "../../model/manifest.ts";
import { draftsFlag, maxTokensFlag, parseFlags, stringFlag, type Flags, UsageError, type FlagSpec } from "../args.ts";
import { loadModelFromFlags, MODEL_FLAGS, MODEL_FLAGS_USAGE, modelDir } from "../engine-flags.ts";
import { samplingFlags, SAMPLING_FLAGS, SAMPLING_FLAGS_USAGE } from "../sampling-flags.ts";
import { statsLine } from "../stats-line.ts";
import type { CliIO } from "../io.ts";

export const runUsage = `cherenkov run [DIR] (-p TEXT | --prompt-tokens 1,2,3) [options]
  Generates from a prompt (greedy unless --temp is given). DIR defaults to the embedded model
  (examples/models/qwen4-exp-tiny). Without -p and with stdin not a terminal, the prompt is
  read from stdin (-p - reads it too).
    -p, --prompt TEXT    text prompt, tokenized with the model's tokenizer
    -f, --file FILE      the prompt is the text of FILE
    --prompt-tokens IDS  comma-separated token ids instead of text
    --chat               wrap the prompt as a user message with the chat template
    --system TEXT        a system message before it (implies --chat; -sys, --system-prompt)
    -n, --max-tokens N   tokens to generate at most (default ${DEFAULT_MAX_TOKENS}; stops after the end token;
                         -1: until the end token or a full context; --n-predict)
    --ignore-eos         go on past the end token
    --json               print {"tokens": [...], "text": "..."} on one line
    --stats[=json]       after the text, one line on stderr: tokens/s, pool hit rate, IO MB/s;
                         --stats=json (or --stats with --json): the model's whole stats object,
                         on stderr or inside the --json object
${SAMPLING_FLAGS_USAGE}
${MODEL_FLAGS_USAGE}`;

/** "1, 2,3" -> [1, 2, 3], each checked against the vocabulary. */
export function parsePromptTokens(text: string, vocabSize: number, where: string): number[] {
  const parts = text.split(",").map((p) => p.trim());
  if (parts.length === 0 || parts.every((p) => p === "")) throw new UsageError("--prompt-tokens: no token ids given");
  return parts.map((p) => {
    if (!/^\d+$/.test(p)) throw new UsageError(`--prompt-tokens: "${p}" is not a token id (a non-negative integer)`);
    const id = Number(p);
    if (id >= vocabSize) throw new UsageError(`--prompt-tokens: token ${id} is outside the vocabulary (vocab_size ${vocabSize} in ${where})`);
    return id;
  });
}

/** `--stats` alone means the one-line summary; `--stats=json` the whole object. */
function statsMode(flags: Flags): "line" | "json" | null {
  const v = flags.stats;
  if (v === undefined) return null;
  if (v === "line" || v === "json") return v;
  throw new UsageError(`--stats: "${v}" is not json (give --stats or --stats=json)`);
}

/** The prompt text: -p TEXT, -p - or piped stdin; undefined when token ids are given instead. */
async function promptText(flags: Flags, stdin: () => Promise<string | null>): Promise<string | undefined> {
  const prompt = stringFlag(flags, "prompt");
  const tokens = stringFlag(flags, "prompt-tokens");
  const file = stringFlag(flags, "file");
  if ([prompt, tokens, file].filter((v) => v !== undefined).length > 1) throw new UsageError("give one of --prompt TEXT, --file FILE or --prompt-tokens IDS");
  if (tokens !== undefined) return undefined;
  if (file !== undefined) {
    try {
      return await Bun.file(file).text();
    } catch (e) {
      throw new UsageError(`--file: cannot read ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
  }
  if (prompt !== undefined && prompt !== "-") return prompt;
  const piped = await stdin();
  if (piped === null) throw new UsageError("give a prompt: -p TEXT, -f FILE, --prompt-tokens IDS, or text on stdin");
  return piped.replace(/\r?\n$/, "");
}

/** run's options (each shown with a description by `cherenkov help run`). */
export const RUN_FLAGS: FlagSpec = {
  prompt: { type: "string", short: "p" },
  file: { type: "string", short: "f" },
  "prompt-tokens": { type: "string" },
  "max-tokens": { type: "string", short: "n" },
  "ignore-eos": { type: "boolean" },
  json: { type: "boolean" },
  chat: { type: "boolean" },
  system: { type: "string" },
  stats: { type: "string" },
  ...SAMPLING_FLAGS,
  ...MODEL_FLAGS,
};

export async function runCommand(argv: string[], io: CliIO): Promise<number> {
  // --stats alone is a flag; parseArgs wants a value for a string option.
  const args = argv.map((a) => (a === "--stats" ? "--stats=line" : a));
  const { flags, positionals } = parseFlags(
    args,
    RUN_FLAGS,
    1,
  );
  const promptTokens = stringFlag(flags, "prompt-tokens");
  const prompt = await promptText(flags, io.stdin ?? (async () => null));
  const system = stringFlag(flags, "system");
  const chat = Boolean(flags.chat) || system !== undefined;
  if (chat && prompt === undefined) throw new UsageError(`${flags.chat ? "--chat" : "--system"} needs a text prompt`);
  // -n -1: no limit but the end token and the context.
  const limit = maxTokensFlag(flags, DEFAULT_MAX_TOKENS, 1 << 20);
  const drafts = draftsFlag(flags);
  const sampling = samplingFlags(flags);
  // With --json the stats go inside the object, whole (a summary line is for people).
  const stats = flags.json && statsMode(flags) ? "json" : statsMode(flags);

  const dir = modelDir(flags, positionals) ?? (await defaultModelDir());
  await using model = await loadModelFromFlags(flags, dir, io);
  const vocab = model.config.vocab_size;
  let tokens: number[];
  if (promptTokens !== undefined) {
    tokens = parsePromptTokens(promptTokens, vocab, `${dir}/${MANIFEST_FILE}`);
  } else {
    if (!model.tokenizer) throw new UsageError(`--prompt: ${dir} has no tokenizer.json; use --prompt-tokens`);
    const messages = [...(system !== undefined ? [{ role: "system" as const, content: system }] : []), { role: "user" as const, content: prompt! }];
    tokens = chat ? model.encode(messages) : model.encode(prompt!);
    if (tokens.length === 0) throw new UsageError("--prompt: the prompt has no tokens");
    const bad = tokens.find((t) => t >= vocab);
    if (bad !== undefined) throw new UsageError(`--prompt: the tokenizer gave id ${bad}, outside the model's vocabulary (${vocab})`);
  }
  if (drafts !== "auto" && drafts > 0 && model.maxDrafts === 0) throw new UsageError(`--drafts: ${dir} has no MTP head`);
  const maxTokens = limit ?? model.maxContext ?? 1 << 20;
  const options: GenerateOptions = { maxTokens, drafts, stopAtEos: !flags["ignore-eos"], ...sampling };
  const stream = model.stream(tokens, options);
  let result: GenerationResult;
  try {
    let r = await stream.next();
    while (!r.done) {
      if (!flags.json) io.stdout(r.value.text);
      r = await stream.next();
    }
    result = r.value;
  } catch (e) {
    if (!(e instanceof ContextFullError)) throw e;
    // What was generated is kept (printed already, or in the --json object); the advice is the flag's.
    if (flags.json) io.stdout(JSON.stringify({ tokens: e.tokens, text: e.text, finishReason: "context_full" }) + "\n");
    else io.stdout("\n");
    if (limit === null && e.tokens.length > 0) return 0; // -n -1 ends at a full context, as llama.cpp's does
    const c = model.maxContext;
    const what = e.tokens.length === 0 ? "the prompt alone does not fit" : `${e.tokens.length} tokens were generated`;
    io.stderr(`cherenkov run: the context (-c ${c}) is full: the prompt has ${tokens.length} tokens and ${what}; give a larger -c/--ctx-size\n`);
    return 1;
  }
  const all = stats === "json" ? { ...model.stats(), timings: result.timings, drafts: result.drafts } : undefined;
  if (flags.json) io.stdout(JSON.stringify({ tokens: result.tokens, text: result.text, ...(all ? { stats: all } : {}) }) + "\n");
  else io.stdout("\n");
  if (stats === "line") io.stderr(statsLine(result, model.stats()) + "\n");
  else if (all && !flags.json) io.stderr(JSON.stringify(all) + "\n");
  return 0;
}
