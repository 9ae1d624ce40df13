/**
 * The streaming IO scheduler: async positional reads straight into caller-owned memory
 * (expert slots, PLE rows), uncached, with bounded parallelism and three priority classes.
 *
 * - Reads are node:fs `read(fd, view, 0, length, position)` on Bun's file IO thread pool;
 *   `view` is typically a subarray of a shim buffer's zero-copy `bytes` view, so the data
 *   lands in GPU-visible memory with no copy.
 * - Uncached: Linux opens with O_DIRECT (offset, length and buffer address must then be
 *   multiples of {@link DIRECT_ALIGNMENT}; expert records are 16 KiB aligned and slots page
 *   aligned, so they always are). A file system that refuses O_DIRECT falls back to cached
 *   reads and the reason is recorded ({@link IoFile.fallbackReason}, `stats().fallbackReason`).
 *   macOS sets F_NOCACHE through the shim's fixed-arity helper (ck_fd_set_nocache).
 * - Priorities: "demand" (a step waits on it) > "lookahead" (next layer's predicted experts)
 *   > "ngram" (PLE row prefetch). Queued reads start in that order, FIFO within a class;
 *   a queued read can be promoted (a demand now needs it) or cancelled (its slot is needed).
 * - Errors: an IO error or a short read rejects that read's promise with an
 *   {@link IoReadError} naming the file, offset, length and the label (layer, expert); the
 *   scheduler keeps going. close() cancels queued reads and waits for those in flight.
 *
 * Parallelism: Bun runs file IO on a thread pool whose size is fixed at process start by
 * UV_THREADPOOL_SIZE (default about the core count; measured 3 threads on a 2-core
 * machine). More reads in flight than pool threads only queue inside Bun, so start the
 * process with UV_THREADPOOL_SIZE >= maxInFlight (setting it from JS is too late).
 */
import { closeSync, constants, fstatSync, openSync, read } from "node:fs";
import { availableParallelism } from "node:os";
import { ptr } from "bun:ffi";
import { LatencyHistogram, type IoStats } from "./telemetry.ts";

/** Priority classes, most urgent first. */
export type Priority = "demand" | "lookahead" | "ngram";
export const PRIORITIES: readonly Priority[] = ["demand", "lookahead", "ngram"];
const RANK: Record<Priority, number> = { demand: 0, lookahead: 1, ngram: 2 };

/** Alignment of offsets, lengths and buffer addresses for O_DIRECT reads (covers 512 and 4096-byte blocks). */
export const DIRECT_ALIGNMENT = 4096;

/**
 * Reads in flight by default: enough to keep an NVMe queue busy (bench:io's sweep; parallel
 * pread is what made flash-moe's SSD reads fast). Needs UV_THREADPOOL_SIZE >= this to be real.
 */
export const DEFAULT_MAX_IN_FLIGHT = 16;

/** What a read is for, used in error messages and stats. */
export interface ReadLabel {
  layer?: number;
  expert?: number;
  /** Free text when layer/expert do not apply (e.g. "ple row 17"). */
  what?: string;
}

/** A file opened by the scheduler. */
export interface IoFile {
  readonly path: string;
  readonly fd: number;
  /** How reads bypass the page cache. */
  readonly mode: "O_DIRECT" | "F_NOCACHE" | "cached";
  /** Why this file is read through the page cache although uncached reads were asked for. */
  readonly fallbackReason: string | null;
  /** Offsets, lengths and buffer addresses must be multiples of this (1: no rule). */
  readonly alignment: number;
  readonly size: number;
}

/**
 * One positional read: fills `into` from `position`, returning the bytes read (may be fewer,
 * 0 at end of file). The default is node:fs `read`; tests pass hooks that fail or stall.
 */
export type PositionalReader = (file: IoFile, into: Uint8Array, position: number) => Promise<number>;

/** Opens a file with node:fs flags, returning the descriptor (tests replace it to refuse O_DIRECT). */
export type FileOpener = (path: string, flags: number) => number;

