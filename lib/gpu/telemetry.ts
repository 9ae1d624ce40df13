/**
 * The engine's `stats()` object: one JSON-serialisable snapshot of the expert pool, the IO
 * scheduler, the lookahead, routed-expert activity, memory and per-phase timings.
 *
 * The parts are owned by their modules (residency, streaming, activity, memory); this file
 * defines the shapes, a latency histogram, a phase timer the GPU step fills, and
 * {@link StatsCollector}, which reads every part at once.
 *
 * Everything returned by {@link StatsCollector.stats} is plain data (numbers, strings,
 * arrays, objects): `JSON.stringify` round-trips it exactly.
 */
import type { ResidentStats } from "./resident.ts";
import type { ActivitySnapshot, ExpertActivity } from "./activity.ts";
import type { MemoryStats, MemoryTracker } from "./memory.ts";

/** Percentiles and moments of a latency distribution, in microseconds. */
export interface LatencySummary {
  count: number;
  meanUs: number;
  minUs: number;
  maxUs: number;
  /** Upper edge of the histogram bucket holding the median (at most 9% above the true value). */
  p50Us: number;
  p90Us: number;
  p99Us: number;
}

// Log-scale buckets: 8 per power of two from 1 us, so a percentile is within 2^(1/8) (9%).
const SUB_BUCKETS = 8;
const OCTAVES = 40; // 1 us .. 2^40 us (12 days): nothing real lands past it

/**
 * A latency histogram in bounded memory: log-scale buckets (8 per octave) plus exact
 * count, sum, min and max. Percentiles are the upper edge of their bucket.
 */
export class LatencyHistogram {
  private readonly buckets = new Float64Array(SUB_BUCKETS * OCTAVES + 1);
  private count = 0;
  private sum = 0;
  private min = Infinity;
  private max = 0;

  /** Records one sample, in milliseconds (as performance.now() differences are). */
  addMs(ms: number): void {
    const us = Math.max(0, ms * 1000);
    this.count++;
    this.sum += us;
    if (us < this.min) this.min = us;
    if (us > this.max) this.max = us;
    this.buckets[LatencyHistogram.bucketOf(us)]!++;
  }

  private static bucketOf(us: number): number {
    if (us <= 1) return 0;
    const i = Math.ceil(Math.log2(us) * SUB_BUCKETS);
    return Math.min(i, SUB_BUCKETS * OCTAVES);
  }

  private static upperEdge(bucket: number): number {
    return 2 ** (bucket / SUB_BUCKETS);
  }

  /** The value below which a fraction `q` (0..1) of the samples lie; 0 with no samples. */
  quantileUs(q: number): number {
    if (this.count === 0) return 0;
    const rank = Math.max(1, Math.ceil(q * this.count));
    let seen = 0;
    for (let i = 0; i < this.buckets.length; i++) {
      seen += this.buckets[i]!;
      if (seen >= rank) return Math.min(LatencyHistogram.upperEdge(i), this.max);
    }
    return this.max;
  }

  summary(): LatencySummary {
    const round = (x: number) => Math.round(x * 10) / 10;
    return {
      count: this.count,
      meanUs: this.count ? round(this.sum / this.count) : 0,
      minUs: this.count ? round(this.min) : 0,
      maxUs: round(this.max),
      p50Us: round(this.quantileUs(0.5)),
      p90Us: round(this.quantileUs(0.9)),
      p99Us: round(this.quantileUs(0.99)),
    };
  }

  reset(): void {
    this.buckets.fill(0);
    this.count = 0;
    this.sum = 0;
    this.min = Infinity;
    this.max = 0;
  }
}

/** Expert-pool counters (residency.ts). Hit rate = hits / (hits + misses) over acquired experts. */
export interface PoolStats {
  backing: "wired" | "mapped";
  /** Records the LRU may hold at once. */
  capacity: number;
  /** Records currently held (or being read). */
  resident: number;
  /** All expert records of the model. */
  records: number;
  recordBytes: number;
  /** Acquired experts already resident (or already being read). */
  hits: number;
  /** Acquired experts that needed a read. */
  misses: number;
  /** Of the hits, those whose read had not finished yet (the step still waited). */
  hitsWhileLoading: number;
  /** Records pushed out of the pool to make room. */
  evictions: number;
  hitRate: number;
  /** Per expert layer: hits and misses. */
  perLayer: { hits: number[]; misses: number[] };
}

/** What became of the lookahead's predictions (prefetch() reads). */
export interface LookaheadStats {
  /** Records prefetched (a read was issued for each). */
  predictions: number;
  /** Prefetched records a later acquire() used. */
  used: number;
  /** Prefetched records evicted unused after their read was issued. */
  wasted: number;
  wastedBytes: number;
  /** Prefetch reads cancelled while still queued (no bytes read). */
  cancelled: number;
  /** Predicted records already resident: no read needed. */
  alreadyResident: number;
  /** Predicted records not prefetched because every slot was pinned. */
  skipped: number;
  /** used / predictions (0 when nothing was predicted). */
  accuracy: number;
}

