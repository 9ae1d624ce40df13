// `cherenkov/testing`: what a user's own tests need to hold a backend to the reference:
// the synthetic weights and presets and the reference's greedy generation.
export { RandomWeights } from "./model/weights.ts";
export { generateGreedy, ReferenceModel } from "./reference/index.ts";
export type {
  DraftStats, ForwardOptions, GenerateOptions as ReferenceGenerateOptions, Generation, MtpRows, RouteStep, SequenceState, StepResult,
} from "./reference/index.ts";
export type { StateSnapshot } from "./reference/index.ts";
export type { AttentionState, DeltaNetState, PleState } from "./reference/state.ts";
export type { KvCache, KvKind } from "./reference/kvcache.ts";
export type { Routing } from "./reference/moe.ts";
export type { DraftProposer } from "./reference/generate.ts";
export { presetConfig, presetNames } from "./convert/presets.ts";
