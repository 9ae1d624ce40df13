// Loading a model onto the device (the seed's "load"): open the device, read dense.bin and
// ple.bin into device buffers (verifying every tensor's checksum), look every pipeline up, size the expert
// pool (budget.ts), allocate the pool, the step scratch, the rollback planes and the event,
// and the telemetry. Everything the step needs afterwards is in the returned EngineGpu.
import type { DType, ModelConfig } from "../model/config.ts";
import { dims } from "../model/config.ts";
import type { ModelFiles } from "../model/format.ts";
import { Device, type Backend, type Buffer, type Event } from "../shim.ts";
import { ExpertActivity } from "./activity.ts";
import { checkMappedFits, defaultHostReserveBytes, planPool, type PoolBudgetInput, type PoolPlan } from "./budget.ts";
import type { ExpertPool as KernelPool } from "./experts.ts";
import type { HcConfig } from "./hyperconnection.ts";
import { MAX_NB, MAX_SNAP, waitModeFor, watchdogTimeoutMs } from "./limits.ts";
import { MemoryTracker } from "./memory.ts";
import { HandshakeStats } from "./phases.ts";
import { modelRefs, type ModelRefs } from "./refs.ts";
import { checkPreload, ResidentLayers, type PreloadOption } from "./resident.ts";
import { createExpertPool, DEFAULT_POOL_POLICY, POOL_POLICIES, type Backing, type ExpertPool, type PoolPolicy } from "./residency.ts";
import { allocateScratch, scratchBytes, type Scratch } from "./scratch.ts";
import { sequenceStateBytes, SnapshotSet } from "./state.ts";
import { IoScheduler, type IoSchedulerOptions } from "./streaming.ts";
import { StatsCollector } from "./telemetry.ts";

/** Engine options (Model.load's `engine`). Every field is optional. */
export interface EngineOptions {
  /** Pool size as the CLI's --pool takes it: a share of all expert records ("50%") or bytes ("8GiB"); or a fraction in (0, 1]. */
  pool?: string | number;
  /** Pool size in expert records (--pool-slots). */
  poolSlots?: number;
  /** Pool size in bytes. */
  poolBytes?: number;
  /**
   * "wired" (default: slots filled by reads) or "mapped" (views of the mapped experts.bin; only
   * where the whole file fits the device's working set, else a BudgetError: Metal makes a
   * wrapped buffer resident as a whole).
   */
  backing?: Backing;
  /**
   * How the wired pool reads records (--io): "direct" (default: uncached, O_DIRECT / F_NOCACHE)
   * or "cached" (through the page cache, which then keeps hot records the pool evicted; can win
   * when wired memory leaves the cache room). Ignored by the mapped backing.
   */
  ioMode?: IoMode;
  /**
   * Expert-pool eviction (--pool-policy): "reuse" (default: the victim is the record expected
   * back farthest away, from its layer's place in the cycle and its recent use rate),
   * "layer-cyclic" (in the layer whose next visit is farthest away) or "lru".
   */
  poolPolicy?: PoolPolicy;
  /** Run the next layer's router early and prefetch its predicted experts (default true). */
  lookahead?: boolean;
  /**
   * Read every expert record of the layers run into the pool at load (--preload /
   * --no-preload): "auto" (default) when the pool holds them all, true to require it (an
   * error when the pool is smaller), false never. Held resident, their MoE sites then run
   * without host handshakes (docs/engine.md "Resident layers").
   */
  preload?: PreloadOption;
  /** Tokens a sequence may hold (default 4096): KV caches and the QSA scratch are sized for it. */
  maxContext?: number;
  /** Rows per prefill step (default: Model.load's prefillChunk, else 512; at most MAX_NB). */
  prefillChunk?: number;
  /** Bytes the budget leaves to the host (default 2 GiB + 10% of RAM). */
  hostReserveBytes?: number;
  /** How long the GPU may wait for a slot table before its step fails (default 10 s). */
  waitTimeoutMs?: number;
  /** Run only the first N trunk blocks (bisecting; also CHERENKOV_LAYERS=N). */
  layers?: number;
  /** Append every trunk step's routing (tokens, expert ids, weights, misses) to this file (JSON lines). */
  trace?: string;
  /**
   * No effect (kept for compatibility): dense.bin and ple.bin are now read into device memory
   * and verified at load, which leaves no page to fault in later.
   */
  prefault?: boolean;
  /** @internal IO scheduler options (tests inject readers that fail or stall). */
  io?: IoSchedulerOptions;
}

