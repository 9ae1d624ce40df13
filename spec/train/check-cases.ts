// The cases on which the PyTorch implementation of qwen4-exp (spec/train/qwen4exp.py) is held
// to lib/reference. Random-weight cases: tiny presets with different feature sets, a seed each,
// and a prompt long enough that QSA really selects (topk 4 < prompt length); PLE on later layers
// (unequal streams) in one. The trained example model: its real drafts get accepted, so chained
// drafts, accept counts and rollbacks after partial accepts are all exercised.
// decode: greedy tokens after the prompt, compared position by position; spec: speculative
// decoding with these draft counts, maxTokens tokens each.
import { join } from "node:path";
import { presetConfig, type Features } from "../../lib/convert/presets.ts";
import type { ModelConfig } from "../../lib/model/config.ts";
import { RandomWeights } from "../../lib/model/weights.ts";

export interface CheckRuns {
  decode: number;
  spec: { maxTokens: number; drafts: number[] };
}

export interface CheckCase extends CheckRuns {
  name: string;
  seed: number;
  features: Features;
  prompt: number[];
}

export const CHECK_CASES: CheckCase[] = [
  {
    name: "tiny-all-f32", seed: 101, features: { kvCache: "f32" }, prompt: [5, 17, 42, 300, 7, 7, 256, 99, 123, 64, 3, 211, 18, 40],
    decode: 24, spec: { maxTokens: 24, drafts: [3] },
  },
  {
    name: "tiny-plain-f32", seed: 102, features: { kvCache: "f32", hc: false, qsa: false, ple: false }, prompt: [1, 2, 3, 250, 11, 90, 90, 4, 77, 160],
    decode: 16, spec: { maxTokens: 16, drafts: [2] },
  },
  {
    name: "tiny-all-q8", seed: 103, features: { kvCache: "q8" }, prompt: [9, 8, 7, 6, 5, 280, 31, 31, 31, 200, 14, 66],
    decode: 12, spec: { maxTokens: 12, drafts: [3] },
  },
  {
    name: "tiny-ple-late-f32", seed: 104, features: { kvCache: "f32", pleLayers: [1, 3] }, prompt: [12, 250, 3, 3, 77, 141, 9, 64, 200, 31, 5, 18, 222],
    decode: 24, spec: { maxTokens: 24, drafts: [3] },
  },
];

/** The trained example model (PLE on layers 0 and 4, q8 KV, QSA topk 64). */
export const TRAINED_CASE = {
  name: "qwen4-exp-tiny",
  dir: join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny"),
  /** Relative to the repository root, where check_agreement.py runs. */
  repoDir: "examples/models/qwen4-exp-tiny",
  text: "The cat sat on the mat. The dog",
  decode: 24,
  spec: { maxTokens: 16, drafts: [1, 2, 3] },
} as const;

export function caseConfig(c: CheckCase): ModelConfig {
  return presetConfig("tiny", c.features);
}

export function caseWeights(c: CheckCase): RandomWeights {
  return new RandomWeights(caseConfig(c), c.seed);
}
