// The resident fast path (docs/engine.md "Resident layers"): when the expert pool holds every
// record of the expert layers a step can route to, a layer whose records are all in place is
// held there (ExpertPool.hold: its slots are never victims) and its expert -> slot table is
// written once into a device buffer of its own. A MoE site of a held layer then needs no host
// decision: its expert kernels read that table, and the step encodes no signal/wait for it.
// The preload reads every such record before the first step, so that holds from the start.
import type { Binding, Buffer, Device } from "../shim.ts";
import { bind } from "./dispatch.ts";
import type { ExpertPool } from "./residency.ts";

/** Engine option `preload`: read every expert record at load ("auto": when the pool holds them all). */
export type PreloadOption = "auto" | boolean;

/** stats().engine.resident. */
export interface ResidentStats {
  /** The option as given: "auto", "on" or "off". */
  preload: string;
  /** Whether the load read every record of `layers` into the pool. */
  preloaded: boolean;
  /** Records read by the preload, and how long it took. */
  preloadRecords: number;
  preloadMs: number;
  /** Expert layers a step can route to (trunk layers run, then the MTP head's). */
  layers: number;
  /** Of those, the layers held resident: their sites run without a host handshake. */
  residentLayers: number;
  /** Every one of `layers` is resident: a step does no host round trip. */
  fullyResident: boolean;
  /** Why no layer can be resident (the pool is too small, ...), or null. */
  unavailable: string | null;
}

/** `preload: true` asked of a pool that cannot hold every record the layers run use. */
export class PreloadError extends Error {
  override name = "PreloadError";
}

/** Parses the option (the CLI passes booleans; Model.load may pass "auto"). */
export function checkPreload(v: unknown): PreloadOption {
  if (v === undefined) return "auto";
  if (v === "auto" || v === true || v === false) return v;
  throw new Error(`engine option preload: ${JSON.stringify(v)} must be "auto", true or false`);
}

export class ResidentLayers {
  /** [expert layers][perLayer + 1] i32: a held layer's slot by expert, then the union size (perLayer). */
  private readonly table: Buffer | null;
  private readonly stride: number;
  /** Per expert layer: the hold generation its table row was written for (-1: none). */
  private readonly written: Int32Array;
  private heldCount = 0;
  readonly unavailable: string | null;
  private readonly preloadAsked: PreloadOption;
  private preloaded = false;
  private preloadRecords = 0;
  private preloadMs = 0;

  constructor(
    device: Device,
    private readonly pool: ExpertPool,
    /** The expert layers a step may route to. */
    readonly layers: readonly number[],
    preload: PreloadOption,
  ) {
    this.preloadAsked = preload;
    this.stride = pool.perLayer + 1;
    this.written = new Int32Array(pool.layers).fill(-1);
    const needed = layers.length * pool.perLayer;
    // Holding a layer keeps its slots from every other layer: only a pool that holds every
    // record a step can ask for may hold without starving another layer's misses.
    if (pool.capacity < needed) this.unavailable = `the pool holds ${pool.capacity} of the ${needed} expert records the layers run use`;
    // A pool in several buffers gets per-buffer tables and active lists built from each step's union by the host.
    else if (pool.buffers.length > 1) this.unavailable = `the pool spans ${pool.buffers.length} buffers (the expert kernels' per-buffer lists are built by the host)`;
    else this.unavailable = null;
    if (preload === true && pool.capacity < needed)
      throw new PreloadError(`preload: the pool holds ${pool.capacity} of the ${needed} expert records the layers run use; a preload needs them all (a pool of 100%), or leave it to "auto"`);
    // Device storage: the tables are written between steps and uploaded (cuda), read by every held site.
    this.table = this.unavailable === null ? device.buffer(pool.layers * this.stride * 4, "device") : null;
  }

  /** Whether the load should read every record first. */
  get wantsPreload(): boolean {
    return this.preloadAsked !== false && this.pool.capacity >= this.layers.length * this.pool.perLayer;
  }

  /** Reads every record of the layers into the pool (see ExpertPool.preload), then holds them. */
  async preload(onRecord?: () => void): Promise<void> {
    const t0 = performance.now();
    const before = this.pool.poolStats().resident;
    await this.pool.preload(this.layers, onRecord);
    this.preloaded = true;
    this.preloadRecords = this.pool.poolStats().resident - before;
    this.preloadMs = performance.now() - t0;
    this.refresh();
  }

  /**
   * Holds every layer whose records are all in place and writes its table row; a row written
   * for an older hold (evictAll since) is rewritten. Between steps only (the GPU reads rows).
   */
  refresh(): void {
    if (this.table === null) return;
    if (this.heldCount === this.layers.length && this.layers.every((l) => this.current(l))) return;
    let held = 0;
    for (const l of this.layers) {
      if (!this.current(l)) {
        const slots = this.pool.hold(l);
        if (slots === null) continue;
        const row = this.table.i32.subarray(l * this.stride, (l + 1) * this.stride);
        row.set(slots);
        row[this.pool.perLayer] = this.pool.perLayer;
        this.table.upload(l * this.stride * 4, this.stride * 4);
        this.written[l] = this.pool.holdGeneration(l);
      }
      held++;
    }
    this.heldCount = held;
  }

  /** Whether every layer is held with a current row (after refresh()): no site of a step needs a handshake. */
  allHeld(): boolean {
    return this.table !== null && this.heldCount === this.layers.length;
  }

  private current(l: number): boolean {
    return this.pool.isHeld(l) && this.written[l] === this.pool.holdGeneration(l);
  }

  /** Layer `l`'s table when its site may skip the handshake (held, row current), else null. */
  binding(l: number): Binding | null {
    if (this.table === null || !this.current(l)) return null;
    return bind(this.table, l * this.stride * 4);
  }

  /** Layer `l`'s table row as the GPU reads it (tests compare it with the pool). */
  row(l: number): Int32Array | null {
    return this.table ? this.table.i32.slice(l * this.stride, (l + 1) * this.stride) : null;
  }

  stats(): ResidentStats {
    const resident = this.layers.filter((l) => this.binding(l) !== null).length;
    return {
      preload: this.preloadAsked === "auto" ? "auto" : this.preloadAsked ? "on" : "off",
      preloaded: this.preloaded,
      preloadRecords: this.preloadRecords,
      preloadMs: this.preloadMs,
      layers: this.layers.length,
      residentLayers: resident,
      fullyResident: resident === this.layers.length,
      unavailable: this.unavailable,
    };
  }

  release(): void {
    this.table?.release();
  }
}
