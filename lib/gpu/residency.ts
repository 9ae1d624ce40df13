/**
 * The expert pool: which expert records the GPU may touch, managed here (policy "reuse",
 * "layer-cyclic" or "lru", see {@link PoolPolicy}), with two backings behind one interface
 * ({@link ExpertPool}).
 *
 * - "wired": `capacity` page-aligned slots carved out of one or a few shim buffers; a miss
 *   takes a victim slot and reads the record into it with an uncached read through the
 *   {@link IoScheduler}. The slot number is an index into those slots.
 * - "mapped": experts.bin mapped (Bun.mmap) and wrapped without copying; the slot of
 *   (layer, e) is its record index `layer * perLayer + e` in that mapping and nothing is read
 *   explicitly (the OS pages it in). The same LRU runs over `capacity` virtual slots so that
 *   hits, misses and evictions are reported exactly as a wired pool of that size would see
 *   them.
 *
 * How the GPU step uses it, per layer l of a step:
 * ```ts
 * const a = pool.acquire(l, unionOfRoutedIds);     // pins l's union; misses start reading
 * pool.writeSlotTable(l, slotTable.subarray(l * stride, (l + 1) * stride));
 * pool.prefetch(l + 1, lookaheadIds);              // optional: next layer's predicted union
 * await a.ready;                                   // every record of the union is in place
 * releaseGpu(l);                                   // the GPU computes layer l's experts
 * // ... once the GPU is past layer l's expert compute (e.g. at the next layer's signal):
 * pool.release(l);
 * ```
 * Decisions (which slot, which victim) are made synchronously inside acquire/prefetch. They
 * depend on IO timing only where the policy's victim still has a read pending (it is then
 * passed over for a slot whose record is in place): with reads awaited, the same call sequence
 * gives the same slots and counters. Only a failed read changes the state asynchronously (its
 * slot becomes empty).
 */
import { ptr, toArrayBuffer, type Pointer } from "bun:ffi";
import { closeSync, fstatSync, openSync, statSync } from "node:fs";
import type { ExpertLayout } from "../model/format.ts";
import type { Buffer, Device } from "../shim.ts";
import { sharedHashWorkers, type HashWorkers } from "./hash-workers.ts";
import { IoScheduler, IoTimeoutError, type IoFile, type Priority, type ReadTicket } from "./streaming.ts";
import type { LookaheadStats, PoolStats } from "./telemetry.ts";

export type Backing = "wired" | "mapped";

/**
 * How a miss picks its victim among the unpinned slots (both backings):
 * - "lru": the least recently used record;
 * - "layer-cyclic": the record whose layer comes up farthest away in the cyclic layer order
 *   (layers are visited 0..L-1 every token), least recently used within that layer. From the
 *   layer being served l, layer m's next visit is ((m - l - 1) mod N) + 1 steps away (N
 *   layers in the cycle), so l's own unpinned records go first, then l-1's, ... and l+1's
 *   last: it approximates Belady when a layer's experts are reused on the next token, and it
 *   does not collapse when the pool is smaller than one token's working set (where LRU evicts
 *   exactly the layer needed next). See `layerCycleOrder` (below) for the MTP layer.
 * - "reuse": the record whose next use is expected farthest away: a record of layer m, used
 *   at a fraction p of m's recent visits (an exponentially decayed count, half-life
 *   `REUSE_HALF_LIFE` visits), is expected back after d + N (1 - p) / p layer visits,
 *   d = m's distance in the cyclic order (as layer-cyclic), N the cycle's length. It is
 *   Belady's rule with the future replaced by that estimate: a layer's frequent experts
 *   outlive its rare ones, and the layer order still decides among equals. A prefetched
 *   record not yet used counts with p = the lookahead's accuracy so far, and a prefetch only
 *   takes a victim expected back later than the predicted record (no wasted swap).
 *   Cost: each miss scores the `REUSE_SCAN` least recent candidates of every layer.
 */
export type PoolPolicy = "lru" | "layer-cyclic" | "reuse";
export const POOL_POLICIES: readonly PoolPolicy[] = ["lru", "layer-cyclic", "reuse"];
/** Half-life, in visits of a record's layer, of the use counts the "reuse" policy scores with (bench:pool's sweep). */
export const REUSE_HALF_LIFE = 16;
/** Candidates per layer the "reuse" policy scores per victim, from the layer's least recent end. */
export const REUSE_SCAN = 32;
/**
 * The engine's default. bench:pool (docs/performance.md): on the 64-expert top-8 traces of
 * both architectures "reuse" has the highest hit rate and the fewest reads of the three at
 * 10-75% pools, with and without lookahead; on the 16-expert ones it is at least as good.
 */
export const DEFAULT_POOL_POLICY: PoolPolicy = "reuse";

/**
 * The layer-cyclic eviction order when layer `ref` is being served: every layer, the one whose
 * next visit is farthest first (victims are taken from the first layer that has an unpinned
 * slot). Trunk layers: layer m is ((m - ref - 1) mod N) + 1 steps away, N = `layers`.
 * With `mtp`, the last expert layer is the MTP head: drafting visits it right after the last
 * trunk layer and before layer 0 of the next step, so it is the last position of the cycle
 * (N = trunk layers + 1); while the MTP layer itself is served, its own records count as the
 * nearest (the chained draft rows acquire it back to back), kept over layer 0's. Without
 * drafting the MTP layer is never acquired and holds no slot.
 */
export function layerCycleOrder(ref: number, layers: number, mtp = false): number[] {
  const order: number[] = [];
  for (let d = layers; d >= 1; d--) order.push((ref + d) % layers);
  if (mtp && ref === layers - 1) order.push(order.shift()!); // the MTP layer's own records: kept longest
  return order;
}

/** Where the expert records come from: a ModelFiles (lib/model/format.ts) satisfies it. */
export interface ExpertSource {
  readonly paths: { readonly experts: string };
  readonly expertLayout: Pick<ExpertLayout, "stride" | "layers" | "perLayer">;
  /**
   * Checks record (layer, e) as it landed in a slot (a view of slot memory, no copy); throws
   * naming file, layer and expert when it does not match its checksum. ModelFiles provides it.
   */
  verifyRecord?(layer: number, e: number, record: Uint8Array): void;
  /** Record (layer, e)'s checksum as the index has it (lets the pool hash on worker threads). */
  recordChecksum?(layer: number, e: number): string;
  /** Device and inode of experts.bin as the source holds it: the pool refuses a replaced file. */
  fileIdentity?(file: "experts"): { dev: number; ino: number } | null;
}

/** The result of {@link ExpertPool.acquire}. */
export interface Acquired {
  /** Per expert of the layer (length perLayer): its slot, or -1 if not in this union. */
  readonly slotOf: Int32Array;
  /** The union, deduplicated, in first-seen order. */
  readonly union: readonly number[];
  /** Experts of the union that were not resident (a read was issued for each, wired backing). */
  readonly misses: number;
  /** Those experts, in union order. */
  readonly missIds: readonly number[];
  /**
   * Resolves when every record of the union is in its slot. Rejects with the IoReadError of
   * a failed read (naming file, offset, layer and expert); the failed slot is left empty
   * and the pool stays usable. Always settles: nothing waits forever.
   */
  readonly ready: Promise<void>;
}

/** The result of {@link ExpertPool.prefetch}. */
export interface Prefetched {
  /** Reads issued (records that were not resident and got a slot). */
  readonly issued: number;
  /** Settles when those reads have finished; never rejects (failures are counted). */
  readonly ready: Promise<void>;
}

/**
 * The expert pool, as the GPU step sees it. Layers are expert layers (trunk layers, then the
 * MTP layer); expert ids are 0..perLayer-1.
 */
export interface ExpertPool {
  readonly backing: Backing;
  /** How victims are chosen. */
  readonly policy: PoolPolicy;
  /** Records the pool holds at once (the budget's slots). */
  readonly capacity: number;
  /** Slot numbers run 0..slotCount-1: capacity (wired) or every record (mapped). */
  readonly slotCount: number;
  readonly recordBytes: number;
  readonly layers: number;
  readonly perLayer: number;
  /**
   * Entries per layer of a slot table: perLayer slots, then the union size. A pool in B > 1
   * buffers adds, per buffer b at E + 1 + b * (2E + 1) (E = perLayer), the slot table of the
   * experts in that buffer (slot within the buffer, -1 elsewhere) and its active list (count,
   * then expert ids): the expert kernels run once per buffer over those (lib/gpu/experts.ts).
   */
  readonly slotTableStride: number;