export const DEFAULT_MAX_CONTEXT = 4096;

export type IoMode = "direct" | "cached";
export const IO_MODES: readonly IoMode[] = ["direct", "cached"];
export const DEFAULT_PREFILL_CHUNK = 512;
const DEFAULT_WAIT_TIMEOUT_MS = 10_000;

/** Everything a loaded model keeps on (or for) the device. */
export interface EngineGpu {
  readonly device: Device;
  readonly config: ModelConfig;
  readonly files: ModelFiles;
  readonly refs: ModelRefs;
  readonly dense: Buffer;
  readonly ple: Buffer | null;
  readonly scratch: Scratch;
  readonly hc: HcConfig;
  readonly pool: ExpertPool;
  /** Layers held resident (no handshake at their sites) and the preload. */
  readonly resident: ResidentLayers;
  /** The pool as the expert kernels bind it. */
  readonly kernelPool: KernelPool;
  readonly expertDType: DType;
  readonly scheduler: IoScheduler | null;
  readonly snapshots: SnapshotSet | null;
  readonly event: Event;
  readonly plan: PoolPlan;
  /** Rows of the largest step (scratch size): min(prefill chunk, MAX_NB, what the pool holds). */
  readonly rows: number;
  /** Rows per prefill step: min(prefill chunk, rows). */
  readonly prefillRows: number;
  /** Drafts a verify step may carry (0 without MTP). */
  readonly maxDrafts: number;
  readonly maxContext: number;
  /** Trunk blocks run (CHERENKOV_LAYERS). */
  readonly layersRun: number;
  readonly lookahead: boolean;
  /** Why rows, drafts or layers are what they are, in words (stats, --stats). */
  readonly notes: string[];
  readonly activity: ExpertActivity;
  readonly memory: MemoryTracker;
  readonly stats: StatsCollector;
  readonly handshakes: HandshakeStats;
  close(): Promise<void>;
}

export type LoadProgress = (done: number, total: number) => void;

const positiveInt = (v: unknown, name: string): number => {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 1) throw new Error(`engine option ${name}: ${String(v)} must be a positive integer`);
  return v;
};

/** The pool-size override of the options (at most one of pool, poolSlots, poolBytes). */
function poolOverride(o: EngineOptions): Pick<PoolBudgetInput, "poolBytes" | "poolSlots" | "poolFraction"> {
  const given = [o.pool, o.poolSlots, o.poolBytes].filter((x) => x !== undefined).length;
  if (given > 1) throw new Error("engine options: give at most one of pool, poolSlots, poolBytes");
  if (o.poolSlots !== undefined) return { poolSlots: positiveInt(o.poolSlots, "poolSlots") };
  if (o.poolBytes !== undefined) return { poolBytes: positiveInt(o.poolBytes, "poolBytes") };
  if (o.pool === undefined) return {};
  if (typeof o.pool === "number") {
    if (!(o.pool > 0 && o.pool <= 1)) throw new Error(`engine option pool: ${o.pool} must be a fraction in (0, 1] (or a string such as "50%")`);
    return { poolFraction: o.pool };
  }
  const t = o.pool.trim();
  const pct = /^(\d+(?:\.\d+)?)\s*%$/.exec(t);
  if (pct) {
    const f = Number(pct[1]) / 100;
    if (!(f > 0 && f <= 1)) throw new Error(`engine option pool: ${o.pool}: a percentage must be in (0, 100]`);
    return { poolFraction: f };
  }
  const m = /^(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB)?$/i.exec(t);
  if (!m) throw new Error(`engine option pool: ${JSON.stringify(o.pool)}: expected "50%" or a size such as "8GiB"`);
  const units: Record<string, number> = { b: 1, kb: 1e3, kib: 1024, mb: 1e6, mib: 1024 ** 2, gb: 1e9, gib: 1024 ** 3 };
  return { poolBytes: Math.floor(Number(m[1]) * units[(m[2] ?? "b").toLowerCase()]!) };
}

