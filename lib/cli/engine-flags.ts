// The options every command that loads a model takes, with one name each (run and serve
// share them): model directory, backend, context size, prefill chunk, drafts, and the
// engine's pool, backing, IO and lookahead settings.
import { autoBackend } from "../api/auto-backend.ts";
import { BackendUnavailableError } from "../api/backend.ts";
import type { EngineOptions } from "../api/engine-backend.ts";
import { Model, type BackendName } from "../api/model.ts";
import { BudgetError, parsePoolSize } from "../gpu/budget.ts";
import { IO_MODES, type IoMode } from "../gpu/load.ts";
import { DEFAULT_POOL_POLICY, POOL_POLICIES } from "../gpu/residency.ts";
import { PreloadError } from "../gpu/resident.ts";
import { choiceFlag, intFlag, stringFlag, type FlagSpec, type Flags, UsageError } from "./args.ts";
import type { CliIO } from "./io.ts";

export const BACKENDS = ["auto", "reference", "cpu", "metal", "cuda"] as const;

/**
 * llama.cpp's offload and threading flags: accepted so that a llama.cpp command line runs,
 * with a note that they do not apply (every layer runs on the loaded backend's device).
 */
export const OFFLOAD_FLAGS: FlagSpec = {
  "n-gpu-layers": { type: "string" },
  "flash-attn": { type: "boolean" },
  threads: { type: "string", short: "t" },
  "main-gpu": { type: "string" },
  "split-mode": { type: "string" },
  "tensor-split": { type: "string" },
  mlock: { type: "boolean" },
  "no-mmap": { type: "boolean" },
};

export const MODEL_FLAGS: FlagSpec = {
  model: { type: "string", short: "m" },
  backend: { type: "string" },
  "ctx-size": { type: "string", short: "c" },
  "prefill-chunk": { type: "string" },
  drafts: { type: "string" },
  verbose: { type: "boolean" },
  pool: { type: "string" },
  "pool-slots": { type: "string" },
  backing: { type: "string" },
  io: { type: "string" },
  "pool-policy": { type: "string" },
  "no-lookahead": { type: "boolean" },
  preload: { type: "boolean" },
  "no-preload": { type: "boolean" },
  trace: { type: "string" },
  ...OFFLOAD_FLAGS,
};

export const MODEL_FLAGS_USAGE = `  Model options (run and serve):
    -m, --model DIR      model directory (or as the first argument; default: the embedded
                         qwen4-exp-tiny)
    --backend NAME       auto (default: metal on macOS, cuda with an NVIDIA GPU, else reference,
                         the faster CPU choice; CHERENKOV_BACKEND overrides), cpu, metal, cuda,
                         or reference
    -c, --ctx-size N     tokens a sequence may hold, prompt and completion (default 4096)
    --prefill-chunk N    prompt rows per step (default 512)
    --drafts auto|N      MTP drafts per step (speculative decoding; same tokens as greedy);
                         auto picks 0..max each step from the measured acceptance and step times
    --verbose            print which backend runs the model and why; errors with their stack
  Engine options (backends cpu and metal):
    --pool N% | SIZE     expert pool as a share of all expert records, or bytes (8GiB)
    --pool-slots N       expert pool in records
    --backing wired|mapped  slots filled by reads (default), or the mapped file (only when
                         experts.bin fits the working set: it is made resident whole)
    --io direct|cached   wired pool reads: uncached (default), or through the page cache,
                         which then keeps hot records the pool evicted
    --pool-policy reuse|layer-cyclic|lru  eviction: the record expected back farthest away
                         (default; its layer's distance and its recent use rate), the layer
                         visited farthest away next, or the least recently used record
    --no-lookahead       do not run the next layer's router early to prefetch its experts
    --preload            read every expert record at load (the pool must hold them all);
                         by default this happens when it does: then no MoE layer waits for
                         the host during a step
    --no-preload         never read the experts at load (they are read as steps need them)
    --trace FILE         append every step's routing (tokens, experts, weights, misses) as JSON lines
  llama.cpp's offload and threading flags, accepted and ignored with a note (every layer
  runs on the backend's device):
    -ngl, --n-gpu-layers N  layers on the GPU
    -fa, --flash-attn    flash attention (on|off|auto may follow)
    -t, --threads N      CPU threads
    -mg, --main-gpu N    the GPU to use
    -sm, --split-mode X  how to split the model across GPUs
    -ts, --tensor-split X  shares of the model per GPU
    --mlock, --no-mmap   locking and mapping of the model's memory`;

/** The model directory: -m/--model or the one positional argument (not both). */
export function modelDir(flags: Flags, positionals: string[]): string | undefined {
  const named = stringFlag(flags, "model");
  if (named !== undefined && positionals.length > 0) throw new UsageError(`give the model directory once: --model ${named} or ${positionals[0]}`);
  if (named === "") throw new UsageError("--model: give a model directory");
  return named ?? positionals[0];
}