export interface IoSchedulerOptions {
  /** Reads in flight at once (default {@link DEFAULT_MAX_IN_FLIGHT}). */
  maxInFlight?: number;
  /**
   * In-flight places only demand reads may take (default maxInFlight / 4, at least 1 when
   * maxInFlight > 1): a demand miss never waits for a window full of prefetches, which
   * cannot be cancelled once started.
   */
  demandReserve?: number;
  /** Ask for uncached reads on files opened without an explicit choice (default true). */
  uncached?: boolean;
  /** Replaces node:fs read (fault injection, slow disks). */
  reader?: PositionalReader;
  /** Replaces node:fs openSync. */
  opener?: FileOpener;
}

export interface ReadRequest {
  file: IoFile;
  /** Byte offset in the file. */
  position: number;
  /** Destination; its length is the read length. */
  into: Uint8Array;
  priority: Priority;
  label?: ReadLabel;
  /** The read is not started before this settles (the slot's previous read still writes into `into`). */
  after?: Promise<unknown>;
}

export type ReadState = "waiting" | "queued" | "reading" | "done" | "failed" | "cancelled";

/** A submitted read. */
export interface ReadTicket {
  readonly id: number;
  /** Resolves once every byte is in `into`; rejects with IoReadError or IoCancelledError. */
  readonly done: Promise<void>;
  readonly state: ReadState;
  readonly priority: Priority;
  readonly bytes: number;
  /** Raises the priority of a read that has not started (no effect once reading). */
  promote(priority: Priority): void;
  /** Cancels a read that has not started; false once it is reading or finished. */
  cancel(): boolean;
}

function describeLabel(label: ReadLabel | undefined): string {
  if (!label) return "";
  const parts: string[] = [];
  if (label.layer !== undefined) parts.push(`layer ${label.layer}`);
  if (label.expert !== undefined) parts.push(`expert ${label.expert}`);
  if (label.what) parts.push(label.what);
  return parts.length ? ` (${parts.join(" ")})` : "";
}

/** A read failed (IO error or short read). Names the file, offset, length, layer and expert. */
export class IoReadError extends Error {
  override name = "IoReadError";
  constructor(
    message: string,
    readonly file: string,
    readonly position: number,
    readonly length: number,
    readonly label: ReadLabel | undefined,
    /** errno code of the failed call ("EIO"), or "SHORT_READ". */
    readonly code: string,
  ) {
    super(message);
  }
  get layer(): number | undefined {
    return this.label?.layer;
  }
  get expert(): number | undefined {
    return this.label?.expert;
  }
}

/**
 * Expert reads a step waits for did not finish within the IO deadline (a stalled or far too
 * slow disk). Names the file, the layer and the experts still being read; the deadline is
 * shorter than the GPU's wait for the layer's slot table, so this, not the GPU's time-out, is
 * what the step reports.
 */
export class IoTimeoutError extends Error {
  override name = "IoTimeoutError";
  constructor(
    message: string,
    readonly file: string,
    readonly layer: number,
    /** The experts of `layer` whose records had not arrived. */
    readonly experts: number[],
    readonly deadlineMs: number,
  ) {
    super(message);
  }
  /** The first late expert. */
  get expert(): number {
    return this.experts[0]!;
  }
}

/** A read was cancelled before it started (its slot was reused, or the scheduler closed). */
export class IoCancelledError extends Error {
  override name = "IoCancelledError";
  constructor(
    message: string,
    readonly reason: "cancelled" | "closed",
  ) {
    super(message);
  }
}

/** The default {@link PositionalReader}: node:fs `read` on Bun's thread pool (wrap it in hooks). */
export const fsRead: PositionalReader = (file, into, position) =>
  new Promise((resolve, reject) => read(file.fd, into, 0, into.length, position, (err, n) => (err ? reject(err) : resolve(n))));

const defaultOpener: FileOpener = (path, flags) => openSync(path, flags);

/** Threads of Bun's file IO pool: UV_THREADPOOL_SIZE if set, else about the core count. */
export function ioThreadPoolSize(): number {
  const n = Number(process.env.UV_THREADPOOL_SIZE);
  return Number.isInteger(n) && n > 0 ? n : availableParallelism() + 1;
}

/**
 * A FIFO of tickets with O(1) push and shift (a head index, compacted now and then: Array
 * shift is O(n) and a prefill can queue thousands of reads). Removal is lazy: a ticket that
 * left the queue (started elsewhere, cancelled, promoted to another class) is skipped.
 */
class TicketQueue {
  private items: (Ticket | null)[] = [];
  private head = 0;
  constructor(private readonly rank: number) {}

