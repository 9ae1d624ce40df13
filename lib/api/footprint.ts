// What a backend will hold in host memory for a model, computed from the index before
// anything is loaded, and the budget it must fit: `auto` picks the reference only when its
// footprint fits (else the cpu engine, which streams experts), and a backend named
// explicitly that cannot fit is refused here, naming both numbers, before any allocation.
import { totalmem } from "node:os";
import { dims, type ModelConfig } from "../model/config.ts";
import { DEFAULT_EXPERT_CACHE_BYTES, type ValidManifest } from "../model/format.ts";
import { numel } from "../model/tensors.ts";
import { BudgetError, defaultHostReserveBytes, formatBytes, minPoolSlots } from "../gpu/budget.ts";
import { DEFAULT_MAX_CONTEXT } from "../gpu/load.ts";
import { scratchBytes } from "../gpu/scratch.ts";
import { sequenceStateBytes, SnapshotSet } from "../gpu/state.ts";
import type { BackendChoice } from "./auto-backend.ts";

/** Bytes by what holds them; `bytes` is their sum. */
export interface Footprint {
  bytes: number;
  parts: Record<string, number>;
}

/** The host memory a model may take, and how that number was made (for messages). */
export interface MemoryBudget {
  bytes: number;
  text: string;
}

/**
 * The cpu device's working-set limit is 75% of physical memory (metal-shim/cpu/api.cpp,
 * ck_device_open): the same share bounds the reference, so both CPU backends answer to one rule.
 */
const WORKING_SET_SHARE = 0.75;

/**
 * The budget: the working-set share of RAM less the host reserve (2 GiB + 10% of RAM, what
 * the engine's pool plan leaves to the OS, the page cache and the JS runtime: footprints
 * therefore count only what a backend holds for the model). The room to spare is the reserve
 * plus the quarter of RAM outside the working set.
 */
export function memoryBudget(totalRam: number = totalmem(), hostReserveBytes: number = defaultHostReserveBytes(totalRam)): MemoryBudget {
  const bytes = Math.max(0, Math.floor(WORKING_SET_SHARE * totalRam - hostReserveBytes));
  return {
    bytes,
    text: `${formatBytes(bytes)} (${WORKING_SET_SHARE * 100}% of ${formatBytes(totalRam)} RAM - host reserve ${formatBytes(hostReserveBytes)})`,
  };
}

/**
 * What the reference's JS adds around its arrays (the runtime, transient vectors, garbage not
 * yet collected): measured 0.31 GiB of RSS above the other parts on the 80b-a3b shape (10.86 GiB
 * max RSS, 4 + 4 tokens), rounded up. The engine's equivalent is inside the host reserve.
 */
const REFERENCE_OVERHEAD_BYTES = 512 << 20;

const sum = (parts: Record<string, number>) => Object.values(parts).reduce((a, b) => a + b, 0);

/** Bytes of one KV cache (lib/reference/kvcache.ts) holding `tokens` positions of heads x dim, at its doubled capacity. */
function kvCacheBytes(kind: "q8" | "f32", heads: number, dim: number, tokens: number): number {
  let capacity = 16;
  while (capacity < tokens) capacity *= 2;
  const w = capacity * heads * dim;
  return kind === "q8" ? w * 4 + w + capacity * heads * 4 : w * 4;
}

/** The reference's sequence state at `tokens` positions: KV and QSA key caches (DeltaNet and PLE state are small and fixed). */
function referenceCacheBytes(c: ModelConfig, tokens: number): number {
  const at = c.attention;
  const kv = 2 * kvCacheBytes(at.kv_cache, at.kv_heads, at.head_dim, tokens);
  const ik = at.qsa ? kvCacheBytes(at.kv_cache, 1, at.qsa.head_dim, tokens) : 0;
  const attentionLayers = c.layer_types.filter((t) => t === "attention").length;
  const D = dims(c);
  const fixed = c.layer_types.reduce(
    (s, t, l) =>
      s +
      (t === "deltanet" ? ((c.deltanet.conv_kernel - 1) * D.dnConvChannels + c.deltanet.value_heads * c.deltanet.key_dim * c.deltanet.value_dim) * 4 : 0) +
      (c.ple?.layers.includes(l) ? (c.ple.conv_kernel - 1) * D.pleDilation * D.d * 4 : 0),
    0,
  );
  return attentionLayers * (kv + ik) + (c.mtp ? kv : 0) + fixed;
}

export interface ReferenceFootprintOptions {
  /** Bound of the dequantized expert cache (openModel's expertCacheBytes). */
  expertCacheBytes?: number;
  /** Tokens one sequence is counted at (the reference's caches grow without a limit; default the engine's 4096). */
  tokens?: number;
}