export function backendFlag(flags: Flags): BackendName {
  return choiceFlag(flags, "backend", BACKENDS, "auto");
}

/** -c/--ctx-size, or undefined when not given. */
export function ctxSizeFlag(flags: Flags): number | undefined {
  return stringFlag(flags, "ctx-size") === undefined ? undefined : intFlag(flags, "ctx-size", 4096, 2, 1 << 24);
}

/** --io direct|cached: how the wired pool reads expert records. */
export function ioFlag(flags: Flags): IoMode {
  if (flags.io !== undefined && flags.backing === "mapped") throw new UsageError("--io applies to --backing wired (the mapped backing does no reads)");
  return choiceFlag(flags, "io", IO_MODES, "direct");
}

/** Flags that set the engine's pool, reads or traces: the reference backend has none of these. */
const ENGINE_ONLY = ["pool", "pool-slots", "backing", "io", "pool-policy", "no-lookahead", "preload", "no-preload", "trace"] as const;

/**
 * Refuses engine-only flags when the model runs on the reference backend (named, or auto's
 * choice here), rather than ignoring them; -c applies to every backend.
 */
export function checkEngineFlagsApply(flags: Flags, backend: string, why: string): void {
  if (backend !== "reference") return;
  const given = ENGINE_ONLY.filter((f) => flags[f] !== undefined).map((f) => `--${f}`);
  if (given.length)
    throw new UsageError(`${given.join(", ")}: ${given.length > 1 ? "these apply" : "applies"} to the engine (--backend cpu, metal or cuda), and this run uses the reference backend (${why}), which has no expert pool`);
}

/** The engine's options from --pool, --pool-slots, --backing, --io, --pool-policy, --no-lookahead, --preload / --no-preload, --trace, --ctx-size. */
export function engineFlags(flags: Flags): EngineOptions {
  const engine: EngineOptions = {};
  const pool = stringFlag(flags, "pool");
  if (pool !== undefined && flags["pool-slots"] !== undefined) throw new UsageError("give at most one of --pool and --pool-slots");
  if (pool !== undefined) {
    try {
      const size = parsePoolSize(pool);
      if (size.poolFraction !== undefined) engine.pool = size.poolFraction;
      else engine.poolBytes = size.poolBytes;
    } catch (e) {
      throw new UsageError((e as Error).message);
    }
  }
  if (flags["pool-slots"] !== undefined) engine.poolSlots = intFlag(flags, "pool-slots", 0, 1);
  if (flags.backing !== undefined) engine.backing = choiceFlag(flags, "backing", ["wired", "mapped"] as const, "wired");
  if (flags.io !== undefined) engine.ioMode = ioFlag(flags);
  if (flags["pool-policy"] !== undefined) engine.poolPolicy = choiceFlag(flags, "pool-policy", POOL_POLICIES, DEFAULT_POOL_POLICY);
  if (flags["no-lookahead"]) engine.lookahead = false;
  if (flags.preload && flags["no-preload"]) throw new UsageError("give at most one of --preload and --no-preload");
  if (flags.preload) engine.preload = true;
  if (flags["no-preload"]) engine.preload = false;
  const ctx = ctxSizeFlag(flags);
  if (ctx !== undefined) engine.maxContext = ctx;
  const trace = stringFlag(flags, "trace");
  if (trace !== undefined) engine.trace = trace;
  return engine;
}

/**
 * Loads the model as run, chat and serve do: --backend (auto resolved first, so engine-only
 * flags on the reference are refused before loading), --prefill-chunk, the engine flags;
 * load errors the user can fix become usage errors; --verbose says which backend and why.
 */
export async function loadModelFromFlags(flags: Flags, dir: string, io: CliIO): Promise<Model> {
  const offload = Object.keys(OFFLOAD_FLAGS).filter((f) => flags[f] !== undefined);
  if (offload.length) io.stderr(`cherenkov: ${offload.map((f) => `--${f}`).join(", ")}: llama.cpp's offload and threading flags do not apply here (every layer runs on the backend's device); ignored\n`);
  const backend = backendFlag(flags);
  const chosen = backend === "auto" ? autoBackend() : null;
  checkEngineFlagsApply(flags, chosen?.backend ?? backend, chosen ? `auto's choice here: ${chosen.reason}` : "--backend reference");
  const prefillChunk = intFlag(flags, "prefill-chunk", 512, 1, 1 << 20);
  const model = await Model.load(dir, { backend, prefillChunk, engine: engineFlags(flags) }).catch((e: unknown) => {
    if (e instanceof BackendUnavailableError) throw new UsageError(`--backend: ${e.message}`);
    if (e instanceof BudgetError) throw new UsageError(`--pool: ${e.message}`);
    if (e instanceof PreloadError) throw new UsageError(`--${e.message}`);
    throw e;
  });
  if (flags.verbose) io.stderr(`cherenkov: ${model.backendName} backend${backend === "auto" ? ` (auto: ${model.backendReason ?? chosen?.reason})` : ""}\n`);
  return model;
}