  /**
   * Maps this step's union for `layer` to slots and pins them until {@link release}.
   * `expertIds` may hold duplicates (the router's [rows][topK] output, flattened, is fine):
   * the union is taken in first-seen order. Hits keep
   * their slot; each miss takes a free slot or an unpinned victim ({@link policy}: the least
   * recently used, or the farthest layer's least recently used) and
   * (wired) reads its record with `priority` (default "demand"). A queued lookahead read of a
   * hit is promoted; a queued lookahead read in a victim slot is cancelled.
   * Throws {@link PoolTooSmallError} if the union cannot fit beside the slots other layers
   * pin, and an Error if `layer` is already acquired or an id is out of range.
   */
  acquire(layer: number, expertIds: ArrayLike<number>, priority?: Priority): Acquired;
  /**
   * Unpins the slots of `layer` (no-op if it is not acquired). Releasing before `ready`
   * settles gives the reads up: a later acquire may take the slot, and a read of it still
   * queued is then cancelled (that `ready` rejects with IoCancelledError).
   */
  release(layer: number): void;
  /** Unpins every layer (after a failed or aborted step). */
  releaseAll(): void;
  /**
   * Drops every record (nothing may be pinned): queued reads are cancelled, slots stay
   * allocated, counters are kept (no evictions counted). For benchmarks and cache resets.
   */
  evictAll(): void;
  /**
   * Lookahead: starts reading the records of `expertIds` that are not resident, into unpinned
   * slots, without pinning (default priority "lookahead"). Each is a prediction: counted as
   * used when a later acquire hits it, as wasted (with its bytes) when evicted unused.
   * Records already resident are touched (made most recent). Best effort: skips records when
   * no unpinned slot is left.
   */
  prefetch(layer: number, expertIds: ArrayLike<number>, priority?: Priority): Prefetched;
  /**
   * Writes the acquired layer's slot table: dst[e] = slot of expert e or -1 (e < perLayer),
   * dst[perLayer] = union size. dst needs at least {@link slotTableStride} entries.
   */
  writeSlotTable(layer: number, dst: Int32Array): void;
  /** The shim buffer holding `slot` (throws for a pool made without a device). */
  slotBuffer(slot: number): Buffer;
  /** Index of that buffer in {@link buffers}. */
  slotBufferIndex(slot: number): number;
  /** Byte offset of `slot` inside its buffer. */
  slotOffset(slot: number): number;
  /** Every buffer slots live in, in index order (bind them all). Empty without a device. */
  readonly buffers: readonly Buffer[];
  /**
   * Slots per buffer: slot s lives in buffer floor(s / slotsPerBuffer) at byte offset
   * (s % slotsPerBuffer) * recordBytes (what a kernel given all buffers computes).
   */
  readonly slotsPerBuffer: number;
  /** The record bytes of `slot` (a view, no copy). */
  slotView(slot: number): Uint8Array;
  /** Whether (layer, e) is resident (or being read). */
  isResident(layer: number, e: number): boolean;
  /**
   * Whether every record of layers 0..layers-1 (default: all, the MTP layer too) sits in a
   * slot, read and checked, in a pool that holds the whole model: no acquire of those layers
   * can miss and no prefetch can help (a step then skips its lookahead routes).
   */
  fullyResident(layers?: number): boolean;
  /**
   * Reads every record of `layers` that is not resident into a free slot (demand priority,
   * in file order: sequential reads), for a pool that holds them all. Resolves once every one
   * is in place and checked; rejects with the first failure (IoReadError, a checksum
   * mismatch, or IoTimeoutError when no read finished within the IO deadline), naming the
   * file, layer and expert. Throws at once when there are not enough free slots.
   * `onRecord` is called as each record lands.
   */
  preload(layers: readonly number[], onRecord?: () => void): Promise<void>;
  /**
   * Holds every record of `layer` in its slot until {@link evictAll}: no acquire or prefetch
   * takes one of those slots as a victim, so a table of them written once stays true (the
   * resident fast path, lib/gpu/resident.ts). Returns the layer's public slots by expert, or
   * null when some record of the layer is not in place (absent, or its read not checked yet).
   */
  hold(layer: number): Int32Array | null;
  /** Whether `layer` is held (see {@link hold}). */
  isHeld(layer: number): boolean;
  /**
   * Changes whenever `layer` is held anew or loses its hold (evictAll): a slot table written
   * for another generation may be stale.
   */
  holdGeneration(layer: number): number;
  /**
   * Counts a site of a held layer served without acquire (the resident fast path): every
   * distinct id of `expertIds` is a hit.
   */
  countHits(layer: number, expertIds: ArrayLike<number>): void;
  poolStats(): PoolStats;
  /**
   * Reads issued per record (index layer * perLayer + e) since the pool was made, a copy (all
   * zero on the mapped backing): bench:prefill diffs it around a step to show how often the
   * step read each record.
   */
  recordReads(): Uint32Array;
  /** Checksum work so far: records verified, milliseconds spent hashing on the main thread, mismatches, records hashed on worker threads. */
  verifyStats(): { records: number; ms: number; failures: number; offThread: number };
  lookaheadStats(): LookaheadStats;
  /** Cancels queued reads, waits for reads in flight, frees buffers. The pool is unusable after. */
  close(): Promise<void>;
}

/** The pool cannot hold a layer's union next to the slots already pinned. */
export class PoolTooSmallError extends Error {
  override name = "PoolTooSmallError";
  constructor(
    readonly layer: number,
    readonly needed: number,
    readonly capacity: number,
    readonly pinned: number,
  ) {
    super(
      `expert pool too small: layer ${layer} routes ${needed} distinct experts this step, the pool has ${capacity} slots` +
        (pinned ? ` of which ${pinned} are pinned by other layers` : "") +
        ` (raise the pool size, or run fewer rows per step)`,
    );
  }
}

export interface ExpertPoolOptions {
  backing: Backing;
  model: ExpertSource;
  /** Records held at once, usually planPool(...).slots. At most every record. */
  capacity: number;
  /**
   * Slots become shim buffers (wired) / the mapping is wrapped (mapped). Without one: host
   * memory only (wired), or experts.bin mapped on the first slotView() (mapped: a pool used
   * only for its decisions, as in simulations, needs no file).
   */
  device?: Device;
  /** Wired: the scheduler reads go through (shared with PLE prefetch). Default: a new one the pool owns. */
  scheduler?: IoScheduler;
  /**
   * Largest single buffer (default {@link DEFAULT_MAX_BUFFER_BYTES}); slots never straddle
   * buffers. Pass the device's own limit (Metal: maxBufferLength) when it is lower. Fewer,
   * larger buffers keep the expert kernels' bindings few (Metal allows 31 per encoder).
   */
  maxBufferBytes?: number;
  /** Eviction policy (default {@link DEFAULT_POOL_POLICY}). */
  policy?: PoolPolicy;
  /** "reuse": half-life of the use counts, in visits of the record's layer (default `REUSE_HALF_LIFE`). */
  reuseHalfLife?: number;
  /**
   * Verify every record against its checksum before its slot is published (default true when
   * the model provides verifyRecord): wired, after the read lands; mapped, when a record enters
   * the virtual pool. A mismatch fails that acquire's `ready`, and the slot is emptied.
   */
  verify?: boolean;
  /**
   * Hash wired records on worker threads (default true when the model gives recordChecksum):
   * the main thread only compares; false hashes on the main thread.
   */
  hashThreads?: boolean;
  /**
   * "reuse": keep each layer's victim scan for the next victim of the same acquire or prefetch
   * while that layer's list is unchanged (default true). The choices are the same either way;
   * false rescans every layer for every victim (tests compare the two).
   */
  victimCache?: boolean;
  /**
   * Longest an acquire's reads may take before its `ready` rejects with IoTimeoutError naming
   * the file, layer and late experts (default: no deadline). The engine sets it below the GPU's
   * wait timeout, so a late read is reported as such.
   */
  ioDeadlineMs?: number;
  /**
   * The last expert layer is the MTP head (layer-cyclic and reuse: see {@link layerCycleOrder}).
   * Default false: every layer is a trunk layer of the cycle (e.g. trunk-only traces).
   */
  mtp?: boolean;
}

