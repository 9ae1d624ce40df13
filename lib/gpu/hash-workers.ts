// Checksums of expert records off the main thread: a few worker threads hash slot memory in
// place (by address, no copy) while the main thread keeps serving steps and issuing reads.
// Hashing on the main thread costs about a tenth of the read time at disk speed on a small
// CPU (bench:io), and a fast SSD can outrun one core's xxhash64; spread over workers it
// overlaps the reads instead. The caller keeps the memory alive until the promise settles.
import { ptr } from "bun:ffi";
import { availableParallelism } from "node:os";
import { checksum } from "../model/checksum.ts";
import { workerFile } from "../worker-file.ts";

/** null in a bundled app: records are then hashed on this thread (slower reads, same sums). */
const WORKER_URL = workerFile("./hash-worker.ts", import.meta.url);

export class HashWorkers {
  private readonly workers: Worker[] = [];
  private readonly pending = new Map<number, { resolve: (s: string) => void; reject: (e: Error) => void }>();
  private nextId = 1;
  private turn = 0;

  constructor(
    readonly size = Math.max(1, Math.min(4, availableParallelism() - 1)),
    /** The worker file; null hashes on this thread. */
    private readonly url: string | null = WORKER_URL,
  ) {}

  private worker(url: string): Worker {
    if (this.workers.length < this.size) {
      const w = new Worker(url);
      w.unref();
      w.onmessage = (ev: MessageEvent<{ id: number; sum: string }>) => {
        const p = this.pending.get(ev.data.id);
        this.pending.delete(ev.data.id);
        p?.resolve(ev.data.sum);
      };
      w.onerror = (ev) => {
        // A dead worker is dropped (the next hash starts another): jobs sent to it would wait forever.
        w.terminate();
        this.workers.splice(this.workers.indexOf(w), 1);
        const e = new Error(`checksum worker ${url} failed: ${(ev as ErrorEvent).message ?? "unknown error"}`);
        for (const p of this.pending.values()) p.reject(e);
        this.pending.clear();
      };
      this.workers.push(w);
      return w;
    }
    return this.workers[this.turn++ % this.workers.length]!;
  }

  /** xxhash64 of `bytes` (16 hex digits, as lib/model/checksum.ts writes it), computed on a worker. */
  hash(bytes: Uint8Array): Promise<string> {
    const url = this.url;
    if (url === null) return Promise.resolve(checksum(bytes));
    return new Promise((resolve, reject) => {
      const id = this.nextId++;
      this.pending.set(id, { resolve, reject });
      this.worker(url).postMessage({ id, addr: Number(ptr(bytes)), len: bytes.byteLength });
    });
  }

  /** Hashes still running. */
  get inFlight(): number {
    return this.pending.size;
  }
}

let shared: HashWorkers | null = null;
/** The process's hashing threads (started on first use; they never keep the process alive). */
export function sharedHashWorkers(): HashWorkers {
  return (shared ??= new HashWorkers());
}
