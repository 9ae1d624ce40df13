// Builds a golden case's model on disk (through the real writer and reader, so q4 rounding
// is part of the sequence) and runs the reference on it.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { synthesize } from "../../lib/convert/synth.ts";
import { openModel } from "../../lib/model/format.ts";
import { generateGreedy } from "../../lib/reference/index.ts";
import type { GoldenCase } from "./cases.ts";

export interface GoldenRecord {
  name: string;
  preset: string;
  features: GoldenCase["features"];
  seed: number;
  dtype: string;
  prompt: number[];
  /** Greedy continuation. */
  tokens: number[];
  /** top-1 minus top-2 logit of the step that produced each token: a backend may only
   * disagree where this is within its numerical error. */
  margins: number[];
}

export const goldenPath = (name: string) => join(import.meta.dir, `${name}.json`);

/** Synthesizes the case's model into a temporary directory; the caller removes it. */
export async function buildGoldenModel(c: GoldenCase): Promise<string> {
  const dir = mkdtempSync(join(tmpdir(), `cherenkov-golden-${c.name}-`));
  await synthesize({ preset: c.preset, features: c.features, seed: c.seed, out: dir, weights: c.dtype, workers: 0 });
  return dir;
}

export async function runGolden(c: GoldenCase): Promise<GoldenRecord> {
  const dir = await buildGoldenModel(c);
  try {
    const model = await openModel(dir);
    const g = generateGreedy(model, c.prompt, { maxTokens: c.maxTokens });
    model.close();
    return {
      name: c.name, preset: c.preset, features: c.features, seed: c.seed, dtype: c.dtype,
      prompt: c.prompt, tokens: g.tokens, margins: g.margins.map((m) => Math.fround(m)),
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
