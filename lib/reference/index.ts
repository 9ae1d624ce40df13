// The reference implementation of qwen4-exp (docs/model.md): slow, obvious f32 TypeScript
// that every kernel, backend and converter is compared with.
export { ReferenceModel, checkTokens, DEFAULT_CHUNK } from "./model.ts";
export type { ForwardOptions, RouteStep, StepResult } from "./model.ts";
export { generateGreedy, MtpProposer } from "./generate.ts";
export type { DraftProposer, DraftStats, GenerateOptions, Generation } from "./generate.ts";
export { SequenceState, StateSnapshot } from "./state.ts";
export type { AttentionState, DeltaNetState, PleState } from "./state.ts";
export { KvCache } from "./kvcache.ts";
export type { KvKind } from "./kvcache.ts";
export {
  argmax,
  causalConvStep,
  dequantizeQ8,
  dot,
  l2Normalize,
  matmulRows,
  matvec,
  quantizeQ8,
  rmsNorm,
  rmsNormGated,
  rmsNormHeads,
  ropeNeox,
  sigmoid,
  silu,
  softmax,
  softplus,
  topKIndices,
  topTwoMargin,
} from "./ops.ts";
export { hcCoefficients, hcFinalRead, hcMixes, hcRead, hcWrite, residualSite, sinkhorn } from "./hyperconnection.ts";
export type { HcCoefficients, HcConfig, HcHeadWeights, HcSiteWeights } from "./hyperconnection.ts";
export { deltanetChunked, deltanetLayer, deltanetStep } from "./deltanet.ts";
export type { DeltaNetWeights } from "./deltanet.ts";
export { attendHead, attentionLayer, qsaScores, qsaSelect } from "./attention.ts";
export type { AttentionWeights } from "./attention.ts";
export { gatedMlp, moeRow, routerTopK } from "./moe.ts";
export type { MoeWeights, Routing } from "./moe.ts";
export { pleGather, pleLayer, pleRowIndex, pleRows } from "./ple.ts";
export type { PleWeights } from "./ple.ts";
export { mtpForward } from "./mtp.ts";
export type { MtpRows, MtpWeights } from "./mtp.ts";
