// `cherenkov run`: greedy generation from a prompt through Model (streamed to stdout).
import { BackendUnavailableError } from "../../api/backend.ts";
import { autoBackend } from "../../api/auto-backend.ts";
import { Model } from "../../api/model.ts";
import { defaultModelDir } from "../../model/default-model.ts";
import { MANIFEST_FILE } from "../../model/manifest.ts";
import type { EngineOptions } from "../../api/engine-backend.ts";
import { BudgetError, parsePoolSize } from "../../gpu/budget.ts";
import { IO_MODES, type IoMode } from "../../gpu/load.ts";
import { DEFAULT_POOL_POLICY, POOL_POLICIES } from "../../gpu/residency.ts";
import { choiceFlag, draftsFlag, intFlag, parseFlags, stringFlag, type Flags, UsageError } from "../args.ts";
import type { CliIO } from "../io.ts";

const BACKENDS = ["auto", "reference", "cpu", "metal", "cuda"] as const;

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

/** --io direct|cached: how the wired pool reads expert records (shared with serve). */
export function ioFlag(flags: Flags): IoMode {
  if (flags.io !== undefined && flags.backing === "mapped") throw new UsageError("--io applies to --backing wired (the mapped backing does no reads)");
  return choiceFlag(flags, "io", IO_MODES, "direct");
}

/** The engine's flags (--pool, --pool-slots, --backing, --io, --pool-policy, --no-lookahead, --max-context, --trace). */
function engineFlags(flags: Flags): EngineOptions {
  const engine: EngineOptions = {};
  const pool = stringFlag(flags, "pool");
  if (pool !== undefined && flags["pool-slots"] !== undefined) throw new UsageError("give at most one of --pool and --pool-slots");
  if (pool !== undefined) {
    try {
      const size = parsePoolSize(pool);
      if (size.poolFraction !== undefined) engine.pool = size.poolFraction;
      else engine.poolBytes = size.poolBytes;
    } catch (e) {
      throw new UsageError((e as Error).message);
    }
  }
  if (flags["pool-slots"] !== undefined) engine.poolSlots = intFlag(flags, "pool-slots", 0, 1);
  if (flags.backing !== undefined) engine.backing = choiceFlag(flags, "backing", ["wired", "mapped"] as const, "wired");
  if (flags.io !== undefined) engine.ioMode = ioFlag(flags);
  if (flags["pool-policy"] !== undefined) engine.poolPolicy = choiceFlag(flags, "pool-policy", POOL_POLICIES, DEFAULT_POOL_POLICY);
  if (flags["no-lookahead"]) engine.lookahead = false;
  if (flags["max-context"] !== undefined) engine.maxContext = intFlag(flags, "max-context", 4096, 1, 1 << 24);
  const trace = stringFlag(flags, "trace");
  if (trace !== undefined) engine.trace = trace;
  return engine;
}

export async function runCommand(argv: string[], io: CliIO): Promise<number> {
  const { flags, positionals } = parseFlags(
    argv,
    {
      prompt: { type: "string" },
      "prompt-tokens": { type: "string" },
      "max-tokens": { type: "string" },
      backend: { type: "string" },
      drafts: { type: "string" },
      "prefill-chunk": { type: "string" },
      json: { type: "boolean" },
      chat: { type: "boolean" },
      stats: { type: "boolean" },
      verbose: { type: "boolean" },
      pool: { type: "string" },
      "pool-slots": { type: "string" },
      backing: { type: "string" },
      io: { type: "string" },
      "pool-policy": { type: "string" },
      "no-lookahead": { type: "boolean" },
      "max-context": { type: "string" },
      trace: { type: "string" },
    },
    1,
  );
  const prompt = stringFlag(flags, "prompt");
  const promptTokens = stringFlag(flags, "prompt-tokens");
  if ((prompt === undefined) === (promptTokens === undefined)) throw new UsageError("give exactly one of --prompt TEXT or --prompt-tokens IDS");
  if (flags.chat && prompt === undefined) throw new UsageError("--chat needs --prompt");
  const maxTokens = intFlag(flags, "max-tokens", 16, 1, 1 << 20);
  const drafts = draftsFlag(flags);
  const prefillChunk = intFlag(flags, "prefill-chunk", 512, 1, 1 << 20);
  const backend = choiceFlag(flags, "backend", BACKENDS, "auto");
  const engine = engineFlags(flags);

  const dir = positionals[0] ?? (await defaultModelDir());
  const model = await Model.load(dir, { backend, prefillChunk, engine }).catch((e: unknown) => {
    if (e instanceof BackendUnavailableError) throw new UsageError(`--backend: ${e.message}`);
    if (e instanceof BudgetError) throw new UsageError(`--pool: ${e.message}`);
    throw e;
  });
  try {
    if (flags.verbose) io.stderr(`cherenkov: ${model.backendName} backend${backend === "auto" ? ` (auto: ${autoBackend().reason})` : ""}\n`);
    const vocab = model.config.vocab_size;
    let tokens: number[];
    if (promptTokens !== undefined) {
      tokens = parsePromptTokens(promptTokens, vocab, `${dir}/${MANIFEST_FILE}`);
    } else {
      if (!model.tokenizer) throw new UsageError(`--prompt: ${dir} has no tokenizer.json; use --prompt-tokens`);
      tokens = flags.chat ? model.encode([{ role: "user", content: prompt! }]) : model.encode(prompt!);
      if (tokens.length === 0) throw new UsageError("--prompt: the prompt has no tokens");
      const bad = tokens.find((t) => t >= vocab);
      if (bad !== undefined) throw new UsageError(`--prompt: the tokenizer gave id ${bad}, outside the model's vocabulary (${vocab})`);
    }
    if (drafts !== "auto" && drafts > 0 && model.maxDrafts === 0) throw new UsageError(`--drafts: ${dir} has no MTP head`);
    const stream = model.stream(tokens, { maxTokens, drafts });
    let r = await stream.next();
    while (!r.done) {
      if (!flags.json) io.stdout(r.value.text);
      r = await stream.next();
    }
    const result = r.value;
    const stats = flags.stats ? { ...model.stats(), timings: result.timings, drafts: result.drafts } : undefined;
    if (flags.json) io.stdout(JSON.stringify({ tokens: result.tokens, text: result.text, ...(stats ? { stats } : {}) }) + "\n");
    else {
      io.stdout("\n");
      if (stats) io.stderr(JSON.stringify(stats) + "\n");
    }
  } finally {
    await model.close();
  }
  return 0;
}