/** Default upper bound of one slot buffer: 4 GiB. */
export const DEFAULT_MAX_BUFFER_BYTES = 4 * 1024 ** 3;

const EMPTY = 0;
const LOADING = 1;
const READY = 2;
const RESOLVED: Promise<void> = Promise.resolve();
/** Host-memory alignment of slots: the format's record alignment (16 KiB, Apple's page). */
const SLOT_ALIGN = 16384;

/** Page-aligned host memory (no device): for simulations and tests. */
function alignedHostMemory(bytes: number): Uint8Array {
  const raw = new Uint8Array(bytes + SLOT_ALIGN);
  const skip = (SLOT_ALIGN - (Number(ptr(raw)) % SLOT_ALIGN)) % SLOT_ALIGN;
  return raw.subarray(skip, skip + bytes);
}

/** Deduplicates ids in first-seen order and checks their range (a stamp per id: no clearing, no allocation). */
class UnionBuilder {
  private readonly seen: Float64Array;
  private stamp = 0;
  constructor(private readonly perLayer: number) {
    this.seen = new Float64Array(perLayer);
  }
  of(ids: ArrayLike<number>, layer: number, what: string): number[] {
    const stamp = ++this.stamp;
    const out: number[] = [];
    for (let i = 0; i < ids.length; i++) {
      const e = ids[i]!;
      if (!(e >= 0 && e < this.perLayer && Number.isInteger(e)))
        throw new Error(`${what}: layer ${layer}: expert id ${e} is not in 0..${this.perLayer - 1}`);
      if (this.seen[e] !== stamp) {
        this.seen[e] = stamp;
        out.push(e);
      }
    }
    return out;
  }
}

/** Creates a pool of either backing. */
export function createExpertPool(opts: ExpertPoolOptions): ExpertPool {
  return new SlotExpertPool(opts);
}

/** Slots that hold data for one backing. */
interface SlotMemory {
  readonly slotCount: number;
  readonly slotsPerBuffer: number;
  readonly buffers: Buffer[];
  /** Buffer index and byte offset of a slot. */
  locate(slot: number): { buffer: number; offset: number };
  view(slot: number): Uint8Array;
  /** After the host filled view(slot): make the bytes the GPU's (device storage: an upload). */
  publish(slot: number): void;
  release(): void;
}

function wiredMemory(capacity: number, stride: number, maxBufferBytes: number, device?: Device): SlotMemory {
  const perBuffer = Math.max(1, Math.floor(maxBufferBytes / stride));
  const count = Math.ceil(capacity / perBuffer);
  const buffers: Buffer[] = [];
  const views: Uint8Array[] = [];
  // One view per slot over a device buffer, made on first use: one view of the whole pool
  // cannot be made past JavaScript's largest ArrayBuffer (a 20 GB pool is one buffer).
  const slotViews: (Uint8Array | undefined)[] = [];
  for (let b = 0; b < count; b++) {
    const bytes = Math.min(perBuffer, capacity - b * perBuffer) * stride;
    if (device) {
      // Device storage: on a discrete GPU (cuda) slots live in GPU memory and reads land in the
      // pinned host mirror, then publish() copies the record over; elsewhere one shared memory.
      buffers.push(device.buffer(bytes, "device"));
    } else {
      views.push(alignedHostMemory(bytes));
    }
  }
  return {
    slotCount: capacity,
    slotsPerBuffer: perBuffer,
    buffers,
    locate: (slot) => ({ buffer: Math.floor(slot / perBuffer), offset: (slot % perBuffer) * stride }),
    view(slot) {
      const b = Math.floor(slot / perBuffer);
      const off = (slot % perBuffer) * stride;
      if (!device) return views[b]!.subarray(off, off + stride);
      return (slotViews[slot] ??= buffers[b]!.range(off, stride));
    },
    publish(slot) {
      const b = buffers[Math.floor(slot / perBuffer)];
      if (b && b.storage === "device") b.upload((slot % perBuffer) * stride, stride);
    },
    release: () => buffers.forEach((b) => b.release()),
  };
}

/**
 * experts.bin mapped read-only and shared (PROT_READ, MAP_SHARED) through the shim's helper:
 * the page cache's own pages. A private writable mapping (what Bun.mmap makes) wrapped by Metal
 * as a read-write buffer may be given copy-on-write copies; a read-only one cannot, and a stray
 * write faults instead of changing the model.
 */
function mapReadOnly(device: Device, path: string, bytes: number): { view: Uint8Array; unmap(): void } {
  const s = device.shim.symbols;
  const fd = openSync(path, "r");
  const out = new BigUint64Array(1);
  let rc: number;
  try {
    rc = s.ck_map_readonly(fd, bytes, out);
  } finally {
    closeSync(fd); // the mapping keeps the file
  }
  if (rc !== 0) throw new Error(`${path}: cannot map ${bytes} bytes read-only: ${s.ck_io_error_text(rc)}`);
  const address = Number(out[0]) as Pointer;
  return {
    view: new Uint8Array(toArrayBuffer(address, 0, bytes)),
    unmap: () => void s.ck_unmap(address, bytes),
  };
}

function mappedMemory(path: string, records: number, stride: number, maxBufferBytes: number, device?: Device): SlotMemory {
  let map: Uint8Array | null = null;
  let unmap = () => {};
  const mapped = (): Uint8Array => {
    if (map) return map;
    const size = fstatSizeOf(path);
    if (size < records * stride) throw new Error(`${path}: ${size} bytes, the experts need ${records * stride} (${records} records of ${stride})`);
    if (device) {
      const m = mapReadOnly(device, path, records * stride);
      unmap = m.unmap;
      return (map = m.view);
    }
    // No device (simulations): a host view only, never wrapped or written.
    return (map = Bun.mmap(path, { shared: false }));
  };
  const perBuffer = Math.max(1, Math.floor(maxBufferBytes / stride));
  const buffers: Buffer[] = [];
  // With a device the mapping is made (and wrapped) now; without one, on the first slotView(),
  // so that a pool used only for its decisions (bench:pool's simulations) needs no file.
  if (device)
    for (let first = 0; first < records; first += perBuffer) {
      const n = Math.min(perBuffer, records - first);
      buffers.push(device.wrap(mapped().subarray(first * stride, (first + n) * stride)));
    }
  return {
    slotCount: records,
    slotsPerBuffer: perBuffer,
    buffers,
    locate: (slot) => ({ buffer: Math.floor(slot / perBuffer), offset: (slot % perBuffer) * stride }),
    view: (slot) => mapped().subarray(slot * stride, (slot + 1) * stride),
    publish: () => {},
    release: () => {
      buffers.forEach((b) => b.release());
      buffers.length = 0;
      map = null;
      unmap();
      unmap = () => {};
    },
  };
}

const fstatSizeOf = (path: string) => statSync(path).size;

/** Both backings and every policy: `capacity` slots managed here; the backing decides what a slot number means. */
class SlotExpertPool implements ExpertPool {
  readonly backing: Backing;
  readonly policy: PoolPolicy;
  readonly capacity: number;
  readonly slotCount: number;
  readonly recordBytes: number;
  readonly layers: number;
  readonly perLayer: number;
  readonly slotTableStride: number;
  readonly buffers: readonly Buffer[];
  readonly slotsPerBuffer: number;

  private readonly memory: SlotMemory;
  private readonly scheduler: IoScheduler | null;
  private readonly ownsScheduler: boolean;
  private readonly file: IoFile | null;
  private closed = false;

