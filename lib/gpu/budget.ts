/**
 * Expert-pool sizing. By default the pool gets what the device may keep resident (its
 * working-set limit) minus the fixed buffers (dense weights, scratch, sequence state) minus
 * a host reservation (the OS, the page cache for the mapped backing, the JS heap). An
 * explicit size (bytes, slots, or a fraction of all expert records: `--pool 50%`) overrides
 * that. Either way the pool must hold one layer's routed experts for the largest step
 * (topK * maxRows distinct experts, capped at the layer's expert count), else
 * {@link planPool} throws a {@link BudgetError} that gives the numbers.
 */
import { totalmem } from "node:os";

export interface PoolBudgetInput {
  /** Bytes the device may keep resident (Device.limits.maxWorkingSet; Metal's recommendedMaxWorkingSetSize). */
  deviceMaxWorkingSet: number;
  /** Device buffers that are not the pool: dense weights, scratch, KV and DeltaNet state, slot tables. */
  fixedBytes: number;
  /** Bytes left to the host (OS, page cache, JS heap). See {@link defaultHostReserveBytes}. */
  hostReserveBytes: number;
  /** Bytes per expert record (experts.stride). */
  recordStride: number;
  /** Expert layers (trunk layers, plus one for the MTP head). */
  expertLayers: number;
  /** Routed experts per layer. */
  perLayer: number;
  /** Experts each row routes to. */
  topK: number;
  /** Rows of the largest step (MAX_NB: a prefill chunk or 1 + drafts). Default 1. */
  maxRows?: number;
  /** Explicit pool size in bytes (rounded down to whole records). */
  poolBytes?: number;
  /** Explicit pool size in records. */
  poolSlots?: number;
  /** Explicit pool size as a fraction (0, 1] of all expert records. */
  poolFraction?: number;
}

export interface PoolPlan {
  /** Records the pool holds. */
  slots: number;
  /** slots * recordStride. */
  bytes: number;
  /** How the size was chosen, in words (shown by --stats and load progress). */
  reason: string;
  /** The smallest pool a step can run with. */
  minSlots: number;
  /** All expert records of the model. */
  records: number;
  /** What the working-set budget alone would allow (records, before the cap at `records`). */
  budgetSlots: number;
  /** An explicit size larger than the working-set budget: allowed, but the device may page. */
  overBudget: boolean;
}

/** The budget cannot hold the experts one step needs. Carries the numbers. */
export class BudgetError extends Error {
  override name = "BudgetError";
  constructor(
    message: string,
    readonly neededSlots: number,
    readonly availableSlots: number,
    readonly recordStride: number,
  ) {
    super(message);
  }
}

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

