// Sampling flags as llama.cpp spells them, mapped onto GenerateOptions' names; validated by
// the same code as the API (lib/reference/sampling.ts), with errors naming the flag.
import type { GenerateOptions } from "../api/model.ts";
import { checkSeed, samplingParams } from "../reference/sampling.ts";
import { stringFlag, type FlagSpec, type Flags, UsageError } from "./args.ts";

/** CLI flag -> GenerateOptions field. */
const NAMES = {
  temp: "temperature",
  "top-k": "topK",
  "top-p": "topP",
  "min-p": "minP",
  "repeat-penalty": "repetitionPenalty",
  "presence-penalty": "presencePenalty",
  "frequency-penalty": "frequencyPenalty",
  seed: "seed",
} as const;

export const SAMPLING_FLAGS: FlagSpec = Object.fromEntries(
  Object.keys(NAMES).map((k) => [k, k === "seed" ? { type: "string", short: "s" } : { type: "string" }]),
) as FlagSpec;

export const SAMPLING_FLAGS_USAGE = `  Sampling (default greedy; docs/sampling.md):
    --temp T             temperature, 0..100 (0 = greedy, the default)
    --top-k K            keep the K most likely tokens (0 = off)
    --top-p P            keep the most likely tokens up to probability mass P, (0, 1] (1 = off)
    --min-p P            keep tokens at least P times as likely as the top one, [0, 1] (0 = off)
    --repeat-penalty R   divide the logits of tokens already in the context by R (1 = off)
    --presence-penalty X  subtract X from tokens already generated (0 = off)
    --frequency-penalty X  subtract X per time a token was generated (0 = off)
    -s, --seed N         the same seed and inputs give the same tokens (default, or -1: random)`;

export function samplingFlags(flags: Flags): Partial<GenerateOptions> {
  const out: Record<string, number> = {};
  for (const [flag, field] of Object.entries(NAMES)) {
    const text = stringFlag(flags, flag);
    if (text === undefined) continue;
    if (flag === "seed" && text.trim() === "-1") continue; // llama.cpp's "a random seed", the default
    const v = Number(text);
    if (text.trim() === "" || !Number.isFinite(v)) throw new UsageError(`--${flag}: "${text}" is not a number`);
    out[field] = v;
  }
  try {
    samplingParams(out);
    if (out.seed !== undefined) checkSeed(out.seed);
  } catch (e) {
    const message = (e as Error).message;
    const entry = Object.entries(NAMES).find(([, field]) => message.startsWith(field + " "));
    throw new UsageError(entry ? `--${entry[0]}${message.slice(entry[1].length)}` : message);
  }
  return out as Partial<GenerateOptions>;
}