  // Per LRU slot.
  private readonly slotKey: Int32Array; // record index held, -1 when empty
  private readonly state: Uint8Array;
  private readonly pinned: Uint8Array;
  private readonly predicted: Uint8Array; // loaded by prefetch, not yet used by acquire
  private readonly stamp: Float64Array; // prefetch call that last touched the slot
  private readonly gen: Uint32Array; // bumped on every new assignment: stale completions are ignored
  private readonly tickets: (ReadTicket | null)[]; // the read of the record the slot holds now
  private readonly readies: (Promise<void> | null)[]; // settles when that read landed and was verified
  private readonly verifyRecord: ((layer: number, e: number, record: Uint8Array) => void) | null;
  private readonly recordChecksum: ((layer: number, e: number) => string) | null;
  private readonly hashers: HashWorkers | null;
  private readonly hashing = new Set<Promise<unknown>>();
  private ops: ReadTicket[][]; // every read into the slot not yet settled (pruned lazily)
  private readonly prev: Int32Array; // LRU list: head = least recent
  private readonly next: Int32Array;
  private readonly inList: Uint8Array;
  private head = -1;
  private tail = -1;
  // Per-layer LRU lists (layer-cyclic victims): the same slots, one list per layer of the record.
  private readonly lprev: Int32Array;
  private readonly lnext: Int32Array;
  private readonly slotLayer: Int32Array; // the layer list the slot is in, -1 when none
  private readonly lhead: Int32Array;
  private readonly ltail: Int32Array;
  /** Per layer being served: layers in eviction order (layer-cyclic). */
  private readonly cycleOrder: Int32Array[];
  /** cycleDist[ref][m]: layer visits from serving `ref` until m's next visit, 1..N ("reuse"). */
  private readonly cycleDist: Int32Array[];
  private readonly prevOf: Int32Array;
  // "reuse": per layer, its acquires and decay^(its acquires since the last rescale); per record,
  // its decayed use rate divided by its layer's scale when it was set (rate now = that x scale).
  private readonly visits: Float64Array;
  private readonly scale: Float64Array;
  private readonly useRate: Float64Array;
  private readonly predictedAt: Float64Array; // per slot: its layer's visit count when prefetched
  // "reuse" victim cache: per layer, the result of its last scan and the batch (one acquire's
  // misses, one prefetch's predictions) and list version it was made in. Within a batch only
  // the lists change between victims (a victim leaves one, a prefetched record joins one), and
  // the prediction rate after each prefetch, so one full scan serves the batch's first victim
  // and each later one rescans the layers whose lists changed.
  private readonly victimCache: boolean;
  private readonly lver: Uint32Array; // per layer: bumped when a slot joins or leaves its list
  private batch = 0; // the current batch (0: none)
  private batches = 0;
  private readonly vc: {
    batch: Float64Array;
    ver: Uint32Array;
    best: Int32Array;
    score: Float64Array;
    queued: Int32Array;
    busy: Int32Array;
    predRate: Float64Array; // the prediction rate its scores used; NaN: none used it
  };
  private readonly decay: number;
  private readonly free: number[] = []; // stack, lowest slot on top
  // Per record.
  private readonly keySlot: Int32Array;
  private readonly readsStarted: Uint32Array; // reads issued for the record (recordReads)
  /** Layers 0..fullLayers-1 were found fully resident and no slot has emptied since (fullyResident skips them). */
  private fullLayers = 0;
  // Held layers (hold()): their slots are never victims; generations bump on every change.
  private readonly held: Uint8Array; // per slot
  private readonly heldLayer: Uint8Array;
  private readonly holdGen: Uint32Array;
  // Per acquired layer.
  private readonly pins = new Map<number, { slots: number[]; table: Int32Array; union: number }>();
  private pinnedCount = 0;
  private readonly unions: UnionBuilder;
  private prefetchCall = 0;

  private readonly c = {
    hits: 0,
    misses: 0,
    hitsWhileLoading: 0,
    evictions: 0,
    layerHits: [] as number[],
    layerMisses: [] as number[],
    predictions: 0,
    used: 0,
    wasted: 0,
    wastedBytes: 0,
    cancelled: 0,
    alreadyResident: 0,
    skipped: 0,
    readErrors: 0,
    verifiedRecords: 0,
    verifyMs: 0,
    checksumFailures: 0,
    offThread: 0,
  };

  /** See ExpertPoolOptions.ioDeadlineMs (Infinity: none). */
  private readonly ioDeadlineMs: number;

  constructor(opts: ExpertPoolOptions) {
    const { stride, layers, perLayer } = opts.model.expertLayout;
    const records = layers * perLayer;
    if (opts.backing !== "wired" && opts.backing !== "mapped") throw new Error(`expert pool: backing must be "wired" or "mapped", got ${JSON.stringify(opts.backing)}`);
    if (!Number.isInteger(opts.capacity) || opts.capacity < 1 || opts.capacity > records)
      throw new Error(`expert pool: capacity ${opts.capacity} must be an integer in 1..${records} (the model's expert records)`);
    const source = opts.model;
    this.verifyRecord = (opts.verify ?? true) && source.verifyRecord ? (l, e, r) => source.verifyRecord!(l, e, r) : null;
    this.recordChecksum = this.verifyRecord && source.recordChecksum ? (l, e) => source.recordChecksum!(l, e) : null;
    this.hashers = this.recordChecksum && opts.backing === "wired" && (opts.hashThreads ?? true) ? sharedHashWorkers() : null;
    const policy = opts.policy ?? DEFAULT_POOL_POLICY;
    if (!POOL_POLICIES.includes(policy)) throw new Error(`expert pool: policy must be ${POOL_POLICIES.map((p) => JSON.stringify(p)).join(" or ")}, got ${JSON.stringify(policy)}`);
    this.policy = policy;
    this.backing = opts.backing;
    this.capacity = opts.capacity;
    if (opts.ioDeadlineMs !== undefined && !(opts.ioDeadlineMs > 0)) throw new Error(`expert pool: ioDeadlineMs ${opts.ioDeadlineMs} must be > 0`);
    this.ioDeadlineMs = opts.ioDeadlineMs ?? Infinity;
    this.recordBytes = stride;
    this.layers = layers;
    this.perLayer = perLayer;
    const maxBufferBytes = opts.maxBufferBytes ?? DEFAULT_MAX_BUFFER_BYTES;
    const path = opts.model.paths.experts;
    if (this.backing === "wired") {
      this.memory = wiredMemory(this.capacity, stride, maxBufferBytes, opts.device);
      this.ownsScheduler = !opts.scheduler;
      this.scheduler = opts.scheduler ?? new IoScheduler();
      this.file = this.scheduler.open(path);
      const held = opts.model.fileIdentity?.("experts");
      if (held) {
        const st = fstatSync(this.file.fd);
        if (st.ino !== held.ino || st.dev !== held.dev) {
          this.scheduler.closeFile(this.file);
          throw new Error(`${path} was replaced after the model was opened (another file is at that path now); open the model again`);
        }
      }
      if (this.file.size < records * stride)
        throw new Error(`${path}: ${this.file.size} bytes, the experts need ${records * stride} (${records} records of ${stride})`);
    } else {
      this.memory = mappedMemory(path, records, stride, maxBufferBytes, opts.device);
      this.scheduler = null;
      this.ownsScheduler = false;
      this.file = null;
    }
    this.slotCount = this.memory.slotCount;
    this.buffers = this.memory.buffers;
    this.slotsPerBuffer = this.memory.slotsPerBuffer;
    this.slotTableStride = perLayer + 1 + (this.buffers.length > 1 ? this.buffers.length * (2 * perLayer + 1) : 0);

    const n = this.capacity;
    this.slotKey = new Int32Array(n).fill(-1);
    this.state = new Uint8Array(n);
    this.pinned = new Uint8Array(n);
    this.predicted = new Uint8Array(n);
    this.stamp = new Float64Array(n);
    this.gen = new Uint32Array(n);
    this.tickets = new Array<ReadTicket | null>(n).fill(null);
    this.readies = new Array<Promise<void> | null>(n).fill(null);
    this.ops = Array.from({ length: n }, () => []);
    this.prev = new Int32Array(n).fill(-1);
    this.next = new Int32Array(n).fill(-1);
    this.inList = new Uint8Array(n);
    this.lprev = new Int32Array(n).fill(-1);
    this.lnext = new Int32Array(n).fill(-1);
    this.slotLayer = new Int32Array(n).fill(-1);
    this.lhead = new Int32Array(layers).fill(-1);
    this.ltail = new Int32Array(layers).fill(-1);
    this.cycleOrder = Array.from({ length: layers }, (_, l) => Int32Array.from(layerCycleOrder(l, layers, opts.mtp ?? false)));
    this.cycleDist = this.cycleOrder.map((order) => {
      const d = new Int32Array(layers);
      order.forEach((m, i) => (d[m] = layers - i));
      return d;
    });
    this.prevOf = Int32Array.from({ length: layers }, (_, l) => {
      for (let m = 0; m < layers; m++) if (this.cycleDist[m]![l] === 1) return m;
      return l;
    });
    this.visits = new Float64Array(policy === "reuse" ? layers : 0);
    this.scale = new Float64Array(policy === "reuse" ? layers : 0).fill(1);
    this.useRate = new Float64Array(policy === "reuse" ? records : 0);
    this.predictedAt = new Float64Array(policy === "reuse" ? n : 0);
    const halfLife = opts.reuseHalfLife ?? REUSE_HALF_LIFE;
    if (!(halfLife > 0)) throw new Error(`expert pool: reuseHalfLife ${halfLife} must be > 0`);
    this.decay = Math.pow(0.5, 1 / halfLife);
    this.victimCache = opts.victimCache ?? true;
    this.lver = new Uint32Array(layers);
    this.vc = {
      batch: new Float64Array(layers),
      ver: new Uint32Array(layers),
      best: new Int32Array(layers),
      score: new Float64Array(layers),
      queued: new Int32Array(layers),
      busy: new Int32Array(layers),
      predRate: new Float64Array(layers),
    };
    for (let s = n - 1; s >= 0; s--) this.free.push(s);
    this.keySlot = new Int32Array(records).fill(-1);
    this.readsStarted = new Uint32Array(records);
    this.held = new Uint8Array(n);
    this.heldLayer = new Uint8Array(layers);
    this.holdGen = new Uint32Array(layers);
    this.unions = new UnionBuilder(perLayer);
    this.c.layerHits = new Array<number>(layers).fill(0);
    this.c.layerMisses = new Array<number>(layers).fill(0);
  }

