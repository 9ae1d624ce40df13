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

/** Parses argv against `spec`, allowing at most `maxPositionals` positional arguments. */
export function parseFlags(argv: string[], spec: FlagSpec, maxPositionals: number): Parsed {
  let parsed;
  try {
    parsed = parseArgs({ args: argv, options: spec, allowPositionals: true, strict: true });
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

/** `--drafts auto|N`: "auto" (the adaptive count) or a fixed count in 0..16; 0 when absent. */
export function draftsFlag(flags: Flags): number | "auto" {
  const v = stringFlag(flags, "drafts")?.trim();
  if (v === "auto") return "auto";
  if (v !== undefined && !/^\d+$/.test(v)) throw new UsageError(`--drafts: "${v}" is neither "auto" nor a count in 0..16`);
  return intFlag(flags, "drafts", 0, 0, 16);
}
