// `cherenkov/testing`: what a user's own tests need to hold a backend to the reference:
// the synthetic weights and presets and the reference's greedy generation.
export { RandomWeights } from "./model/weights.ts";
export type { Weights } from "./model/weights.ts";
export { generateGreedy, ReferenceModel } from "./reference/index.ts";
export type { Generation, RouteStep } from "./reference/index.ts";
export { presetConfig, presetNames } from "./convert/presets.ts";