/** Bytes as "1.50 GiB" / "64.0 MiB" / "12345 B", for messages. */
export function formatBytes(n: number): string {
  if (Math.abs(n) >= GiB) return `${(n / GiB).toFixed(2)} GiB`;
  if (Math.abs(n) >= MiB) return `${(n / MiB).toFixed(1)} MiB`;
  if (Math.abs(n) >= 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${n} B`;
}

/**
 * A host reservation for machines whose GPU shares RAM: 2 GiB plus 10% of RAM (the OS, the
 * JS heap, the page cache the mapped backing lives in).
 */
export function defaultHostReserveBytes(totalRam: number = totalmem()): number {
  return Math.round(2 * GiB + 0.1 * totalRam);
}

/** The smallest pool a step of `maxRows` rows can run with: one layer's distinct routed experts. */
export function minPoolSlots(topK: number, perLayer: number, maxRows = 1): number {
  return Math.min(perLayer, Math.max(topK, topK * maxRows));
}

const isCount = (x: number) => Number.isInteger(x) && x >= 0;

function checkInput(i: PoolBudgetInput): void {
  const positive = (name: keyof PoolBudgetInput) => {
    const v = i[name] as number;
    if (!Number.isInteger(v) || v <= 0) throw new BudgetError(`pool budget: ${name} ${v} must be a positive integer`, 0, 0, i.recordStride);
  };
  positive("recordStride");
  positive("expertLayers");
  positive("perLayer");
  positive("topK");
  if (i.maxRows !== undefined) positive("maxRows");
  for (const name of ["deviceMaxWorkingSet", "fixedBytes", "hostReserveBytes"] as const)
    if (!(Number.isFinite(i[name]) && i[name] >= 0)) throw new BudgetError(`pool budget: ${name} ${i[name]} must be a number >= 0`, 0, 0, i.recordStride);
  if (i.topK > i.perLayer) throw new BudgetError(`pool budget: topK ${i.topK} exceeds the ${i.perLayer} experts per layer`, 0, 0, i.recordStride);
  const explicit = [i.poolBytes, i.poolSlots, i.poolFraction].filter((x) => x !== undefined).length;
  if (explicit > 1) throw new BudgetError("pool budget: give at most one of poolBytes, poolSlots, poolFraction", 0, 0, i.recordStride);
  if (i.poolBytes !== undefined && !isCount(i.poolBytes)) throw new BudgetError(`pool budget: poolBytes ${i.poolBytes} must be an integer >= 0`, 0, 0, i.recordStride);
  if (i.poolSlots !== undefined && !isCount(i.poolSlots)) throw new BudgetError(`pool budget: poolSlots ${i.poolSlots} must be an integer >= 0`, 0, 0, i.recordStride);
  if (i.poolFraction !== undefined && !(i.poolFraction > 0 && i.poolFraction <= 1))
    throw new BudgetError(`pool budget: poolFraction ${i.poolFraction} must be in (0, 1] (a share of all expert records)`, 0, 0, i.recordStride);
}

/** Sizes the expert pool (see the module comment). Throws BudgetError when it cannot work. */
export function planPool(input: PoolBudgetInput): PoolPlan {
  checkInput(input);
  const { deviceMaxWorkingSet, fixedBytes, hostReserveBytes, recordStride: stride, expertLayers, perLayer, topK } = input;
  const maxRows = input.maxRows ?? 1;
  const records = expertLayers * perLayer;
  const minSlots = minPoolSlots(topK, perLayer, maxRows);
  const available = deviceMaxWorkingSet - fixedBytes - hostReserveBytes;
  const budgetSlots = Math.max(0, Math.floor(available / stride));
  const budgetText =
    `working-set limit ${formatBytes(deviceMaxWorkingSet)} - fixed buffers ${formatBytes(fixedBytes)} - ` +
    `host reserve ${formatBytes(hostReserveBytes)} = ${formatBytes(available)}`;
  const need = `one layer's routed experts for a step of ${maxRows} row${maxRows === 1 ? "" : "s"} need ${minSlots} records ` +
    `(top-k ${topK} x ${maxRows} rows, at most ${perLayer} per layer) = ${formatBytes(minSlots * stride)} at ${formatBytes(stride)} per record`;

  let slots: number;
  let reason: string;
  if (input.poolSlots !== undefined || input.poolBytes !== undefined || input.poolFraction !== undefined) {
    let asked: string;
    if (input.poolSlots !== undefined) {
      slots = input.poolSlots;
      asked = `${input.poolSlots} slots`;
    } else if (input.poolBytes !== undefined) {
      slots = Math.floor(input.poolBytes / stride);
      asked = `${formatBytes(input.poolBytes)} (${slots} records of ${formatBytes(stride)})`;
    } else {
      slots = Math.floor(input.poolFraction! * records);
      asked = `${+(input.poolFraction! * 100).toFixed(2)}% of ${records} expert records (${slots} records)`;
    }
    if (slots < minSlots)
      throw new BudgetError(`expert pool of ${asked} is too small: ${need}`, minSlots, slots, stride);
    const capped = slots > records;
    slots = Math.min(slots, records);
    reason = `explicit: ${asked}${capped ? `, capped at all ${records} records` : ""}`;
  } else {
    if (budgetSlots < minSlots)
      throw new BudgetError(
        `expert pool budget too small: ${budgetText}, room for ${budgetSlots} records, but ${need}. ` +
          "Lower the host reservation, or give an explicit pool size (--pool / --pool-slots).",
        minSlots,
        budgetSlots,
        stride,
      );
    slots = Math.min(budgetSlots, records);
    reason = `budget: ${budgetText}: ${budgetSlots} records` + (budgetSlots >= records ? `, every one of the ${records} expert records fits` : ` of ${records}`);
  }
  const overBudget = slots > budgetSlots;
  if (overBudget) reason += `; over the working-set budget (${budgetSlots} records fit): the device may page`;
  return { slots, bytes: slots * stride, reason, minSlots, records, budgetSlots, overBudget };
}

/**
 * The "mapped" backing wraps all of experts.bin as one no-copy buffer, and Metal makes a
 * wrapped buffer resident as a whole: a file larger than what the working set leaves after
 * the fixed buffers and the host reserve means paging storms or a failed command buffer,
 * not streaming. Throws a BudgetError saying so (and what to use instead) unless it fits.
 */
export function checkMappedFits(i: { deviceMaxWorkingSet: number; fixedBytes: number; hostReserveBytes: number; fileBytes: number }): void {
  const room = i.deviceMaxWorkingSet - i.fixedBytes - i.hostReserveBytes;
  if (i.fileBytes <= room) return;
  throw new BudgetError(
    `--backing mapped: experts.bin is ${formatBytes(i.fileBytes)}, more than the working set leaves for it ` +
      `(working-set limit ${formatBytes(i.deviceMaxWorkingSet)} - fixed buffers ${formatBytes(i.fixedBytes)} - ` +
      `host reserve ${formatBytes(i.hostReserveBytes)} = ${formatBytes(Math.max(0, room))}). The mapped file is made ` +
      "resident as a whole, so it is safe only when it fits; use --backing wired (the default), with --io cached " +
      "to let the page cache keep hot records.",
    0,
    0,
    0,
  );
}

/**
 * Parses a pool size as the CLI takes it: "50%" (of all expert records), "512MiB" / "8GiB" /
 * "1.5GB" (bytes), or a plain integer (bytes). Returns the matching planPool override.
 */
export function parsePoolSize(text: string): Pick<PoolBudgetInput, "poolBytes" | "poolFraction"> {
  const t = text.trim();
  const pct = /^(\d+(?:\.\d+)?)\s*%$/.exec(t);
  if (pct) {
    const f = Number(pct[1]) / 100;
    if (!(f > 0 && f <= 1)) throw new Error(`--pool ${text}: a percentage must be in (0, 100]`);
    return { poolFraction: f };
  }
  const m = /^(\d+(?:\.\d+)?)\s*(B|KB|KiB|MB|MiB|GB|GiB|TB|TiB)?$/i.exec(t);
  if (!m) throw new Error(`--pool ${JSON.stringify(text)}: expected a percentage ("50%") or a size ("8GiB", "512MiB", bytes)`);
  const units: Record<string, number> = { b: 1, kb: 1e3, kib: 1024, mb: 1e6, mib: MiB, gb: 1e9, gib: GiB, tb: 1e12, tib: 1024 * GiB };
  return { poolBytes: Math.floor(Number(m[1]) * units[(m[2] ?? "b").toLowerCase()]!) };
}