  // ---- LRU list ----------------------------------------------------------------------

  private unlink(s: number): void {
    if (!this.inList[s]) return;
    const p = this.prev[s]!;
    const q = this.next[s]!;
    if (p >= 0) this.next[p] = q;
    else this.head = q;
    if (q >= 0) this.prev[q] = p;
    else this.tail = p;
    this.prev[s] = this.next[s] = -1;
    this.inList[s] = 0;
    const l = this.slotLayer[s]!;
    if (l < 0) return;
    const lp = this.lprev[s]!;
    const lq = this.lnext[s]!;
    if (lp >= 0) this.lnext[lp] = lq;
    else this.lhead[l] = lq;
    if (lq >= 0) this.lprev[lq] = lp;
    else this.ltail[l] = lp;
    this.lprev[s] = this.lnext[s] = -1;
    this.slotLayer[s] = -1;
    this.lver[l]!++;
  }

  /** Makes `s` the most recently used. */
  private touch(s: number): void {
    this.unlink(s);
    this.prev[s] = this.tail;
    this.next[s] = -1;
    if (this.tail >= 0) this.next[this.tail] = s;
    else this.head = s;
    this.tail = s;
    this.inList[s] = 1;
    const l = Math.floor(this.slotKey[s]! / this.perLayer);
    if (l < 0) return;
    this.slotLayer[s] = l;
    const t = this.ltail[l]!;
    this.lprev[s] = t;
    this.lnext[s] = -1;
    if (t >= 0) this.lnext[t] = s;
    else this.lhead[l] = s;
    this.ltail[l] = s;
    this.lver[l]!++;
  }

  /** 0: a victim candidate; 1: its read is queued; 2: a read is writing into it; -1: not a candidate. */
  private victimKind(s: number, excludeStamp: number): number {
    if (this.pinned[s] || this.held[s] || (excludeStamp && this.stamp[s] === excludeStamp)) return -1;
    if (this.ops[s]!.length && this.writing(s).length) return 2;
    const t = this.tickets[s];
    return t && (t.state === "queued" || t.state === "waiting") ? 1 : 0;
  }

  /**
   * "reuse": scans layer l's list for takeVictim (its first REUSE_SCAN candidates scored, the
   * first queued and busy slots met) into this.vc[l], stamped with the batch and list version.
   * reuseDistance inlined with the layer's terms hoisted (this runs layers x REUSE_SCAN times
   * a victim without the cache: ~0.25 ms a site at 48 layers x 128 experts).
   */
  private scanLayer(l: number, ref: number, excludeStamp: number, predictionRate: number): void {
    const vc = this.vc;
    const D = this.cycleDist[ref]![l]!;
    const sc = this.scale[l]!;
    const visits = this.visits[l]!;
    const base = l * this.perLayer;
    const N = this.layers;
    let best = -1;
    let bestScore = -Infinity;
    let queued = -1;
    let busy = -1;
    let usedRate = false;
    let seen = 0;
    for (let s = this.lhead[l]!; s >= 0 && seen < REUSE_SCAN; s = this.lnext[s]!) {
      const k = this.victimKind(s, excludeStamp);
      if (k !== 0) {
        if (k === 1 && queued < 0) queued = s;
        else if (k === 2 && busy < 0) busy = s;
        continue;
      }
      seen++;
      const key = this.slotKey[s]!;
      let score: number;
      if (key < base || key >= base + this.perLayer) score = this.reuseDistance(s, ref); // empty (or not this layer's)
      else {
        let p = this.useRate[key]! * sc;
        if (this.predicted[s] && this.predictedAt[s] === visits) {
          p = Math.max(p, predictionRate);
          usedRate = true;
        }
        const q = Math.max(p, 1e-4);
        score = D + (N * (1 - q)) / q;
      }
      if (score > bestScore) {
        bestScore = score;
        best = s;
      }
    }
    vc.batch[l] = this.batch;
    vc.ver[l] = this.lver[l]!;
    vc.best[l] = best;
    vc.score[l] = bestScore;
    vc.queued[l] = queued;
    vc.busy[l] = busy;
    vc.predRate[l] = usedRate ? predictionRate : Number.NaN;
  }

  /**
   * A slot for a new record: a free one, else the policy's first unpinned slot whose record is
   * in place, else the first whose read is still queued (that read is cancelled: whoever waits
   * on it gets IoCancelledError), else (allowBusy) the first being read, whose next read then
   * waits for the current one. -1 when every slot is pinned (or busy and !allowBusy).
   * A slot with a queued read is a last resort because its record was asked for moments ago:
   * taking it first (as layer-cyclic order alone would when the served layer's own records
   * were just requested) throws away work that a caller may still wait on.
   */
  private takeVictim(allowBusy: boolean, excludeStamp: number, ref: number, minScore = -Infinity): number {
    if (this.free.length) return this.free.pop()!;
    let queued = -1;
    let busy = -1;
    const consider = (s: number): boolean => {
      const k = this.victimKind(s, excludeStamp);
      if (k === 0) return true;
      if (k === 1 && queued < 0) queued = s;
      else if (k === 2 && busy < 0) busy = s;
      return false;
    };
    if (this.policy === "reuse") {
      // "First" read as: the largest expected reuse distance. A layer's records rank the same
      // way by use rate at any time (they decay together), and the rarely used ones sit at the
      // least recent end of its list: the first REUSE_SCAN candidates of each layer are scored.
      // Layers in cycle order; the first largest score wins, the first queued / busy slot met
      // is the fallback (scanLayer keeps each layer's part, cached within a batch).
      let best = -1;
      let bestScore = -Infinity;
      const order = this.cycleOrder[ref]!;
      const predictionRate = this.predictionRate();
      const vc = this.vc;
      for (let i = 0; i < order.length; i++) {
        const l = order[i]!;
        const cached =
          this.victimCache &&
          this.batch !== 0 &&
          vc.batch[l] === this.batch &&
          vc.ver[l] === this.lver[l] &&
          (Number.isNaN(vc.predRate[l]!) || vc.predRate[l] === predictionRate);
        if (!cached) this.scanLayer(l, ref, excludeStamp, predictionRate);
        if (vc.score[l]! > bestScore) {
          bestScore = vc.score[l]!;
          best = vc.best[l]!;
        }
        if (queued < 0) queued = vc.queued[l]!;
        if (busy < 0) busy = vc.busy[l]!;
      }
      if (best >= 0) return bestScore > minScore ? best : -1; // -1: all expected back sooner than what asks
    } else if (this.policy === "layer-cyclic") {
      // "First" read as: in the layer visited farthest from `ref`, least recently used within it.
      const order = this.cycleOrder[ref]!;
      for (let i = 0; i < order.length; i++) for (let s = this.lhead[order[i]!]!; s >= 0; s = this.lnext[s]!) if (consider(s)) return s;
    } else {
      for (let s = this.head; s >= 0; s = this.next[s]!) if (consider(s)) return s;
    }
    return queued >= 0 ? queued : allowBusy ? busy : -1;
  }