/** IO scheduler counters (streaming.ts). Requested bytes count at submission. */
export interface IoStats {
  /** How reads bypass the page cache: "O_DIRECT", "F_NOCACHE", or "cached". */
  mode: string;
  /** Why a file fell back to cached reads, if one did. */
  fallbackReason: string | null;
  maxInFlight: number;
  /** Threads of Bun's file IO pool (UV_THREADPOOL_SIZE, else about the core count). */
  threadPool: number;
  requestedBytes: number;
  completedBytes: number;
  /** Reads completed. */
  reads: number;
  failed: number;
  cancelled: number;
  cancelledBytes: number;
  inFlight: number;
  queued: number;
  /** requestedBytes per priority class. */
  requestedByPriority: { demand: number; lookahead: number; ngram: number };
  /** Submission to completion (queueing included). */
  latency: LatencySummary;
  /** Start of the read to completion. */
  service: LatencySummary;
}

/** Accumulated timings of one named phase (e.g. "router", "experts", "io-wait"). */
export interface PhaseEntry {
  count: number;
  totalMs: number;
  meanMs: number;
  maxMs: number;
}

/** Per-phase timings the GPU step fills (GPU timestamps or host clocks), keyed by phase name. */
export type PhaseStats = Record<string, PhaseEntry>;

/** Accumulates per-phase timings. The GPU step calls add() once per phase occurrence. */
export class PhaseTimer {
  private readonly phases = new Map<string, { count: number; totalMs: number; maxMs: number }>();

  add(phase: string, ms: number): void {
    let p = this.phases.get(phase);
    if (!p) this.phases.set(phase, (p = { count: 0, totalMs: 0, maxMs: 0 }));
    p.count++;
    p.totalMs += ms;
    if (ms > p.maxMs) p.maxMs = ms;
  }

  /** Times `fn` (sync) under `phase`. */
  time<T>(phase: string, fn: () => T): T {
    const t0 = performance.now();
    try {
      return fn();
    } finally {
      this.add(phase, performance.now() - t0);
    }
  }

  snapshot(): PhaseStats {
    const out: PhaseStats = {};
    for (const [name, p] of this.phases) out[name] = { count: p.count, totalMs: p.totalMs, meanMs: p.totalMs / p.count, maxMs: p.maxMs };
    return out;
  }

  reset(): void {
    this.phases.clear();
  }
}

/** The stats() object of a loaded model. */
export interface EngineStats {
  pool: PoolStats;
  io: IoStats | null;
  lookahead: LookaheadStats;
  activity: ActivitySnapshot;
  memory: MemoryStats;
  phases: PhaseStats;
}

/** Handshake latency (host wait for a GPU stop at an expert layer): all layers and per expert layer. */
export interface HandshakeSummary {
  all: LatencySummary;
  perLayer: LatencySummary[];
}

/** How the loaded engine was set up (sizes the load chose and why). */
export interface EngineSetup {
  /** The metal-shim device's name. */
  device: string;
  /** Rows of the largest step. */
  rows: number;
  /** Rows per prefill step. */
  prefillRows: number;
  /** Drafts a verify step may carry (0 without MTP). */
  maxDrafts: number;
  maxContext: number;
  /** Trunk blocks run (CHERENKOV_LAYERS). */
  layersRun: number;
  lookahead: boolean;
  /** Why rows, drafts or layers are what they are, in words. */
  notes: string[];
  /** Sequences open now. */
  sequences: number;
  /** The routing trace being written, or null. */
  trace: { path: string; steps: number } | null;
}

/** Everything a loaded engine reports: the collector's parts plus handshakes, resident layers and setup. */
export interface LoadedEngineStats extends EngineStats {
  handshake: HandshakeSummary;
  /** The preload and the layers whose sites run without a handshake (lib/gpu/resident.ts). */
  resident: ResidentStats;
  setup: EngineSetup;
}

/** Anything that reports pool and lookahead counters (an ExpertPool). */
export interface PoolStatsSource {
  poolStats(): PoolStats;
  lookaheadStats(): LookaheadStats;
}

/** Anything that reports IO counters (an IoScheduler). */
export interface IoStatsSource {
  stats(): IoStats;
}

/**
 * Reads every part of the engine's telemetry into one {@link EngineStats}. The GPU step
 * owns one collector per loaded model and fills `phases` as it runs.
 */
export class StatsCollector {
  readonly phases = new PhaseTimer();
  constructor(
    private readonly parts: {
      pool: PoolStatsSource;
      /** Null for the mapped backing (no explicit reads). */
      io: IoStatsSource | null;
      activity: ExpertActivity;
      memory: MemoryTracker;
    },
  ) {}

  stats(): EngineStats {
    return {
      pool: this.parts.pool.poolStats(),
      io: this.parts.io?.stats() ?? null,
      lookahead: this.parts.pool.lookaheadStats(),
      activity: this.parts.activity.snapshot(),
      memory: this.parts.memory.snapshot(),
      phases: this.phases.snapshot(),
    };
  }
}