  push(t: Ticket): void {
    this.items.push(t);
  }

  /** The oldest ticket still queued in this class, removed; undefined when none. */
  shift(): Ticket | undefined {
    while (this.head < this.items.length) {
      const t = this.items[this.head];
      this.items[this.head++] = null;
      if (this.head > 1024 && this.head * 2 > this.items.length) {
        this.items = this.items.slice(this.head);
        this.head = 0;
      }
      if (t && t.state === "queued" && RANK[t.priority] === this.rank) return t;
    }
    return undefined;
  }

  /** Tickets still queued in this class, oldest first. */
  live(): Ticket[] {
    const out: Ticket[] = [];
    for (let i = this.head; i < this.items.length; i++) {
      const t = this.items[i];
      if (t && t.state === "queued" && RANK[t.priority] === this.rank) out.push(t);
    }
    return out;
  }
}

class Ticket implements ReadTicket {
  state: ReadState = "queued";
  readonly done: Promise<void>;
  resolve!: () => void;
  reject!: (e: Error) => void;
  submittedAt = performance.now();
  constructor(
    readonly id: number,
    readonly req: ReadRequest,
    public priority: Priority,
    private readonly owner: IoScheduler,
  ) {
    this.done = new Promise<void>((res, rej) => {
      this.resolve = res;
      this.reject = rej;
    });
    // The owner of the ticket may never look at a cancelled lookahead: no unhandled rejection.
    this.done.catch(() => {});
  }
  get bytes(): number {
    return this.req.into.length;
  }
  promote(priority: Priority): void {
    this.owner.promote(this, priority);
  }
  cancel(): boolean {
    return this.owner.cancel(this, "cancelled");
  }
}

/**
 * The IO scheduler. One per loaded model; the expert pool and the PLE prefetch share it so
 * that priorities hold across both.
 */
export class IoScheduler {
  readonly maxInFlight: number;
  readonly demandReserve: number;
  readonly uncached: boolean;
  private readonly reader: PositionalReader;
  private readonly opener: FileOpener;
  private readonly queues = [new TicketQueue(0), new TicketQueue(1), new TicketQueue(2)];
  private queued = 0;
  private readonly reading = new Set<Ticket>();
  private readonly waiting = new Set<Ticket>();
  private readonly files = new Set<IoFile>();
  private nextId = 1;
  private closed = false;
  private readonly latency = new LatencyHistogram();
  private readonly service = new LatencyHistogram();
  private readonly counters = {
    requestedBytes: 0,
    completedBytes: 0,
    reads: 0,
    failed: 0,
    cancelled: 0,
    cancelledBytes: 0,
    byPriority: { demand: 0, lookahead: 0, ngram: 0 },
  };

  constructor(opts: IoSchedulerOptions = {}) {
    const n = opts.maxInFlight ?? DEFAULT_MAX_IN_FLIGHT;
    if (!Number.isInteger(n) || n < 1) throw new Error(`IoScheduler: maxInFlight ${n} must be an integer >= 1`);
    this.maxInFlight = n;
    const r = opts.demandReserve ?? (n > 1 ? Math.max(1, Math.floor(n / 4)) : 0);
    if (!Number.isInteger(r) || r < 0 || r >= n) throw new Error(`IoScheduler: demandReserve ${r} must be an integer in 0..${n - 1} (maxInFlight ${n})`);
    this.demandReserve = r;
    this.uncached = opts.uncached ?? true;
    this.reader = opts.reader ?? fsRead;
    this.opener = opts.opener ?? defaultOpener;
  }