/** CHERENKOV_LAYERS=N (or options.layers): trunk blocks to run. */
/**
 * Largest pool buffer: all `records` in one when the device allows it, else as many whole
 * records as its largest buffer holds (slots never straddle buffers).
 */
export function poolBufferBytes(stride: number, records: number, maxBufferLength: number): number {
  const all = Math.max(records, 1) * stride;
  if (all <= maxBufferLength) return all;
  if (stride > maxBufferLength) throw new Error(`expert pool: one record is ${stride} bytes, more than this device's largest buffer (${maxBufferLength} bytes)`);
  return Math.floor(maxBufferLength / stride) * stride;
}

function layersToRun(c: ModelConfig, o: EngineOptions): number {
  const env = process.env.CHERENKOV_LAYERS;
  const asked = o.layers ?? (env !== undefined && env !== "" ? Number(env) : c.num_layers);
  if (!Number.isInteger(asked) || asked < 1) throw new Error(`CHERENKOV_LAYERS / engine option layers: ${String(asked)} must be a positive integer`);
  return Math.min(asked, c.num_layers);
}

/**
 * A device buffer for a held model file (its size as opened). dense.bin and ple.bin are read
 * into device memory rather than mapped: a file truncated in place later cannot take the
 * process down with SIGBUS, a rewrite cannot change the weights under a running model, and
 * every tensor's checksum is checked as it lands (the load reads these bytes anyway).
 */
function fileBuffer(device: Device, files: ModelFiles, file: "dense" | "ple"): { buffer: Buffer; bytes: number } | null {
  const id = files.fileIdentity(file);
  if (!id) return null;
  // "device" storage: a discrete GPU (cuda) keeps the weights in its own memory (uploaded after
  // the read); with unified memory it is a plain shared buffer.
  return { buffer: device.buffer(Math.max(id.size, 1), "device"), bytes: id.size };
}

/** Reads (and verifies) a held file into its buffer in chunks, yielding to the event loop between them. */
async function fill(buffer: Buffer, read: (into: Uint8Array, onBytes: (n: number) => void) => void, onChunk: (bytes: number) => void): Promise<void> {
  read(buffer.bytes, onChunk);
  // Device storage (cuda): the bytes went to the host mirror; copy them to GPU memory once.
  buffer.upload();
  await new Promise((r) => setImmediate(r));
}

/** What planPool needs of a model and a device's memory: the pool must hold one row's top-k. */
function poolInputs(deviceMaxWorkingSet: number, memory: MemoryTracker, files: ModelFiles) {
  const x = files.expertLayout;
  return {
    deviceMaxWorkingSet,
    fixedBytes: memory.fixedBytes,
    hostReserveBytes: memory.hostReserveBytes,
    recordStride: x.stride,
    expertLayers: x.layers,
    perLayer: x.perLayer,
    topK: files.config.moe.top_k,
    maxRows: 1,
  };
}

/**
 * The pool loadEngine plans for `files` with the default budget on a device of this working set
 * (the same fixed buffers: dense.bin, ple.bin, the scratch of a full prefill chunk, one sequence,
 * the rollback planes), and how many buffers it takes under the device's largest buffer.
 * For `cherenkov doctor`, which plans without loading; throws loadEngine's BudgetError.
 */
