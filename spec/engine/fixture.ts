// Shared by the spec/engine tests: a synthetic tiny model on disk (5 expert layers x 8
// experts, 16 KiB records), gates for controlling when fake reads finish, fault hooks.
import { ptr } from "bun:ffi";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { synthesize } from "../../lib/convert/synth.ts";
import { openModel, type ModelFiles } from "../../lib/model/format.ts";
import { fsRead, type PositionalReader } from "../../lib/gpu/streaming.ts";

export interface TinyModel {
  dir: string;
  model: ModelFiles;
  cleanup(): void;
}

/** Writes a tiny q4 synthetic model to a fresh temp dir and opens it. */
export async function tinyModel(seed = 11): Promise<TinyModel> {
  const dir = mkdtempSync(join(tmpdir(), "cherenkov-engine-"));
  await synthesize({ preset: "tiny", seed, out: dir, weights: "q4", workers: 0 });
  const model = await openModel(dir);
  return {
    dir,
    model,
    cleanup() {
      model.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A promise with its resolver outside: reads wait on it. */
export function gate(): { promise: Promise<void>; open(): void } {
  let open!: () => void;
  const promise = new Promise<void>((r) => (open = r));
  return { promise, open };
}

/** An errno-style error as node:fs raises it. */
export function errnoError(code: string, message: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`${code}: ${message}`), { code });
}

/**
 * A reader that behaves like fsRead except at chosen file offsets: `fail` throws EIO,
 * `short` returns half the bytes and then end of file, `hold` waits for a gate first.
 * Every started read's offset is logged in `started`.
 */
export function faultyReader(): {
  reader: PositionalReader;
  fail: Set<number>;
  short: Set<number>;
  hold: Map<number, Promise<void>>;
  started: number[];
} {
  const fail = new Set<number>();
  const short = new Set<number>();
  const hold = new Map<number, Promise<void>>();
  const started: number[] = [];
  const eof = new Set<number>();
  const reader: PositionalReader = async (file, into, position) => {
    started.push(position);
    const h = hold.get(position);
    if (h) await h;
    if (fail.has(position)) throw errnoError("EIO", "i/o error, read");
    if (eof.has(position)) return 0;
    if (short.has(position)) {
      // Half the bytes, then "end of file" for the scheduler's read of the rest.
      const n = await fsRead(file, into.subarray(0, into.length / 2), position);
      eof.add(position + n);
      return n;
    }
    return fsRead(file, into, position);
  };
  return { reader, fail, short, hold, started };
}

/** Resolves to the settled state of a promise without waiting past `ms`. */
export async function settledWithin<T>(p: Promise<T>, ms: number): Promise<"resolved" | "rejected" | "pending"> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<"pending">((r) => (timer = setTimeout(() => r("pending"), ms)));
  const state = p.then(
    () => "resolved" as const,
    () => "rejected" as const,
  );
  try {
    return await Promise.race([state, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** `n` views of `bytes` each, every one starting on a 16 KiB boundary (like pool slots). */
export function alignedViews(n: number, bytes: number): Uint8Array[] {
  const align = 16384;
  const raw = new Uint8Array(n * bytes + align);
  const skip = (align - (Number(ptr(raw)) % align)) % align;
  return Array.from({ length: n }, (_, i) => raw.subarray(skip + i * bytes, skip + (i + 1) * bytes));
}
