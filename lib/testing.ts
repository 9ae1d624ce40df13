// `cherenkov/testing`: what a user's own tests need to hold a backend to the reference:
// the synthetic weights and presets and the reference's greedy generation.
export { RandomWeights } from "./model/weights.ts";
export { generateGreedy, ReferenceModel } from "./reference/index.ts";
export type {
  DraftStats, ForwardOptions, GenerateOptions as ReferenceGenerateOptions, Generation, MtpRows, RouteStep, SequenceState, StepResult,
} from "./reference/index.ts";
export { presetConfig, presetNames } from "./convert/presets.ts";