export function defaultPoolPlan(files: ModelFiles, limits: { maxWorkingSet: number; maxBufferLength: number }, opts: Pick<EngineOptions, "hostReserveBytes" | "maxContext" | "prefillChunk"> = {}) {
  const c = files.config;
  const x = files.expertLayout;
  const maxContext = opts.maxContext ?? DEFAULT_MAX_CONTEXT;
  const rows = Math.max(Math.min(opts.prefillChunk ?? DEFAULT_PREFILL_CHUNK, MAX_NB), 1 + Math.min(c.mtp?.max_drafts ?? 0, MAX_SNAP));
  const memory = new MemoryTracker(limits.maxWorkingSet, opts.hostReserveBytes ?? defaultHostReserveBytes());
  memory.addFixed("dense.bin", files.fileIdentity("dense")?.size ?? 0);
  memory.addFixed("ple.bin", files.fileIdentity("ple")?.size ?? 0);
  memory.addFixed("scratch", scratchBytes(c, { rows, maxContext }));
  memory.addFixed("sequence (one)", sequenceStateBytes(c, maxContext));
  if (c.mtp) memory.addFixed("rollback planes", SnapshotSet.bytes(c));
  const plan = planPool(poolInputs(limits.maxWorkingSet, memory, files));
  const perBuffer = poolBufferBytes(x.stride, plan.slots, limits.maxBufferLength) / x.stride;
  return { plan, fixedBytes: memory.fixedBytes, hostReserveBytes: memory.hostReserveBytes, buffers: Math.ceil(plan.slots / perBuffer) };
}

