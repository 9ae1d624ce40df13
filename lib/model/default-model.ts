// The model `cherenkov run` uses when no directory is given: the tiny preset, seed 0, q4,
// generated on first use (about 3 MB, well under a second) into the cache and reused after.
// Generation is deterministic, so every machine gets the same bytes without a download.
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { presetConfig } from "../convert/presets.ts";
import { synthesize } from "../convert/synth.ts";
import { MANIFEST_FILE } from "./manifest.ts";

export const DEFAULT_PRESET = "tiny";
export const DEFAULT_SEED = 0;

/** $CHERENKOV_HOME, or ~/.cache/cherenkov. */
export function cherenkovHome(): string {
  return process.env.CHERENKOV_HOME || join(homedir(), ".cache", "cherenkov");
}

/** True when `dir` holds a finished model written from the current tiny preset. */
function isCurrent(dir: string): boolean {
  try {
    const m = JSON.parse(readFileSync(join(dir, MANIFEST_FILE), "utf8"));
    // A cache written before the preset changed must not stand in for the new one.
    return JSON.stringify(m.config) === JSON.stringify(presetConfig(DEFAULT_PRESET)) && m.weights === "q4";
  } catch {
    return false;
  }
}

export async function defaultModelDir(): Promise<string> {
  const models = join(cherenkovHome(), "models");
  const dir = join(models, `${DEFAULT_PRESET}-s${DEFAULT_SEED}`);
  if (isCurrent(dir)) return dir;
  mkdirSync(models, { recursive: true });
  // Written beside the target and renamed into place, so a reader never sees half a model
  // and two processes racing both end up with a complete one.
  const tmp = join(models, `.${DEFAULT_PRESET}-s${DEFAULT_SEED}.tmp-${process.pid}-${Date.now()}`);
  try {
    await synthesize({ preset: DEFAULT_PRESET, seed: DEFAULT_SEED, out: tmp, weights: "q4" });
    if (existsSync(dir) && !isCurrent(dir)) rmSync(dir, { recursive: true, force: true });
    try {
      renameSync(tmp, dir);
    } catch (e) {
      if (!isCurrent(dir)) throw e; // someone else won the race with a good model: use theirs
    }
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
  return dir;
}
