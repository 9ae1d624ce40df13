// Flag parsing for the subcommands: node:util parseArgs, with every mistake turned into a
// UsageError (exit code 2) whose message names the flag.
import { parseArgs } from "node:util";

import { closest } from "./suggest.ts";

/** Names other tools (and earlier versions) use for options that have one name here. */
const RENAMED: Record<string, string> = {
  "--context": "--ctx-size",
  "--max-context": "--ctx-size",
  "--temperature": "--temp",
  "--max-new-tokens": "--max-tokens",
};

export class UsageError extends Error {
  override name = "UsageError";
}

export type FlagSpec = Record<string, { type: "string" | "boolean"; short?: string }>;
export type Flags = Record<string, string | boolean | undefined>;

export interface Parsed {
  flags: Flags;
  positionals: string[];
}

/**
 * llama.cpp's spellings that parseArgs cannot read as they are: multi-letter single-dash
 * names ("-sys" would be -s "ys", "-ngl" -n "gl") and long names cherenkov spells otherwise.
 * Each applies when the command has the option it maps to.
 */
const LLAMA_SPELLINGS: Record<string, string> = {
  "-sys": "--system",
  "--system-prompt": "--system",
  "--n-predict": "--max-tokens",
  "-ngl": "--n-gpu-layers",
  "--gpu-layers": "--n-gpu-layers",
  "-fa": "--flash-attn",
  "-mg": "--main-gpu",
  "-sm": "--split-mode",
  "-ts": "--tensor-split",
};

/** A value that parseArgs would take for an option: "-1", "-0.5". */
const NEGATIVE_NUMBER = /^-\d+(\.\d+)?$/;

/**
 * argv as parseArgs can read it: llama.cpp's spellings renamed, a negative number after an
 * option that takes a value joined to it (`-n -1` -> `--max-tokens=-1`; parseArgs refuses it
 * as "ambiguous"), and `--flash-attn on|off|auto` (a value in newer llama.cpp) reduced to the flag.
 */
export function llamaArgv(argv: string[], spec: FlagSpec): string[] {
  const valued = new Map<string, string>();
  for (const [name, o] of Object.entries(spec)) {
    if (o.type !== "string") continue;
    valued.set(`--${name}`, name);
    if (o.short) valued.set(`-${o.short}`, name);
  }
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i]!;
    if (arg === "--") {
      out.push(...argv.slice(i));
      break;
    }
    const renamed = LLAMA_SPELLINGS[arg];
    if (renamed && spec[renamed.slice(2)]) arg = renamed;
    const name = valued.get(arg);
    if (name && NEGATIVE_NUMBER.test(argv[i + 1] ?? "")) out.push(`--${name}=${argv[++i]}`);
    else if (arg === "--flash-attn" && spec["flash-attn"]?.type === "boolean" && /^(on|off|auto)$/.test(argv[i + 1] ?? "")) {
      out.push(arg);
      i++;
    } else out.push(arg);
  }
  return out;
}

/** Parses argv against `spec`, allowing at most `maxPositionals` positional arguments. */
export function parseFlags(argv: string[], spec: FlagSpec, maxPositionals: number): Parsed {
  let parsed;
  try {
    parsed = parseArgs({ args: llamaArgv(argv, spec), options: spec, allowPositionals: true, strict: true });
  } catch (e) {
    // parseArgs messages already name the flag ("Unknown option '--x'. To specify a positional
    // argument starting with a '-' ...", "Option '--seed <value>' argument missing"); keep the first sentence.
    const first = (e as Error).message.split(/\.\s(?=[A-Z])/)[0]!;
    const unknown = first.match(/^Unknown option '(--?[^']+)'/)?.[1];
    if (unknown) {
      const known = Object.entries(spec).flatMap(([name, o]) => [`--${name}`, ...(o.short ? [`-${o.short}`] : [])]);
      const name = unknown.split("=")[0]!;
      const renamed = RENAMED[name];
      const guess = renamed && known.includes(renamed) ? renamed : closest(name, known);
      throw new UsageError(`unknown option ${unknown}${guess ? ` (did you mean ${guess}?)` : ""}`);
    }
    throw new UsageError(first);
  }
  if (parsed.positionals.length > maxPositionals)
    throw new UsageError(
      maxPositionals === 0
        ? `unexpected argument "${parsed.positionals[0]}"`
        : `unexpected argument "${parsed.positionals[maxPositionals]}" (takes at most ${maxPositionals})`,
    );
  return { flags: parsed.values as Flags, positionals: parsed.positionals };
}

export function stringFlag(flags: Flags, name: string): string | undefined {
  const v = flags[name];
  return typeof v === "string" ? v : undefined;
}

export function requiredString(flags: Flags, name: string): string {
  const v = stringFlag(flags, name);
  if (v === undefined || v === "") throw new UsageError(`--${name} is required`);
  return v;
}

/** An integer flag in [min, max]; `fallback` when absent. */
export function intFlag(flags: Flags, name: string, fallback: number, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  const v = stringFlag(flags, name);
  if (v === undefined) return fallback;
  if (!/^\d+$/.test(v.trim()) || Number(v) < min || Number(v) > max)
    throw new UsageError(`--${name}: "${v}" is not an integer in ${min}..${max}`);
  return Number(v);
}

/** One of a fixed set of values; `fallback` when absent. */
export function choiceFlag<T extends string>(flags: Flags, name: string, choices: readonly T[], fallback: T): T {
  const v = stringFlag(flags, name);
  if (v === undefined) return fallback;
  if (!choices.includes(v as T)) throw new UsageError(`--${name}: "${v}" is not one of ${choices.join(", ")}`);
  return v as T;
}

/**
 * -n/--max-tokens: a count in 1..max, `fallback` when absent, or -1 (llama.cpp's "no limit":
 * until the end token or a full context), which is null.
 */
export function maxTokensFlag(flags: Flags, fallback: number, max: number): number | null {
  if (stringFlag(flags, "max-tokens")?.trim() === "-1") return null;
  const v = stringFlag(flags, "max-tokens");
  if (v !== undefined && !/^\d+$/.test(v.trim())) throw new UsageError(`--max-tokens: "${v}" is not an integer in 1..${max}, or -1 (no limit)`);
  return intFlag(flags, "max-tokens", fallback, 1, max);
}

/** `--drafts auto|N`: "auto" (the adaptive count) or a fixed count in 0..16; 0 when absent. */
export function draftsFlag(flags: Flags): number | "auto" {
  const v = stringFlag(flags, "drafts")?.trim();
  if (v === "auto") return "auto";
  if (v !== undefined && !/^\d+$/.test(v)) throw new UsageError(`--drafts: "${v}" is neither "auto" nor a count in 0..16`);
  return intFlag(flags, "drafts", 0, 0, 16);
}
