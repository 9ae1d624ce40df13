// `cherenkov run`: greedy generation from a prompt, on the reference backend for now.
import { defaultModelDir } from "../../model/default-model.ts";
import { openModel } from "../../model/format.ts";
import { MANIFEST_FILE } from "../../model/manifest.ts";
import { loadTokenizer } from "../../model/tokenizer.ts";
import { choiceFlag, intFlag, parseFlags, stringFlag, UsageError } from "../args.ts";
import type { CliIO } from "../io.ts";

const BACKENDS = ["reference"] as const;

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

export async function runCommand(argv: string[], io: CliIO): Promise<number> {
  const { flags, positionals } = parseFlags(
    argv,
    {
      prompt: { type: "string" },
      "prompt-tokens": { type: "string" },
      "max-tokens": { type: "string" },
      backend: { type: "string" },
      json: { type: "boolean" },
      chat: { type: "boolean" },
    },
    1,
  );
  const prompt = stringFlag(flags, "prompt");
  const promptTokens = stringFlag(flags, "prompt-tokens");
  if ((prompt === undefined) === (promptTokens === undefined)) throw new UsageError("give exactly one of --prompt TEXT or --prompt-tokens IDS");
  if (flags.chat && prompt === undefined) throw new UsageError("--chat needs --prompt");
  const maxTokens = intFlag(flags, "max-tokens", 16, 1, 1 << 20);
  choiceFlag(flags, "backend", BACKENDS, "reference");

  const dir = positionals[0] ?? (await defaultModelDir());
  const model = await openModel(dir);
  try {
    const tokenizer = await loadTokenizer(dir);
    let tokens: number[];
    if (promptTokens !== undefined) {
      tokens = parsePromptTokens(promptTokens, model.config.vocab_size, `${dir}/${MANIFEST_FILE}`);
    } else {
      const text = flags.chat ? tokenizer.applyChatTemplate([{ role: "user", content: prompt! }], { addGenerationPrompt: true }) : prompt!;
      tokens = tokenizer.encode(text, { addSpecialTokens: !flags.chat });
      if (tokens.length === 0) throw new UsageError("--prompt: the prompt has no tokens");
      const bad = tokens.find((t) => t >= model.config.vocab_size);
      if (bad !== undefined) throw new UsageError(`--prompt: the tokenizer gave id ${bad}, outside the model's vocabulary (${model.config.vocab_size})`);
    }
    // Loaded on demand: the reference is the heaviest module and other commands do not need it.
    const { generateGreedy } = await import("../../reference/index.ts");
    const result = generateGreedy(model, tokens, { maxTokens, stopAtEos: true });
    const text = tokenizer.decode(result.tokens);
    io.stdout(flags.json ? JSON.stringify({ tokens: result.tokens, text }) + "\n" : text + "\n");
  } finally {
    model.close();
  }
  return 0;
}