  /**
   * Opens `path` for reading, uncached unless `uncached` is false. O_DIRECT refused by the file
   * system (EINVAL) falls back to a cached descriptor with the reason recorded.
   */
  open(path: string, opts: { uncached?: boolean } = {}): IoFile {
    if (this.closed) throw new Error(`IoScheduler: closed, cannot open ${path}`);
    const uncached = opts.uncached ?? this.uncached;
    let fd: number;
    let mode: IoFile["mode"] = "cached";
    let fallbackReason: string | null = null;
    const openPlain = () => {
      try {
        return this.opener(path, constants.O_RDONLY);
      } catch (e) {
        throw new Error(`cannot open ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
      }
    };
    if (uncached && process.platform === "linux" && constants.O_DIRECT) {
      try {
        fd = this.opener(path, constants.O_RDONLY | constants.O_DIRECT);
        mode = "O_DIRECT";
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code;
        if (code !== "EINVAL") throw new Error(`cannot open ${path}: ${code ?? (e as Error).message}`);
        fd = openPlain();
        fallbackReason = `O_DIRECT refused by the file system of ${path} (EINVAL): reads go through the page cache`;
      }
    } else {
      fd = openPlain();
      if (uncached && process.platform === "darwin") {
        const why = setNoCache(fd);
        if (why === null) mode = "F_NOCACHE";
        else fallbackReason = `F_NOCACHE not set on ${path} (${why}): reads go through the page cache`;
      } else if (uncached) {
        fallbackReason = `no uncached reads on ${process.platform}: reads go through the page cache`;
      }
    }
    const file: IoFile = {
      path,
      fd,
      mode,
      fallbackReason,
      alignment: mode === "O_DIRECT" ? DIRECT_ALIGNMENT : 1,
      size: fstatSync(fd).size,
    };
    this.files.add(file);
    return file;
  }

  /** Closes a file opened here; it must have no reads pending. */
  closeFile(file: IoFile): void {
    if (!this.files.delete(file)) return;
    closeSync(file.fd);
  }

  /** Queues a read. Throws at once for a bad request (closed scheduler, out of bounds, misaligned O_DIRECT). */
  submit(req: ReadRequest): ReadTicket {
    if (this.closed) throw new Error(`IoScheduler: closed, cannot read ${req.file.path}${describeLabel(req.label)}`);
    if (!(req.priority in RANK)) throw new Error(`IoScheduler: unknown priority ${JSON.stringify(req.priority)}`);
    const len = req.into.length;
    if (len === 0 || req.position < 0 || req.position + len > req.file.size)
      throw new Error(
        `${req.file.path}: read of ${len} bytes at offset ${req.position}${describeLabel(req.label)} is outside the file (${req.file.size} bytes)`,
      );
    const a = req.file.alignment;
    if (a > 1 && (req.position % a !== 0 || len % a !== 0 || Number(ptr(req.into)) % a !== 0))
      throw new Error(
        `${req.file.path}: O_DIRECT read at offset ${req.position}, ${len} bytes${describeLabel(req.label)}: ` +
          `offset, length and buffer address must be multiples of ${a}`,
      );
    const t = new Ticket(this.nextId++, req, req.priority, this);
    this.counters.requestedBytes += len;
    this.counters.byPriority[req.priority] += len;
    if (req.after) {
      t.state = "waiting";
      this.waiting.add(t);
      const enqueue = () => {
        if (t.state !== "waiting") return;
        this.waiting.delete(t);
        t.state = "queued";
        this.queued++;
        this.queues[RANK[t.priority]]!.push(t);
        this.pump();
      };
      req.after.then(enqueue, enqueue);
    } else {
      this.queued++;
      this.queues[RANK[t.priority]]!.push(t);
      this.pump();
    }
    return t;
  }

  /** @internal Ticket.promote. */
  promote(t: Ticket, priority: Priority): void {
    if (RANK[priority] >= RANK[t.priority]) return;
    if (t.state !== "queued" && t.state !== "waiting") return;
    t.priority = priority;
    // The entry in the old class goes stale (skipped there); a new one joins the new class.
    if (t.state === "queued") this.queues[RANK[priority]]!.push(t);
    this.pump();
  }

  /** @internal Ticket.cancel. */
  cancel(t: Ticket, reason: "cancelled" | "closed"): boolean {
    if (t.state === "queued") {
      this.queued--; // its queue entry goes stale
    } else if (t.state === "waiting") {
      this.waiting.delete(t);
    } else {
      return false;
    }
    t.state = "cancelled";
    this.counters.cancelled++;
    this.counters.cancelledBytes += t.bytes;
    const what = `${t.req.file.path} offset ${t.req.position}${describeLabel(t.req.label)}`;
    t.reject(new IoCancelledError(reason === "closed" ? `read of ${what} cancelled: the IO scheduler closed` : `read of ${what} cancelled`, reason));
    return true;
  }

  private pump(): void {
    while (this.reading.size < this.maxInFlight) {
      let t = this.queues[0]!.shift();
      // Lower classes leave the reserved places free for demand reads.
      if (!t && this.reading.size < this.maxInFlight - this.demandReserve) t = this.queues[1]!.shift() ?? this.queues[2]!.shift();
      if (!t) return;
      this.queued--;
      this.start(t);
    }
  }

  private start(t: Ticket): void {
    t.state = "reading";
    this.reading.add(t);
    const startedAt = performance.now();
    this.readFully(t).then(
      () => {
        const now = performance.now();
        this.reading.delete(t);
        t.state = "done";
        this.counters.reads++;
        this.counters.completedBytes += t.bytes;
        this.latency.addMs(now - t.submittedAt);
        this.service.addMs(now - startedAt);
        t.resolve();
        this.pump();
      },
      (e: Error) => {
        this.reading.delete(t);
        t.state = "failed";
        this.counters.failed++;
        t.reject(e);
        this.pump();
      },
    );
  }

  /** Reads until `into` is full; a 0-byte read before that is a short read. */
  private async readFully(t: Ticket): Promise<void> {
    const { file, into, position, label } = t.req;
    const want = into.length;
    let got = 0;
    while (got < want) {
      let n: number;
      try {
        n = await this.reader(file, got === 0 ? into : into.subarray(got), position + got);
      } catch (e) {
        const code = (e as NodeJS.ErrnoException).code ?? "EIO";
        throw new IoReadError(
          `${file.path}: read of ${want} bytes at offset ${position}${describeLabel(label)} failed: ${(e as Error).message}`,
          file.path,
          position,
          want,
          label,
          code,
        );
      }
      if (!(n > 0)) {
        throw new IoReadError(
          `${file.path}: short read at offset ${position}${describeLabel(label)}: got ${got} of ${want} bytes` +
            (position + got >= file.size ? " (end of file)" : ""),
          file.path,
          position,
          want,
          label,
          "SHORT_READ",
        );
      }
      got += n;
    }
  }

  /** Reads in flight plus queued (and waiting) reads. */
  get pending(): number {
    return this.reading.size + this.waiting.size + this.queued;
  }

  /** Resolves when nothing is queued or in flight. */
  async drain(): Promise<void> {
    while (this.pending > 0) {
      const all = [...this.reading, ...this.waiting, ...this.queues.flatMap((q) => q.live())].map((t) => t.done.catch(() => {}));
      await Promise.all(all);
    }
  }

  stats(): IoStats {
    const files = [...this.files];
    const modes = [...new Set(files.map((f) => f.mode))];
    return {
      mode: modes.length ? modes.join("+") : this.uncached ? (process.platform === "darwin" ? "F_NOCACHE" : "O_DIRECT") : "cached",
      fallbackReason: files.find((f) => f.fallbackReason)?.fallbackReason ?? null,
      maxInFlight: this.maxInFlight,
      threadPool: ioThreadPoolSize(),
      requestedBytes: this.counters.requestedBytes,
      completedBytes: this.counters.completedBytes,
      reads: this.counters.reads,
      failed: this.counters.failed,
      cancelled: this.counters.cancelled,
      cancelledBytes: this.counters.cancelledBytes,
      inFlight: this.reading.size,
      queued: this.pending - this.reading.size,
      requestedByPriority: { ...this.counters.byPriority },
      latency: this.latency.summary(),
      service: this.service.summary(),
    };
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /**
   * Cancels every queued read (their promises reject with IoCancelledError "closed"), waits
   * for the reads in flight (they cannot be interrupted), then closes the files.
   */
  async close(): Promise<void> {
    if (this.closed) return this.drain();
    this.closed = true;
    for (const t of [...this.waiting, ...this.queues.flatMap((q) => q.live())]) this.cancel(t, "closed");
    await this.drain();
    for (const f of this.files) closeSync(f.fd);
    this.files.clear();
  }
}

/** macOS: F_NOCACHE through the shim's fixed-arity helper; null on success, else why not. */
function setNoCache(fd: number): string | null {
  try {
    // Loaded lazily: the shim is only needed here on macOS.
    const { loadShim } = require("../shim.ts") as typeof import("../shim.ts");
    const shim = loadShim();
    const rc = shim.symbols.ck_fd_set_nocache(fd, 1);
    return rc === 0 ? null : String(shim.symbols.ck_io_error_text(rc));
  } catch (e) {
    return `shim unavailable: ${(e as Error).message.split("\n")[0]}`;
  }
}
