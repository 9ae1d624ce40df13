// One generation at a time (the model has one device), first come first served. A request
// whose client goes away while it waits leaves the queue without ever running.
import { ApiError } from "./errors.ts";

interface Waiter {
  start: () => void;
  fail: (e: unknown) => void;
}

export class GenerationQueue {
  private busy = false;
  private waiters: Waiter[] = [];

  constructor(private maxWaiting: number) {}

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
      const onAbort = () => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(signal.reason);
      };
      const waiter: Waiter = {
        start: () => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        },
        fail: (e) => {
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