  /** The layer served just before `layer` in the cycle (the one whose distance to `layer` is 1). */
  private prevLayer(layer: number): number {
    return this.prevOf[layer]!;
  }

  /** "reuse": the decayed use rate of record `key` now (uses per visit of its layer, 0..1). */
  private useRateNow(key: number): number {
    return this.useRate[key]! * this.scale[Math.floor(key / this.perLayer)]!;
  }

  /** "reuse": one visit of `layer`, whose union `ids` is used: rate = decay x rate + (1 - decay) x used. */
  private countVisit(layer: number, ids: readonly number[]): void {
    this.visits[layer]!++;
    const base = layer * this.perLayer;
    let scale = (this.scale[layer]! *= this.decay);
    if (scale < 1e-200) {
      // Rescale before the stored values overflow (after thousands of visits).
      for (let e = 0; e < this.perLayer; e++) this.useRate[base + e]! *= scale;
      scale = this.scale[layer] = 1;
    }
    for (const e of ids) this.useRate[base + e] = (this.useRate[base + e]! * scale + (1 - this.decay)) / scale;
  }

  /** "reuse": the lookahead's accuracy so far (Laplace), the use rate a prediction counts with. */
  private predictionRate(): number {
    return (this.c.used + 1) / (this.c.predictions + 2);
  }

  /** "reuse": layer visits until slot `s`'s record is expected back, seen from serving `ref`. */
  private reuseDistance(s: number, ref: number): number {
    const key = this.slotKey[s]!;
    if (key < 0) return Infinity;
    const layer = Math.floor(key / this.perLayer);
    let p = this.useRateNow(key);
    // A prediction counts until its layer's next visit; unused then, it was wrong.
    if (this.predicted[s] && this.predictedAt[s] === this.visits[layer]) p = Math.max(p, this.predictionRate());
    return this.expectedReturn(layer, ref, p);
  }

  // scanLayer repeats this formula inline (a call per candidate cost ~30% of a site's host time,
  // bench:pool-host): change both together.
  private expectedReturn(layer: number, ref: number, p: number): number {
    const q = Math.max(p, 1e-4);
    return this.cycleDist[ref]![layer]! + (this.layers * (1 - q)) / q;
  }

  /** Reads still writing into slot `s` (started, not settled); prunes settled ones. */
  private writing(s: number): ReadTicket[] {
    const live = this.ops[s]!.filter((t) => t.state === "reading" || t.state === "queued" || t.state === "waiting");
    this.ops[s] = live;
    return live.filter((t) => t.state === "reading");
  }

  /** Drops the record held by `s` (it stays off the free list: the caller reuses it). */
  private evict(s: number): void {
    const key = this.slotKey[s]!;
    if (key < 0) return;
    // victimKind never offers a held slot: reaching this is a bug that would leave a stale table.
    if (this.held[s]) throw new Error(`expert pool: slot ${s} of held layer ${Math.floor(key / this.perLayer)} cannot be evicted`);
    this.c.evictions++;
    const t = this.tickets[s] ?? null;
    const cancelled = t !== null && t.cancel();
    if (this.predicted[s]) {
      if (cancelled) this.c.cancelled++;
      else {
        this.c.wasted++;
        this.c.wastedBytes += this.recordBytes;
      }
      this.predicted[s] = 0;
    }
    this.keySlot[key] = -1;
    this.slotKey[s] = -1;
    this.state[s] = EMPTY;
    this.fullLayers = 0;
    this.unlink(s);
  }

  /** Settles when every read still writing into `s` has finished; undefined if none. */
  private afterWrites(s: number): Promise<unknown> | undefined {
    const w = this.writing(s);
    if (w.length === 0) return undefined;
    return Promise.all(w.map((t) => t.done.catch(() => {})));
  }

  /** Puts record `key` in slot `s` and (wired) starts its read. */
  private assign(s: number, key: number, priority: Priority): void {
    this.slotKey[s] = key;
    this.keySlot[key] = s;
    const g = ++this.gen[s]!;
    const layer = Math.floor(key / this.perLayer);
    const expert = key % this.perLayer;
    if (!this.scheduler) {
      this.tickets[s] = null;
      this.readies[s] = null;
      this.state[s] = READY;
      // Mapped: the record enters the (virtual) pool now; check it before any table names it.
      if (this.verifyRecord) {
        try {
          this.checkRecord(s, layer, expert);
        } catch (e) {
          // The caller pins or touches `s` next: it joins the free list on release.
          this.dropFailed(s, key, false);
          this.readies[s] = Promise.reject(e);
          this.readies[s]!.catch(() => {});
        }
      }
      return;
    }
    this.state[s] = LOADING;
    this.readsStarted[key]!++;
    const t = this.scheduler.submit({
      file: this.file!,
      position: key * this.recordBytes,
      into: this.memory.view(s),
      priority,
      label: { layer, expert },
      // Earlier records' reads still writing into this slot (they cannot be stopped): start after them.
      after: this.afterWrites(s),
    });
    this.tickets[s] = t;
    this.ops[s]!.push(t);
    // The slot is ready once its bytes landed and (wired) matched the record's checksum.
    const ready = t.done.then(async () => {
      if (this.gen[s] !== g || !this.verifyRecord) return;
      if (this.hashers) {
        const pending = this.hashers.hash(this.memory.view(s));
        this.hashing.add(pending);
        const got = await pending.finally(() => this.hashing.delete(pending));
        if (this.gen[s] !== g) return;
        this.c.verifiedRecords++;
        this.c.offThread++;
        if (got === this.recordChecksum!(layer, expert)) return;
      }
      // On this thread: the check itself, or (after a worker's mismatch) the named error.
      this.checkRecord(s, layer, expert);
    });
    this.readies[s] = ready;
    ready.then(
      () => {
        if (this.gen[s] !== g) return;
        this.memory.publish(s);
        this.state[s] = READY;
        this.tickets[s] = null;
      },
      () => {
        if (this.gen[s] !== g) return;
        this.c.readErrors++;
        this.dropFailed(s, key);
      },
    );
  }

  /** Hashes slot `s` in place (a view of slot memory) against record (layer, expert)'s checksum. */
  private checkRecord(s: number, layer: number, expert: number): void {
    const t0 = performance.now();
    try {
      // Mapped: the record's place in the mapping is its public slot (the record index).
      this.verifyRecord!(layer, expert, this.memory.view(this.publicSlot(s, layer * this.perLayer + expert)));
    } catch (e) {
      this.c.checksumFailures++;
      throw e;
    } finally {
      this.c.verifiedRecords++;
      this.c.verifyMs += performance.now() - t0;
    }
  }

  /** Empties slot `s` after its record failed to arrive intact (read error or checksum mismatch). */
  private dropFailed(s: number, key: number, free = true): void {
    if (this.held[s]) this.unhold(Math.floor(key / this.perLayer));
    this.tickets[s] = null;
    this.predicted[s] = 0;
    this.keySlot[key] = -1;
    this.slotKey[s] = -1;
    this.state[s] = EMPTY;
    this.fullLayers = 0;
    this.unlink(s);
    if (free && !this.pinned[s]) this.free.push(s);
  }

