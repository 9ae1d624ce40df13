// The random-weight cases on which the PyTorch implementation of qwen4-exp
// (spec/train/qwen4exp.py) is held to lib/reference: tiny presets with different feature sets,
// a seed each, and a prompt long enough that QSA really selects (topk 4 < prompt length).
import { presetConfig, type Features } from "../../lib/convert/presets.ts";
import type { ModelConfig } from "../../lib/model/config.ts";
import { RandomWeights } from "../../lib/model/weights.ts";

export interface CheckCase {
  name: string;
  seed: number;
  features: Features;
  prompt: number[];
}

export const CHECK_CASES: CheckCase[] = [
  { name: "tiny-all-f32", seed: 101, features: { kvCache: "f32" }, prompt: [5, 17, 42, 300, 7, 7, 256, 99, 123, 64, 3, 211, 18, 40] },
  { name: "tiny-plain-f32", seed: 102, features: { kvCache: "f32", hc: false, qsa: false, ple: false }, prompt: [1, 2, 3, 250, 11, 90, 90, 4, 77, 160] },
  { name: "tiny-all-q8", seed: 103, features: { kvCache: "q8" }, prompt: [9, 8, 7, 6, 5, 280, 31, 31, 31, 200, 14, 66] },
];

export function caseConfig(c: CheckCase): ModelConfig {
  return presetConfig("tiny", c.features);
}

export function caseWeights(c: CheckCase): RandomWeights {
  return new RandomWeights(caseConfig(c), c.seed);
}
