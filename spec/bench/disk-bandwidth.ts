/**
 * The disk's direct (uncached) random-read bandwidth at a model's expert record size: whole
 * records at seeded random places of its experts.bin, 16 in flight through the engine's IO
 * scheduler, as the engine reads them. The physical bound of a streaming run is its expert
 * bytes over this (bench:scale, bench:prefill).
 */
import { join } from "node:path";

import { IoScheduler } from "../../lib/gpu/streaming.ts";
import { readManifest } from "../../lib/model/format.ts";
import { Rng } from "../../lib/model/rng.ts";
import { Device, type Backend } from "../../lib/shim.ts";

export interface DiskBandwidth {
  /** Bytes per second. */
  bytesPerSecond: number;
  records: number;
  recordBytes: number;
  /** How the reads bypassed the page cache ("O_DIRECT", "F_NOCACHE", or "cached" after a fallback). */
  mode: string;
  fallbackReason: string | null;
}

/**
 * Reads `count` (default 256, at most every record) random records of `modelDir`'s
 * experts.bin into page-aligned buffers of a `backend` device (default cpu), 16 at a time.
 */
export async function diskBandwidth(modelDir: string, opts: { backend?: Backend; count?: number } = {}): Promise<DiskBandwidth> {
  const m = readManifest(modelDir);
  const stride = m.experts.stride;
  const records = m.experts.layers * m.experts.per_layer;
  const io = new IoScheduler({ uncached: true });
  const file = io.open(join(modelDir, "experts.bin"));
  const dev = Device.open({ backend: opts.backend ?? "cpu" });
  const count = Math.min(opts.count ?? 256, records);
  const buffers = Array.from({ length: 16 }, () => dev.buffer(stride)); // page-aligned, as direct IO wants
  const r = new Rng(7, "bench-scale-disk");
  try {
    const t0 = performance.now();
    let next = 0;
    await Promise.all(
      buffers.map(async (b) => {
        while (next < count) {
          next++;
          await io.submit({ file, position: r.int(records) * stride, into: b.bytes.subarray(0, stride), priority: "demand" }).done;
        }
      }),
    );
    const seconds = (performance.now() - t0) / 1000;
    const st = io.stats();
    return { bytesPerSecond: (count * stride) / seconds, records: count, recordBytes: stride, mode: st.mode, fallbackReason: st.fallbackReason };
  } finally {
    await io.close();
    for (const b of buffers) b.release();
    dev.close();
  }
}
