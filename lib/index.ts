// The public API of cherenkov. Explicit named exports only: from lib/gpu and lib/shim.ts
// only error classes and option types are public.
export { DEFAULT_MAX_TOKENS, Model, Session } from "./api/model.ts";
export { SessionBusyError, SessionClosedError } from "./api/session-errors.ts";
export { InvalidArgumentError } from "./api/validate.ts";
export type {
  BackendName, FinishReason, GenerateOptions, GenerationResult, LoadOptions, ModelStats, Prompt, StreamChunk,
} from "./api/model.ts";
export type { SamplingOptions } from "./reference/sampling.ts";
export { ConfigError, parseConfig } from "./model/config.ts";
export type { ModelConfig } from "./model/config.ts";
export { ModelFormatError, NonFiniteError } from "./model/errors.ts";
export { ChatTemplateError } from "./model/chat-template.ts";
export type { ModelFormatErrorInfo } from "./model/errors.ts";
export type { ExpertWeights, Weights } from "./model/weights.ts";
export { openModel } from "./model/format.ts";
export type { ExpertLayout, ModelFiles, OpenOptions, ValidManifest, VerifyProgress } from "./model/format.ts";
export type { Manifest } from "./model/manifest.ts";
export type { Architecture } from "./convert/hf.ts";
export type { Backing, PoolPolicy } from "./gpu/residency.ts";
export type { IoMode } from "./gpu/load.ts";
export type { ChatMessage, TemplateMessage, TextTokenizer, TokenizerSource } from "./model/tokenizer.ts";
export { defaultModelDir } from "./model/default-model.ts";
export { synthesize } from "./convert/synth.ts";
export type { SynthOptions, SynthResult } from "./convert/synth.ts";
export { presetConfig, presetNames } from "./convert/presets.ts";
export type { Features, PresetName } from "./convert/presets.ts";
export { convertCheckpoint } from "./convert/convert.ts";
export type { ConvertOptions, ConvertResult } from "./convert/convert.ts";
export { BackendUnavailableError } from "./api/backend.ts";
// Every error a caller may want to catch by class.
export { ModelClosedError } from "./api/errors.ts";
export { ContextFullError } from "./gpu/state.ts";
export { BudgetError } from "./gpu/budget.ts";
export { PreloadError } from "./gpu/resident.ts";
export { FootprintError } from "./api/footprint.ts";
export { PoolTooSmallError } from "./gpu/residency.ts";
export { GpuStepError } from "./gpu/handshake.ts";
export { IoCancelledError, IoReadError, IoTimeoutError } from "./gpu/streaming.ts";
export type { ReadLabel } from "./gpu/streaming.ts";
export { ShimError } from "./shim.ts";
export { createServer } from "./server/server.ts";
export type { RunningServer, ServerOptions } from "./server/server.ts";
export type { EngineOptions } from "./api/engine-backend.ts";
export type { Checkpoint } from "./api/checkpoint.ts";
export type { DraftStats, SessionOptions, TokenLogprob } from "./api/model.ts";
// The shapes of model.stats(): ModelStats.engine is one of the BackendStats.
export type { BackendStats, EngineBackendStats, ReferenceBackendStats } from "./api/backend.ts";
export type {
  EngineSetup, EngineStats, HandshakeSummary, IoStats, LatencySummary, LoadedEngineStats, LookaheadStats, PhaseEntry, PhaseStats, PoolStats,
} from "./gpu/telemetry.ts";
export type { ActivitySnapshot } from "./gpu/activity.ts";
export type { PreloadOption, ResidentStats } from "./gpu/resident.ts";
export type { MemoryStats } from "./gpu/memory.ts";