/** Loads `files` onto a device of `backend`. */
export async function loadEngine(files: ModelFiles, backend: Backend, opts: EngineOptions = {}, onProgress?: LoadProgress): Promise<EngineGpu> {
  const c = files.config;
  const D = dims(c);
  const x = files.expertLayout;
  const backing = opts.backing ?? "wired";
  if (backing !== "wired" && backing !== "mapped") throw new Error(`engine option backing: ${JSON.stringify(backing)} must be "wired" or "mapped"`);
  const ioMode = opts.ioMode ?? "direct";
  if (!IO_MODES.includes(ioMode)) throw new Error(`engine option ioMode: ${JSON.stringify(ioMode)} must be "direct" or "cached"`);
  const poolPolicy = opts.poolPolicy ?? DEFAULT_POOL_POLICY;
  if (!POOL_POLICIES.includes(poolPolicy)) throw new Error(`engine option poolPolicy: ${JSON.stringify(poolPolicy)} must be ${POOL_POLICIES.map((p) => JSON.stringify(p)).join(" or ")}`);
  const maxContext = opts.maxContext === undefined ? DEFAULT_MAX_CONTEXT : positiveInt(opts.maxContext, "maxContext");
  const chunk = opts.prefillChunk === undefined ? DEFAULT_PREFILL_CHUNK : positiveInt(opts.prefillChunk, "prefillChunk");
  const waitTimeoutMs = opts.waitTimeoutMs === undefined ? DEFAULT_WAIT_TIMEOUT_MS : positiveInt(opts.waitTimeoutMs, "waitTimeoutMs");
  const layersRun = layersToRun(c, opts);
  const preload = checkPreload(opts.preload);
  const notes: string[] = [];
  const parts = x.parts;
  const expertDType = parts[0]!.dtype;
  if (parts.some((p) => p.dtype !== expertDType)) throw new Error(`experts.bin: record parts have mixed dtypes (${parts.map((p) => p.dtype).join(", ")})`);

  const device = Device.open({ backend });
  const owned: { release(): void }[] = [];
  /** A failed preload closes the whole EngineGpu (pool, scheduler, buffers, device) itself. */
  let closedByGpu = false;
  try {
    const dense = fileBuffer(device, files, "dense")!;
    owned.push(dense.buffer);
    const ple = files.paths.ple ? fileBuffer(device, files, "ple") : null;
    if (ple) owned.push(ple.buffer);
    const refs = modelRefs(files, dense.buffer, ple?.buffer ?? null);

    // Rows of the largest step: a prefill chunk, and at least a verify batch.
    const wantDrafts = Math.min(c.mtp?.max_drafts ?? 0, MAX_SNAP);
    let rows = Math.max(Math.min(chunk, MAX_NB), 1 + wantDrafts);
    if (chunk > MAX_NB) notes.push(`prefill chunk ${chunk} capped at MAX_NB = ${MAX_NB} rows per step`);

    const memory = new MemoryTracker(device.limits.maxWorkingSet, opts.hostReserveBytes ?? defaultHostReserveBytes());
    memory.addFixed("dense.bin", dense.bytes);
    if (ple) memory.addFixed("ple.bin", ple.bytes);
    memory.addFixed("scratch", scratchBytes(c, { rows, maxContext }));
    const expertsBytes = x.stride * x.layers * x.perLayer;
    if (backing === "mapped")
      checkMappedFits({ deviceMaxWorkingSet: device.limits.maxWorkingSet, fixedBytes: memory.fixedBytes, hostReserveBytes: memory.hostReserveBytes, fileBytes: expertsBytes });
    memory.addFixed("sequence (one)", sequenceStateBytes(c, maxContext));
    if (c.mtp) memory.addFixed("rollback planes", SnapshotSet.bytes(c));

    // The pool must hold one row's top-k (a decode step); longer steps are cut to what it holds.
    const plan = planPool({ ...poolInputs(device.limits.maxWorkingSet, memory, files), ...poolOverride(opts) });
    if (plan.slots < x.perLayer) {
      const fit = Math.max(1, Math.floor(plan.slots / c.moe.top_k));
      if (fit < rows) {
        notes.push(`steps limited to ${fit} rows: a pool of ${plan.slots} slots holds the top-${c.moe.top_k} experts of ${fit} rows of one layer`);
        rows = fit;
      }
    }
    // Under an OS limit on GPU event waits, a pool that can miss waits on the host (the GPU
    // never blocks); otherwise the watchdog stays below the limit, so the engine's message is
    // what a user sees (docs/metal.md "Long GPU waits").
    const limit = device.limits.gpuWaitLimitMs;
    device.waitMode = waitModeFor(limit, plan.slots, x.layers * x.perLayer);
    const watchdogMs = device.waitMode === "host" ? waitTimeoutMs : watchdogTimeoutMs(waitTimeoutMs, limit);
    if (device.waitMode === "host") notes.push(`handshakes wait on the host: the OS ends GPU event waits after ${limit} ms and the pool can miss`);
    if (watchdogMs !== waitTimeoutMs) notes.push(`GPU wait watchdog ${watchdogMs} ms (asked ${waitTimeoutMs}): the OS ends GPU event waits after ${limit} ms`);
    device.setWaitTimeout(watchdogMs);
    const maxDrafts = Math.min(wantDrafts, rows - 1);
    if (c.mtp && maxDrafts < c.mtp.max_drafts) notes.push(`drafts per step limited to ${maxDrafts} (mtp.max_drafts ${c.mtp.max_drafts}, ${rows} rows per step, MAX_SNAP ${MAX_SNAP})`);
    if (layersRun < c.num_layers) notes.push(`CHERENKOV_LAYERS: running the first ${layersRun} of ${c.num_layers} blocks`);
    memory.addFixed("scratch", scratchBytes(c, { rows, maxContext }));

    const total = dense.bytes + (ple?.bytes ?? 0) + plan.bytes;
    let done = 0;
    const progress = (bytes: number) => {
      done += bytes;
      onProgress?.(Math.min(done, total), total);
    };
    await fill(dense.buffer, (into, onBytes) => files.readDenseInto(into, onBytes), progress);
    if (ple) await fill(ple.buffer, (into, onBytes) => files.readPleInto(into, onBytes), progress);

    // The library is compiled here (once per process on Metal: metal-shim caches it);
    // pipelines are built on first use, so the self-test and unused kernels never are.
    device.library();

    // The io mode is the scheduler's default for files it opens (the pool's experts.bin).
    const scheduler = backing === "wired" ? new IoScheduler({ uncached: ioMode === "direct", ...opts.io }) : null;
    const pool = createExpertPool({
      backing,
      model: files,
      capacity: plan.slots,
      policy: poolPolicy,
      // The layout's last expert layer is the MTP head (num_layers + 1 expert layers).
      mtp: x.layers === c.num_layers + 1,
      device,
      scheduler: scheduler ?? undefined,
      // A late read is named (file, layer, expert) before the GPU's wait for it times out.
      ioDeadlineMs: ioDeadline(watchdogMs),
      // As few buffers as the device's largest buffer allows (Metal: maxBufferLength, well
      // below the working set on Apple silicon); the expert kernels run once per buffer.
      maxBufferBytes: poolBufferBytes(x.stride, backing === "wired" ? plan.slots : x.layers * x.perLayer, device.limits.maxBufferLength),
    });
    // The expert layers steps can route to: the trunk layers run, and the MTP head's when it drafts.
    const routed = Array.from({ length: layersRun }, (_, l) => l);
    if (x.layers === c.num_layers + 1 && maxDrafts > 0) routed.push(c.num_layers);
    let resident: ResidentLayers;
    try {
      resident = new ResidentLayers(device, pool, routed, preload);
    } catch (e) {
      await pool.close();
      if (scheduler) await scheduler.close();
      throw e;
    }
    owned.push(resident);
    // With a preload the pool's share of the progress arrives record by record.
    const preloading = resident.wantsPreload;
    const preloadBytes = preloading ? routed.length * x.perLayer * x.stride : 0;
    progress(plan.bytes - preloadBytes);
    memory.setPool(plan, backing, x.stride);
    if (backing === "mapped") memory.addMapped("experts.bin", expertsBytes);
    const kernelPool: KernelPool = { buffers: pool.buffers, slotsPerBuffer: pool.slotsPerBuffer, slots: pool.slotCount, stride: x.stride, parts };
    if (pool.buffers.length > 1) notes.push(`expert pool in ${pool.buffers.length} buffers of at most ${pool.slotsPerBuffer} records (largest buffer ${device.limits.maxBufferLength} bytes)`);

    const scratch = allocateScratch(device, c, { rows, maxContext, slotTableEntries: pool.slotTableStride });
    owned.push(scratch.buffer, scratch.hostBuffer);
    const snapshots = c.mtp ? new SnapshotSet(device, c) : null;
    const event = device.event();
    const activity = new ExpertActivity(D.expertLayers, x.perLayer);
    const stats = new StatsCollector({ pool, io: scheduler, activity, memory });
    const handshakes = new HandshakeStats(D.expertLayers);
    let closed = false;
    const gpu: EngineGpu = {
      device,
      config: c,
      files,
      refs,
      dense: dense.buffer,
      ple: ple?.buffer ?? null,
      scratch,
      hc: c.hc,
      pool,
      resident,
      kernelPool,
      expertDType,
      scheduler,
      snapshots,
      event,
      plan,
      rows,
      prefillRows: Math.min(chunk, rows),
      maxDrafts,
      maxContext,
      layersRun,
      lookahead: opts.lookahead ?? true,
      notes,
      activity,
      memory,
      stats,
      handshakes,
      async close() {
        if (closed) return;
        closed = true;
        // Command buffers run in commit order: once an empty one completes, none still reads
        // the pool, whose mapped backing is unmapped by close().
        const idle = device.commandBuffer();
        try {
          idle.commit().waitUntilCompleted();
        } catch {
          // a failed step's buffer: nothing runs after it either
        } finally {
          idle.release();
        }
        await pool.close();
        if (scheduler) await scheduler.close();
        event.release();
        snapshots?.release();
        for (const b of owned) b.release();
        device.close();
      },
    };
    if (preloading) {
      try {
        await resident.preload(() => progress(x.stride));
      } catch (e) {
        closedByGpu = true;
        await gpu.close();
        throw e;
      }
    }
    return gpu;
  } catch (e) {
    if (closedByGpu) throw e;
    for (const b of owned) b.release();
    device.close();
    throw e;
  }
}

/**
 * The expert reads' deadline for a GPU wait timeout: three quarters of it. The GPU starts its
 * wait before the host starts the reads, so the reads' deadline must end sooner for the late
 * read, not the GPU's time-out, to be what a step reports.
 */
export function ioDeadline(waitTimeoutMs: number): number {
  return Math.max(1, Math.floor(waitTimeoutMs * 0.75));
}
