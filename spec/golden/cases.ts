// The golden cases: tiny synthetic models of several seeds and feature sets, each with a
// fixed prompt. Every backend must reproduce their greedy tokens (spec/golden/*.json).
import type { Features } from "../../lib/convert/presets.ts";

export interface GoldenCase {
  name: string;
  preset: "tiny";
  features: Features;
  seed: number;
  dtype: "q4" | "f32";
  prompt: number[];
  maxTokens: number;
}

/** A deterministic prompt of byte tokens (the tiny vocabulary's first 256 ids are bytes). */
const prompt = (text: string) => [...new TextEncoder().encode(text)];

export const goldenCases: GoldenCase[] = [
  { name: "tiny-all-s1", preset: "tiny", features: {}, seed: 1, dtype: "q4", prompt: prompt("The quick brown fox"), maxTokens: 24 },
  { name: "tiny-all-s2", preset: "tiny", features: {}, seed: 2, dtype: "q4", prompt: prompt("def main():\n    "), maxTokens: 24 },
  { name: "tiny-all-s3-f32", preset: "tiny", features: { kvCache: "f32" }, seed: 3, dtype: "f32", prompt: prompt("Hello, world"), maxTokens: 24 },
  { name: "tiny-plain-s4", preset: "tiny", features: { hc: false, qsa: false, ple: false, mtp: false }, seed: 4, dtype: "q4", prompt: prompt("Once upon a time"), maxTokens: 24 },
  { name: "tiny-n1-s5", preset: "tiny", features: { hc: false }, seed: 5, dtype: "q4", prompt: prompt("import sys\n"), maxTokens: 24 },
  { name: "tiny-noqsa-s6", preset: "tiny", features: { qsa: false }, seed: 6, dtype: "q4", prompt: prompt("a b c d e f g h"), maxTokens: 24 },
  { name: "tiny-nople-s7", preset: "tiny", features: { ple: false }, seed: 7, dtype: "q4", prompt: prompt("1, 2, 3, 5, 8"), maxTokens: 24 },
  // PLE on later layers, where the streams differ (its query is their mean).
  { name: "tiny-plelate-s8", preset: "tiny", features: { pleLayers: [1, 3] }, seed: 8, dtype: "q4", prompt: prompt("the n-gram memory"), maxTokens: 24 },
];