/**
 * What the reference holds: every dense tensor and PLE table dequantized to f32 (read once,
 * kept), the expert cache at its bound, one sequence's caches, the stored bytes of the largest
 * tensor (the buffer every tensor is read through), and what its JS adds around them.
 */
export function referenceFootprint(m: ValidManifest, opts: ReferenceFootprintOptions = {}): Footprint {
  const c = m.config;
  const expertF32 = m.experts.parts.reduce((s, p) => s + numel(p.shape) * 4, 0);
  const allExperts = expertF32 * m.experts.layers * m.experts.per_layer;
  const cache = opts.expertCacheBytes ?? DEFAULT_EXPERT_CACHE_BYTES;
  const tokens = opts.tokens ?? DEFAULT_MAX_CONTEXT;
  const parts: Record<string, number> = {
    "dense weights as f32": m.tensors.reduce((s, t) => s + numel(t.shape) * 4, 0),
    "PLE tables as f32": (m.ple?.tables ?? []).reduce((s, t) => s + t.rows * c.ple!.head_dim * 4, 0),
    // The cache keeps at least the expert in use, even when one is larger than its bound.
    "expert cache": Math.min(allExperts, Math.max(cache, expertF32)),
    [`caches of one sequence at ${tokens} tokens`]: referenceCacheBytes(c, tokens),
    "largest stored tensor while decoded": Math.max(0, ...m.tensors.map((t) => t.bytes)),
    "runtime and transients": REFERENCE_OVERHEAD_BYTES,
  };
  return { bytes: sum(parts), parts };
}

export interface EngineFootprintOptions {
  maxContext?: number;
}

/**
 * The least the cpu engine can run with (lib/gpu/load.ts allocates these): dense.bin and
 * ple.bin as read, the scratch of a one-row step, one sequence, the rollback planes, and a
 * pool holding one token's experts of one layer. A larger pool is the budget's to give.
 */
export function engineMinimumFootprint(m: ValidManifest, opts: EngineFootprintOptions = {}): Footprint {
  const c = m.config;
  const maxContext = opts.maxContext ?? DEFAULT_MAX_CONTEXT;
  const fileEnd = (blocks: { offset: number; bytes: number }[]) => Math.max(0, ...blocks.map((b) => b.offset + b.bytes));
  const parts: Record<string, number> = {
    "dense.bin": fileEnd(m.tensors),
    "ple.bin": fileEnd(m.ple?.tables ?? []),
    scratch: scratchBytes(c, { rows: 1, maxContext }),
    [`one sequence at ${maxContext} tokens`]: sequenceStateBytes(c, maxContext),
    "rollback planes": c.mtp ? SnapshotSet.bytes(c) : 0,
    "smallest expert pool": minPoolSlots(c.moe.top_k, m.experts.per_layer, 1) * m.experts.stride,
  };
  return { bytes: sum(parts), parts };
}

/**
 * A backend cannot hold the model in the memory budget. Carries both numbers. A BudgetError
 * (the engine's own pool plan fails the same way, later), so one catch serves both.
 */
export class FootprintError extends BudgetError {
  override name = "FootprintError";
  constructor(
    message: string,
    readonly backend: string,
    readonly footprintBytes: number,
    readonly budgetBytes: number,
  ) {
    super(message, 0, 0, 0);
  }
}

const describe = (f: Footprint) =>
  Object.entries(f.parts)
    .filter(([, b]) => b > 0)
    .map(([k, b]) => `${k} ${formatBytes(b)}`)
    .join(" + ");

/** Throws a FootprintError unless `footprint` fits `budget`; `instead` says what to run. */
export function checkFits(backend: string, model: string, footprint: Footprint, budget: MemoryBudget, instead: string): void {
  if (footprint.bytes <= budget.bytes) return;
  throw new FootprintError(
    `backend "${backend}" needs about ${formatBytes(footprint.bytes)} for ${model} (${describe(footprint)}), ` +
      `more than the memory budget of ${budget.text}. ${instead}`,
    backend,
    footprint.bytes,
    budget.bytes,
  );
}

/** What `auto` runs on a machine without a GPU backend: the reference when it fits, else the cpu engine. */
export function referenceOrStreaming(m: ValidManifest, budget: MemoryBudget, platform: string): Omit<BackendChoice, "passedOver"> {
  const f = referenceFootprint(m);
  if (f.bytes <= budget.bytes)
    return {
      backend: "reference",
      reason: `no GPU backend on ${platform}: the reference decodes faster than the emulated cpu engine, and its ${formatBytes(f.bytes)} fit the budget of ${formatBytes(budget.bytes)}`,
    };
  return {
    backend: "cpu",
    reason: `no GPU backend on ${platform}: the reference would need ${formatBytes(f.bytes)}, more than the budget of ${formatBytes(budget.bytes)}; the cpu engine streams the experts`,
  };
}
