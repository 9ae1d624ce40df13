// One generation at a time (the model has one device), first come first served. A request
// whose client goes away while it waits leaves the queue without ever running; one that waits
// longer than the wait limit leaves it with 503 (a flood cannot keep requests parked forever).
import { ApiError } from "./errors.ts";

interface Waiter {
  start: () => void;
  fail: (e: unknown) => void;
}

export class GenerationQueue {
  private busy = false;
  private waiters: Waiter[] = [];

  constructor(
    private maxWaiting: number,
    /** Longest a request may wait before it starts (ms). */
    private maxWaitMs = Infinity,
  ) {}

  get running(): number {
    return this.busy ? 1 : 0;
  }

  get waiting(): number {
    return this.waiters.length;
  }

  /** Runs `job` when the device is free; rejects with 503 when too many wait, or when `signal` aborts first. */
  async run<T>(signal: AbortSignal, job: () => Promise<T>): Promise<T> {
    await this.acquire(signal);
    try {
      return await job();
    } finally {
      this.release();
    }
  }

  /** Throws 503 when a new request would have to wait and the queue is full. */
  checkRoom(): void {
    if (this.busy && this.waiters.length >= this.maxWaiting)
      throw new ApiError(503, `the server is busy: ${this.waiters.length} requests are already waiting`, null, "queue_full");
  }

  /** Refuses every waiting request (the server is stopping). */
  rejectWaiting(reason: unknown): void {
    for (const w of this.waiters.splice(0)) w.fail(reason);
  }

  private acquire(signal: AbortSignal): Promise<void> {
    signal.throwIfAborted();
    if (!this.busy) {
      this.busy = true;
      return Promise.resolve();
    }
    try {
      this.checkRoom();
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => {
      const leave = (e: unknown) => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        waiter.fail(e);
      };
      const onAbort = () => leave(signal.reason);
      const timer = Number.isFinite(this.maxWaitMs)
        ? setTimeout(
            () => leave(new ApiError(503, `the server is busy: the request waited ${this.maxWaitMs / 1000} s for the device`, null, "queue_timeout")),
            this.maxWaitMs,
          )
        : undefined;
      const waiter: Waiter = {
        start: () => {
          clearTimeout(timer);
          signal.removeEventListener("abort", onAbort);
          resolve();
        },
        fail: (e) => {
          clearTimeout(timer);
          signal.removeEventListener("abort", onAbort);
          reject(e);
        },
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  private release(): void {
    const next = this.waiters.shift();
    if (next) next.start(); // the device passes straight to the next request: busy stays true
    else this.busy = false;
  }
}
