/**
 * Runtime resource counters shared by CLI telemetry and the server's status: capacities
 * (what the budget planned) and observations (what the process uses now). Not a partition
 * of process memory: mapped files are shared with the page cache, and CPU prefix
 * checkpoints and session history are reported separately by the server.
 *
 * Model.load registers each fixed device buffer with {@link MemoryTracker.addFixed} (its sum
 * is the budget's `fixedBytes`) and the pool with {@link MemoryTracker.setPool}.
 */
import { freemem, totalmem } from "node:os";
import type { PoolPlan } from "./budget.ts";
import type { Backing } from "./residency.ts";

/** Capacities and observations, in bytes. JSON-serialisable. */
export interface MemoryStats {
  /** The device's working-set limit. */
  workingSetLimit: number;
  /** Sum of the fixed device buffers (dense weights, scratch, state, tables). */
  fixedBytes: number;
  /** The fixed buffers by name. */
  fixed: Record<string, number>;
  /** Bytes left to the host by the budget. */
  hostReserveBytes: number;
  backing: Backing | null;
  /** Expert pool: records, bytes per record and their product (wired: allocated; mapped: tracked). */
  poolSlots: number;
  recordBytes: number;
  poolBytes: number;
  /** How the pool size was chosen. */
  poolReason: string;
  /** Files mapped into the address space (dense.bin, experts.bin for the mapped backing), by name. */
  mapped: Record<string, number>;
  mappedBytes: number;
  /** Observed now. */
  rss: number;
  heapUsed: number;
  systemTotal: number;
  systemFree: number;
}

export class MemoryTracker {
  private readonly fixed = new Map<string, number>();
  private readonly mapped = new Map<string, number>();
  private pool: { plan: PoolPlan; backing: Backing; recordBytes: number } | null = null;

  constructor(
    readonly workingSetLimit: number,
    readonly hostReserveBytes: number,
  ) {}

  /** Registers (or replaces) a fixed device buffer. */
  addFixed(name: string, bytes: number): void {
    if (!(Number.isFinite(bytes) && bytes >= 0)) throw new Error(`MemoryTracker.addFixed: ${name}: bytes ${bytes} must be >= 0`);
    this.fixed.set(name, bytes);
  }

  removeFixed(name: string): void {
    this.fixed.delete(name);
  }

  /** Registers (or replaces) a mapped file. */
  addMapped(name: string, bytes: number): void {
    this.mapped.set(name, bytes);
  }

  setPool(plan: PoolPlan, backing: Backing, recordBytes: number): void {
    this.pool = { plan, backing, recordBytes };
  }

  /** Sum of the fixed buffers: the `fixedBytes` planPool takes. */
  get fixedBytes(): number {
    let s = 0;
    for (const b of this.fixed.values()) s += b;
    return s;
  }

  snapshot(): MemoryStats {
    const mem = process.memoryUsage();
    const sum = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);
    return {
      workingSetLimit: this.workingSetLimit,
      fixedBytes: this.fixedBytes,
      fixed: Object.fromEntries(this.fixed),
      hostReserveBytes: this.hostReserveBytes,
      backing: this.pool?.backing ?? null,
      poolSlots: this.pool?.plan.slots ?? 0,
      recordBytes: this.pool?.recordBytes ?? 0,
      poolBytes: this.pool?.plan.bytes ?? 0,
      poolReason: this.pool?.plan.reason ?? "",
      mapped: Object.fromEntries(this.mapped),
      mappedBytes: sum(this.mapped),
      rss: mem.rss,
      heapUsed: mem.heapUsed,
      systemTotal: totalmem(),
      systemFree: freemem(),
    };
  }
}