  /** `ready` that rejects with IoTimeoutError when the reads take longer than the IO deadline. */
  private withDeadline(ready: Promise<void>, layer: number, waits: Promise<void>[], experts: number[]): Promise<void> {
    const ms = this.ioDeadlineMs;
    const settled = waits.map(() => false);
    waits.forEach((w, i) => {
      const mark = () => void (settled[i] = true);
      w.then(mark, mark);
    });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const pending = experts.filter((_, i) => !settled[i]);
        const path = this.file?.path ?? "experts.bin";
        const where = pending.map((e) => `expert ${e} (offset ${(layer * this.perLayer + e) * this.recordBytes})`).join(", ");
        reject(
          new IoTimeoutError(
            `${path}: the read of layer ${layer} ${where} did not finish within ${ms} ms (the IO deadline, set below the GPU's wait for the layer's experts): the disk is stalled or far slower than expected`,
            path,
            layer,
            pending,
            ms,
          ),
        );
      }, ms);
    });
    return Promise.race([ready, late]).finally(() => clearTimeout(timer));
  }

  /** Checksum work so far: records hashed, milliseconds spent hashing, mismatches. */
  verifyStats(): { records: number; ms: number; failures: number; offThread: number } {
    return { records: this.c.verifiedRecords, ms: this.c.verifyMs, failures: this.c.checksumFailures, offThread: this.c.offThread };
  }

  // ---- ExpertPool --------------------------------------------------------------------

  private checkLayer(layer: number, what: string): void {
    if (this.closed) throw new Error(`${what}: the expert pool is closed`);
    if (!Number.isInteger(layer) || layer < 0 || layer >= this.layers) throw new Error(`${what}: layer ${layer} is not in 0..${this.layers - 1}`);
  }

  /** The number the GPU uses for LRU slot `s` holding record `key`. */
  private publicSlot(s: number, key: number): number {
    return this.backing === "mapped" ? key : s;
  }

  acquire(layer: number, expertIds: ArrayLike<number>, priority: Priority = "demand"): Acquired {
    this.checkLayer(layer, "acquire");
    if (this.pins.has(layer)) throw new Error(`acquire: layer ${layer} is already acquired; release(${layer}) first`);
    const union = this.unions.of(expertIds, layer, "acquire");
    if (union.length > this.capacity - this.pinnedCount) throw new PoolTooSmallError(layer, union.length, this.capacity, this.pinnedCount);

    const base = layer * this.perLayer;
    if (this.policy === "reuse") this.countVisit(layer, union);
    const table = new Int32Array(this.perLayer).fill(-1);
    const slots = new Array<number>(union.length);
    const waits: Promise<void>[] = [];
    /** The expert each wait is for (for a late read's message). */
    const waitExperts: number[] = [];
    const missIds: number[] = [];
    // Hits first, pinned at once so that the misses cannot take their slots.
    for (let i = 0; i < union.length; i++) {
      const s = this.keySlot[base + union[i]!]!;
      if (s < 0) continue;
      slots[i] = s;
      this.pinned[s] = 1;
      this.c.hits++;
      this.c.layerHits[layer]!++;
      if (this.predicted[s]) {
        this.predicted[s] = 0;
        this.c.used++;
      }
      if (this.state[s] === LOADING) {
        this.c.hitsWhileLoading++;
        this.tickets[s]?.promote(priority);
        waits.push(this.readies[s]!);
        waitExperts.push(union[i]!);
      }
    }
    this.batch = ++this.batches;
    for (let i = 0; i < union.length; i++) {
      if (slots[i] !== undefined) continue;
      const s = this.takeVictim(true, 0, layer);
      // Cannot happen: the capacity check above leaves enough unpinned slots.
      if (s < 0) throw new PoolTooSmallError(layer, union.length, this.capacity, this.pinnedCount);
      this.evict(s);
      this.assign(s, base + union[i]!, priority);
      this.pinned[s] = 1;
      slots[i] = s;
      missIds.push(union[i]!);
      this.c.misses++;
      this.c.layerMisses[layer]!++;
      if (this.readies[s] && (this.state[s] === LOADING || this.slotKey[s] === -1)) {
        waits.push(this.readies[s]!);
        waitExperts.push(union[i]!);
      }
    }
    this.batch = 0;
    for (let i = 0; i < union.length; i++) {
      this.touch(slots[i]!);
      table[union[i]!] = this.publicSlot(slots[i]!, base + union[i]!);
    }
    this.pinnedCount += union.length;
    this.pins.set(layer, { slots, table, union: union.length });
    let ready = waits.length === 0 ? RESOLVED : waits.length === 1 ? waits[0]! : Promise.all(waits).then(() => {});
    if (ready !== RESOLVED && Number.isFinite(this.ioDeadlineMs)) ready = this.withDeadline(ready, layer, waits, waitExperts);
    // Marked handled: a step aborted before it awaits `ready` must not crash the process.
    if (ready !== RESOLVED) ready.catch(() => {});
    return { slotOf: table.slice(), union, misses: missIds.length, missIds, ready };
  }

  release(layer: number): void {
    const p = this.pins.get(layer);
    if (!p) return;
    this.pins.delete(layer);
    for (const s of p.slots) {
      this.pinned[s] = 0;
      // A slot whose record failed (read error, checksum) is empty: back to the free list.
      if (this.slotKey[s] === -1) {
        this.unlink(s);
        this.free.push(s);
      }
    }
    this.pinnedCount -= p.slots.length;
  }

  releaseAll(): void {
    for (const layer of [...this.pins.keys()]) this.release(layer);
  }

  evictAll(): void {
    if (this.pins.size) throw new Error(`evictAll: layers ${[...this.pins.keys()].join(", ")} are still acquired`);
    this.dropHolds();
    for (let s = 0; s < this.capacity; s++) {
      const key = this.slotKey[s]!;
      if (key < 0) continue;
      // A read in flight stays in ops[s]: the slot's next read waits for it.
      this.tickets[s]?.cancel();
      this.tickets[s] = null;
      this.gen[s]!++; // its completion handlers must not touch the slot any more
      this.keySlot[key] = -1;
      this.slotKey[s] = -1;
      this.state[s] = EMPTY;
      this.fullLayers = 0;
      this.predicted[s] = 0;
      this.unlink(s);
    }
    this.free.length = 0;
    for (let s = this.capacity - 1; s >= 0; s--) this.free.push(s);
  }

  prefetch(layer: number, expertIds: ArrayLike<number>, priority: Priority = "lookahead"): Prefetched {
    this.checkLayer(layer, "prefetch");
    const ids = this.unions.of(expertIds, layer, "prefetch");
    const call = ++this.prefetchCall; // from 1 (0 = no exclusion)
    const base = layer * this.perLayer;
    const waits: Promise<void>[] = [];
    let issued = 0;
    this.batch = ++this.batches;
    for (const e of ids) {
      const key = base + e;
      const have = this.keySlot[key]!;
      if (have >= 0) {
        this.c.alreadyResident++;
        this.stamp[have] = call;
        this.touch(have);
        continue;
      }
      // Never wait behind a read in flight, never push out what this call just predicted.
      // "reuse" scores from the layer just served (the predicted layer is next, one visit
      // away) and takes only a victim expected back later than the prediction.
      const s =
        this.policy === "reuse"
          ? this.takeVictim(false, call, this.prevLayer(layer), this.expectedReturn(layer, this.prevLayer(layer), Math.max(this.predictionRate(), this.useRateNow(key))))
          : this.takeVictim(false, call, layer);
      if (s < 0) {
        this.c.skipped++;
        continue;
      }
      this.evict(s);
      this.assign(s, key, priority);
      this.predicted[s] = 1;
      if (this.policy === "reuse") this.predictedAt[s] = this.visits[layer]!;
      this.stamp[s] = call;
      this.touch(s);
      this.c.predictions++;
      issued++;
      if (this.readies[s] && (this.state[s] === LOADING || this.slotKey[s] === -1)) waits.push(this.readies[s]!.catch(() => {}));
    }
    this.batch = 0;
    return { issued, ready: waits.length ? Promise.all(waits).then(() => {}) : RESOLVED };
  }

  preload(layers: readonly number[], onRecord?: () => void): Promise<void> {
    for (const l of layers) this.checkLayer(l, "preload");
    const absent = layers.flatMap((l) => Array.from({ length: this.perLayer }, (_, e) => l * this.perLayer + e)).filter((key) => this.keySlot[key]! < 0);
    if (absent.length > this.free.length)
      throw new Error(`preload: ${absent.length} records of layers ${layers.join(", ")} are not resident and the pool has ${this.free.length} free slots (of ${this.capacity})`);
    absent.sort((a, b) => a - b); // file order: the reads run sequentially through experts.bin
    const waits: Promise<void>[] = [];
    let landed = 0;
    let pending: number[] = [];
    for (const key of absent) {
      const s = this.free.pop()!;
      this.assign(s, key, "demand");
      if (this.slotKey[s] === key) this.touch(s);
      else this.free.push(s); // mapped: the record failed its check at once (readies[s] says why)
      const ready = this.readies[s] ?? RESOLVED;
      const done = ready.then(() => {
        landed++;
        onRecord?.();
      });
      done.catch(() => {});
      waits.push(done);
      pending.push(key);
    }
    const all = Promise.all(waits).then(() => {});
    if (!Number.isFinite(this.ioDeadlineMs) || waits.length === 0) return all;
    // A stalled disk must not hang the load: fail once no read has finished for the IO deadline.
    const ms = this.ioDeadlineMs;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const stalled = new Promise<never>((_, reject) => {
      let seen = -1;
      const check = () => {
        if (landed !== seen) {
          seen = landed;
          timer = setTimeout(check, ms);
          return;
        }
        pending = pending.filter((key) => { const s = this.keySlot[key]!; return s < 0 || this.state[s] !== READY; });
        const key = pending[0] ?? absent[absent.length - 1]!;
        const layer = Math.floor(key / this.perLayer);
        const late = pending.filter((k) => Math.floor(k / this.perLayer) === layer).map((k) => k % this.perLayer);
        const path = this.file?.path ?? "experts.bin";
        reject(new IoTimeoutError(`${path}: preload: no expert record arrived within ${ms} ms (the IO deadline); layer ${layer} expert ${key % this.perLayer} (offset ${key * this.recordBytes}) and ${pending.length - 1} more still pending: the disk is stalled or far slower than expected`, path, layer, late, ms));
      };
      check();
    });
    return Promise.race([all, stalled]).finally(() => clearTimeout(timer));
  }

  hold(layer: number): Int32Array | null {
    this.checkLayer(layer, "hold");
    const base = layer * this.perLayer;
    const table = new Int32Array(this.perLayer);
    for (let e = 0; e < this.perLayer; e++) {
      const s = this.keySlot[base + e]!;
      if (s < 0 || this.state[s] !== READY) return null;
      table[e] = this.publicSlot(s, base + e);
    }
    if (!this.heldLayer[layer]) {
      for (let e = 0; e < this.perLayer; e++) this.held[this.keySlot[base + e]!] = 1;
      this.heldLayer[layer] = 1;
      this.holdGen[layer]!++;
    }
    return table;
  }

  isHeld(layer: number): boolean {
    return this.heldLayer[layer] === 1;
  }

  holdGeneration(layer: number): number {
    return this.holdGen[layer]!;
  }

  private unhold(layer: number): void {
    if (!this.heldLayer[layer]) return;
    const base = layer * this.perLayer;
    for (let e = 0; e < this.perLayer; e++) {
      const s = this.keySlot[base + e]!;
      if (s >= 0) this.held[s] = 0;
    }
    this.heldLayer[layer] = 0;
    this.holdGen[layer]!++;
  }

  private dropHolds(): void {
    for (let l = 0; l < this.layers; l++) this.unhold(l);
  }

  countHits(layer: number, expertIds: ArrayLike<number>): void {
    this.checkLayer(layer, "countHits");
    const n = this.unions.of(expertIds, layer, "countHits").length;
    this.c.hits += n;
    this.c.layerHits[layer]! += n;
  }

  writeSlotTable(layer: number, dst: Int32Array): void {
    const p = this.pins.get(layer);
    if (!p) throw new Error(`writeSlotTable: layer ${layer} is not acquired`);
    if (dst.length < this.slotTableStride) throw new Error(`writeSlotTable: dst has ${dst.length} entries, needs ${this.slotTableStride}`);
    dst.set(p.table);
    const E = this.perLayer;
    dst[E] = p.union;
    const B = this.buffers.length;
    if (B < 2) return;
    const per = this.slotsPerBuffer;
    dst.fill(-1, E + 1, E + 1 + B * (2 * E + 1));
    for (let b = 0; b < B; b++) dst[E + 1 + b * (2 * E + 1) + E] = 0;
    for (let e = 0; e < E; e++) {
      const slot = p.table[e]!;
      if (slot < 0) continue;
      const base = E + 1 + Math.floor(slot / per) * (2 * E + 1);
      dst[base + e] = slot % per;
      const n = dst[base + E]!;
      dst[base + E + 1 + n] = e;
      dst[base + E] = n + 1;
    }
  }

  private checkSlot(slot: number): void {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.slotCount) throw new Error(`slot ${slot} is not in 0..${this.slotCount - 1}`);
  }

  slotBuffer(slot: number): Buffer {
    this.checkSlot(slot);
    const b = this.memory.buffers[this.memory.locate(slot).buffer];
    if (!b) throw new Error("slotBuffer: this pool was made without a device (host memory only)");
    return b;
  }

  slotBufferIndex(slot: number): number {
    this.checkSlot(slot);
    return this.memory.locate(slot).buffer;
  }

  slotOffset(slot: number): number {
    this.checkSlot(slot);
    return this.memory.locate(slot).offset;
  }

  slotView(slot: number): Uint8Array {
    this.checkSlot(slot);
    return this.memory.view(slot);
  }

  isResident(layer: number, e: number): boolean {
    return this.keySlot[layer * this.perLayer + e]! >= 0;
  }

  fullyResident(layers = this.layers): boolean {
    if (layers <= this.fullLayers) return true;
    if (this.capacity < this.keySlot.length) return false;
    for (let key = this.fullLayers * this.perLayer; key < layers * this.perLayer; key++) {
      const s = this.keySlot[key]!;
      if (s < 0 || this.state[s] !== READY) return false;
    }
    this.fullLayers = layers;
    return true;
  }

  poolStats(): PoolStats {
    const c = this.c;
    const total = c.hits + c.misses;
    let resident = 0;
    for (let s = 0; s < this.capacity; s++) if (this.slotKey[s]! >= 0) resident++;
    return {
      backing: this.backing,
      capacity: this.capacity,
      resident,
      records: this.layers * this.perLayer,
      recordBytes: this.recordBytes,
      hits: c.hits,
      misses: c.misses,
      hitsWhileLoading: c.hitsWhileLoading,
      evictions: c.evictions,
      hitRate: total ? c.hits / total : 0,
      perLayer: { hits: [...c.layerHits], misses: [...c.layerMisses] },
    };
  }

  recordReads(): Uint32Array {
    return this.readsStarted.slice();
  }

  lookaheadStats(): LookaheadStats {
    const c = this.c;
    return {
      predictions: c.predictions,
      used: c.used,
      wasted: c.wasted,
      wastedBytes: c.wastedBytes,
      cancelled: c.cancelled,
      alreadyResident: c.alreadyResident,
      skipped: c.skipped,
      accuracy: c.predictions ? c.used / c.predictions : 0,
    };
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.pins.clear();
    const inFlight: Promise<void>[] = [];
    for (let s = 0; s < this.capacity; s++) {
      this.gen[s]!++;
      for (const t of this.ops[s]!) {
        t.cancel();
        inFlight.push(t.done.catch(() => {}));
      }
    }
    await Promise.all(inFlight);
    // Worker threads may still be hashing slot memory: it must outlive them.
    await Promise.all([...this.hashing].map((p) => p.catch(() => {})));
    if (this.scheduler) {
      if (this.ownsScheduler) await this.scheduler.close();
      else this.scheduler.closeFile(this.file!);
    }
    this.memory.release();
  }
}
