/**
 * `bun run bench:io`: the streaming IO scheduler against the disk's own bandwidth, at the
 * expert record sizes of real models.
 *
 * By default it writes a scratch file (--file-mb, default 1024 MB, on a real disk: not tmpfs,
 * which would measure memory) and reads it as records of the 30b-a3b-shape and
 * 80b-a3b-shape presets' q4 expert record sizes (2,949,120 and 1,966,080 bytes; --sizes takes
 * other presets or byte counts). Per size: every record in a seeded random order through the
 * engine's wired pool (lib/gpu/residency.ts: shim buffers as slots, the IO scheduler,
 * O_DIRECT on Linux), `dd if=FILE of=/dev/null bs=1M iflag=direct` on the same file, bare
 * node:fs reads of the same records at the same depth (no scheduler, no pool), and bare reads
 * with each record split into parallel 1 MiB requests, alternating for --passes rounds at the
 * scheduler's default depth; then a sweep of the reads in flight (--in-flight 1,4,8,16,32).
 * Prints scheduler / dd and scheduler / raw per size, or one JSON object with --json. The
 * pool verifies every record against its xxhash64 before publishing its slot (as a loaded
 * model does); the same reads without checks run alternately, and the report gives the
 * hashing time as a share of the read time and the throughput it costs.
 *
 * Other sources: --model DIR (a model's experts.bin at its own record size), --preset NAME
 * (synthesize that preset, e.g. small, into --dir), --file PATH --stride BYTES (any file read
 * as records of that size). --passes N (default 3), --min-mb N (each measurement reads the
 * file as many times as it takes to move at least N MB, default 256).
 *
 * Bun's file IO pool is sized once, at process start, from UV_THREADPOOL_SIZE (else about
 * the core count); reads in flight beyond it only queue. When it is unset this script runs
 * itself again with UV_THREADPOOL_SIZE=64 so the sweep means what it says.
 */
import { closeSync, existsSync, fsyncSync, mkdtempSync, openSync, readFileSync, readSync, realpathSync, rmSync, statSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { median } from "./stats.ts";

const SWEEP_THREADS = 64;
if (!process.env.UV_THREADPOOL_SIZE) {
  const child = Bun.spawnSync([process.execPath, ...process.argv.slice(1)], {
    env: { ...process.env, UV_THREADPOOL_SIZE: String(SWEEP_THREADS) },
    stdio: ["inherit", "inherit", "inherit"],
  });
  process.exit(child.exitCode ?? 1);
}

const { synthesize } = await import("../../lib/convert/synth.ts");
const { openModel } = await import("../../lib/model/format.ts");
const { createExpertPool } = await import("../../lib/gpu/residency.ts");
const { IoScheduler, ioThreadPoolSize, fsRead, DEFAULT_MAX_IN_FLIGHT } = await import("../../lib/gpu/streaming.ts");
const { planExperts } = await import("../../lib/model/writer.ts");
const { checksum } = await import("../../lib/model/checksum.ts");
const { presetConfig, presetNames } = await import("../../lib/convert/presets.ts");
type ExpertSource = import("../../lib/gpu/residency.ts").ExpertSource;
type ExpertPool = import("../../lib/gpu/residency.ts").ExpertPool;
type DeviceT = import("../../lib/shim.ts").Device;
const { Device } = await import("../../lib/shim.ts");
type PresetName = import("../../lib/convert/presets.ts").PresetName;

const { values: opts } = parseArgs({
  options: {
    model: { type: "string" },
    file: { type: "string" },
    stride: { type: "string" },
    dir: { type: "string" },
    preset: { type: "string" },
    sizes: { type: "string", default: "30b-a3b-shape,80b-a3b-shape" },
    "file-mb": { type: "string", default: "1024" },
    passes: { type: "string", default: "3" },
    "min-mb": { type: "string", default: "256" },
    "in-flight": { type: "string", default: "1,4,8,16,32" },
    "split-kb": { type: "string", default: "1024" },
    json: { type: "boolean", default: false },
  },
});
const log = (s: string) => {
  if (!opts.json) console.error(s);
};

/** The file system type holding `path` (from /proc/mounts; null where there is none). */
function fsType(path: string): string | null {
  if (!existsSync("/proc/mounts")) return null;
  const real = realpathSync(path);
  let best = { mount: "", type: "" };
  for (const line of readFileSync("/proc/mounts", "utf8").split("\n")) {
    const [, mount, type] = line.split(" ");
    if (!mount || !type) continue;
    const m = mount.replace(/\\040/g, " ");
    if ((real === m || real.startsWith(m.endsWith("/") ? m : m + "/")) && m.length >= best.mount.length) best = { mount: m, type };
  }
  return best.type || null;
}

const MEMORY_FS = new Set(["tmpfs", "ramfs", "devtmpfs"]);

/** A folder on a real disk for the synthetic model. */
function benchDir(): { dir: string; fs: string | null; note: string | null } {
  const candidates = [opts.dir, process.env.TMPDIR, tmpdir(), "/var/tmp", process.cwd()].filter((d): d is string => !!d && existsSync(d));
  for (const c of candidates) {
    const type = fsType(c);
    if (type && MEMORY_FS.has(type)) {
      log(`  ${c} is ${type} (memory, not disk): skipped`);
      continue;
    }
    return { dir: mkdtempSync(join(c, "cherenkov-bench-io-")), fs: type, note: null };
  }
  throw new Error(`no folder on a real disk among ${candidates.join(", ")}: pass --dir`);
}

interface DdResult {
  bytes: number;
  seconds: number;
  mbps: number;
}

/** dd over the whole file `repeat` times; bytes and seconds as dd reports them, summed. */
function runDd(path: string, repeat: number): DdResult | { error: string } {
  const direct = process.platform === "linux" ? ["iflag=direct"] : [];
  let bytes = 0;
  let seconds = 0;
  for (let i = 0; i < repeat; i++) {
    const t0 = performance.now();
    const p = Bun.spawnSync(["dd", `if=${path}`, "of=/dev/null", "bs=1M", ...direct], { stderr: "pipe", stdout: "pipe" });
    const wall = (performance.now() - t0) / 1000;
    const err = p.stderr.toString();
    if (p.exitCode !== 0) return { error: `dd failed (${p.exitCode}): ${err.trim()}` };
    // GNU: "18874368 bytes (19 MB, 18 MiB) copied, 0.0234 s, 806 MB/s"; BSD: "... bytes transferred in 0.02 secs"
    const m = /(\d+) bytes.*?(?:copied, |transferred in )([\d.]+) s/.exec(err);
    bytes += m ? Number(m[1]) : statSync(path).size;
    seconds += m ? Number(m[2]) : wall;
  }
  return { bytes, seconds, mbps: bytes / seconds / 1e6 };
}

interface SchedResult {
  bytes: number;
  seconds: number;
  mbps: number;
  reads: number;
  p50Us: number;
  p99Us: number;
  mode: string;
  fallbackReason: string | null;
  /** Milliseconds spent hashing records before their slots were published (0 without checksums). */
  verifyMs: number;
}

/** A seeded random permutation of 0..n-1 (xorshift32, Fisher-Yates). */
function shuffled(n: number, seed: number): number[] {
  const order = Array.from({ length: n }, (_, i) => i);
  let x = seed >>> 0 || 1;
  for (let i = n - 1; i > 0; i--) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    const j = x % (i + 1);
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  return order;
}

/** Seconds to read every record once, in `order`, through `pool` (emptied first). */
async function poolRound(pool: ExpertPool, order: number[]): Promise<number> {
  const { perLayer } = pool;
  pool.evictAll();
  const t0 = performance.now();
  // In windows of the pool's size: a record is released at once (nothing pins it), so a
  // window larger than the pool would push out records whose reads are still queued.
  for (let w = 0; w < order.length; w += pool.capacity) {
    const waits: Promise<void>[] = [];
    for (const r of order.slice(w, w + pool.capacity)) {
      const l = Math.floor(r / perLayer);
      waits.push(pool.acquire(l, [r % perLayer]).ready);
      pool.release(l);
    }
    await Promise.all(waits);
  }
  return (performance.now() - t0) / 1000;
}

/**
 * Every record `repeat` times (each round a new random order) through one wired pool with
 * `inFlight` reads in flight. The slots are touched once first: a running engine's slots
 * are mapped and warm, fresh memory would add page faults to the first reads.
 */
async function runScheduler(model: ExpertSource, device: DeviceT | undefined, inFlight: number, seed: number, repeat: number, verify = true): Promise<SchedResult> {
  const { layers, perLayer, stride } = model.expertLayout;
  const records = layers * perLayer;
  const io = new IoScheduler({ maxInFlight: inFlight });
  const pool = createExpertPool({ backing: "wired", model, capacity: poolSlots(records, stride), device, scheduler: io, verify });
  for (let s = 0; s < pool.capacity; s++) pool.slotView(s).fill(0);
  let seconds = 0;
  for (let round = 0; round < repeat; round++) seconds += await poolRound(pool, shuffled(records, seed * 131 + round));
  const st = io.stats();
  const verifyMs = pool.verifyStats().ms;
  await pool.close();
  await io.close();
  return {
    bytes: st.completedBytes,
    seconds,
    mbps: st.completedBytes / seconds / 1e6,
    reads: st.reads,
    p50Us: st.service.p50Us,
    p99Us: st.service.p99Us,
    mode: st.mode,
    fallbackReason: st.fallbackReason,
    verifyMs,
  };
}

/** Slots for the benchmark's pool: every record, up to 1 GiB of them. */
function poolSlots(records: number, stride: number): number {
  return Math.min(records, Math.max(64, Math.floor((1 << 30) / stride)));
}

/**
 * The same reads without the scheduler or the pool: node:fs read callbacks, `inFlight`
 * records at a time, into the same kind of slot memory (warm, record i of a round into slot
 * i). What the scheduler's own overhead is measured against. With `splitBytes` > 0 each record
 * is read as parallel requests of at most that many bytes (the same records in flight, so
 * inFlight x requests-per-record reads at once): whether splitting large records pays.
 */
async function runRaw(model: ExpertSource, device: DeviceT | undefined, inFlight: number, seed: number, repeat: number, splitBytes = 0): Promise<number> {
  const { layers, perLayer, stride } = model.expertLayout;
  const records = layers * perLayer;
  const io = new IoScheduler({ maxInFlight: 1 });
  const pool = createExpertPool({ backing: "wired", model, capacity: poolSlots(records, stride), device, scheduler: io });
  const views = Array.from({ length: pool.capacity }, (_, i) => pool.slotView(i).fill(0));
  const file = io.open(model.paths.experts); // opened as the pool's is (O_DIRECT)
  const chunk = splitBytes > 0 ? Math.min(stride, splitBytes) : stride;
  const perRecord = Math.ceil(stride / chunk);
  let seconds = 0;
  for (let round = 0; round < repeat; round++) {
    const order = shuffled(records, seed * 131 + round);
    let next = 0; // request index: record next / perRecord, chunk next % perRecord
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: inFlight * perRecord }, async () => {
        while (next < order.length * perRecord) {
          const q = next++;
          const i = Math.floor(q / perRecord);
          const off = (q % perRecord) * chunk;
          const len = Math.min(chunk, stride - off);
          const view = views[i % views.length]!.subarray(off, off + len);
          const at = order[i]! * stride + off;
          for (let got = 0; got < len; ) got += await fsRead(file, view.subarray(got), at + got);
        }
      }),
    );
    seconds += (performance.now() - t0) / 1000;
  }
  await pool.close();
  await io.close();
  return (records * stride * repeat) / seconds / 1e6;
}

/** Record sizes to measure: preset names (their q4 expert record size) or byte counts. */
function parseSizes(spec: string): { label: string; stride: number }[] {
  return spec.split(",").map((x) => {
    const name = x.trim();
    if ((presetNames as string[]).includes(name)) return { label: name, stride: planExperts(presetConfig(name as PresetName), "q4").stride };
    const n = Number(name);
    if (!(Number.isInteger(n) && n > 0 && n % 4096 === 0))
      throw new Error(`--sizes ${JSON.stringify(name)}: a preset (${presetNames.join(", ")}) or a byte count that is a multiple of 4096`);
    return { label: `${n} B`, stride: n };
  });
}

/** Writes `mb` MB of pseudo-random bytes (not compressible, not sparse) to `path` and syncs it to disk. */
function writeScratch(path: string, mb: number): void {
  const block = new Uint8Array(16 << 20);
  const words = new Uint32Array(block.buffer);
  let x = 0x9e3779b9;
  const fd = openSync(path, "w");
  try {
    for (let written = 0, b = 0; written < mb * 1e6; b++) {
      for (let i = 0; i < words.length; i++) {
        x ^= x << 13;
        x ^= x >>> 17;
        x ^= x << 5;
        words[i] = x >>> 0;
      }
      const n = Math.min(block.length, Math.ceil(mb * 1e6 - written));
      writeSync(fd, block, 0, n);
      written += n;
    }
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** A whole file read as records of `stride` bytes (one layer of them: the pool's policy is then plain LRU). */
function fileAsRecords(path: string, stride: number): ExpertSource & { close(): void } {
  const n = Math.floor(statSync(path).size / stride);
  if (!(stride > 0 && stride % 4096 === 0) || n < 1) throw new Error(`record size ${stride}: a multiple of 4096, at most the size of ${path}`);
  // Each record's xxhash64, as a model's index has them: the pool verifies every read against it.
  const sums: string[] = [];
  const fd = openSync(path, "r");
  const buf = new Uint8Array(stride);
  for (let i = 0; i < n; i++) {
    readSync(fd, buf, 0, stride, i * stride);
    sums.push(checksum(buf));
  }
  closeSync(fd);
  return {
    paths: { experts: path },
    expertLayout: { stride, layers: 1, perLayer: n },
    recordChecksum: (_l, e) => sums[e]!,
    verifyRecord(_l, e, record) {
      if (checksum(record) !== sums[e]) throw new Error(`${path}: record ${e}: checksum mismatch`);
    },
    close() {},
  };
}

interface SizeResult {
  label: string;
  file: string;
  fileBytes: number;
  records: number;
  recordBytes: number;
  readsPerMeasurement: number;
  mode: string;
  fallbackReason: string | null;
  dd: { mbps: number; best: number; runs: number[] } | { error: string | null };
  scheduler: { inFlight: number; mbps: number; best: number; runs: number[]; p50Us: number; p99Us: number };
  /** The same reads with no checksum checks, and what hashing cost: its time over the read time, and the throughput lost. */
  checksum: { noVerifyMbps: number; hashShare: number; throughputCost: number };
  raw: { inFlight: number; mbps: number; best: number };
  rawSplit: { inFlight: number; requestBytes: number; mbps: number; best: number };
  ratio: number | null;
  ratioToRaw: number;
  sweep: { inFlight: number; mbps: number; best: number; p50Us: number; p99Us: number }[];
}

/** dd, scheduler, raw and split raw reads, alternating, then the depth sweep, for one record size. */
async function measure(label: string, model: ExpertSource, device: DeviceT | undefined): Promise<SizeResult> {
  const { layers, perLayer, stride } = model.expertLayout;
  const fileBytes = statSync(model.paths.experts).size;
  const passes = Number(opts.passes);
  const sweep = opts["in-flight"].split(",").map(Number);
  const splitBytes = Number(opts["split-kb"]) * 1024;
  // The headline rows use the scheduler's default depth.
  const main = DEFAULT_MAX_IN_FLIGHT;
  const repeat = Math.max(1, Math.ceil((Number(opts["min-mb"]) * 1e6) / (layers * perLayer * stride)));
  log(`${label}: ${layers * perLayer} records of ${stride} bytes (${(fileBytes / 1e6).toFixed(1)} MB), read ${repeat}x per measurement; ${passes} passes; ${ioThreadPoolSize()} IO threads`);
  const dd: DdResult[] = [];
  const sched: SchedResult[] = [];
  const noVerify: SchedResult[] = [];
  const raw: number[] = [];
  const rawSplit: number[] = [];
  let ddError: string | null = null;
  for (let p = 0; p < passes; p++) {
    const d = runDd(model.paths.experts, repeat);
    if ("error" in d) ddError = d.error;
    else dd.push(d);
    sched.push(await runScheduler(model, device, main, 1000 + p, repeat));
    noVerify.push(await runScheduler(model, device, main, 1000 + p, repeat, false));
    raw.push(await runRaw(model, device, main, 1000 + p, repeat)); // same orders: interleaved, so drift hits all
    rawSplit.push(await runRaw(model, device, main, 1000 + p, repeat, splitBytes));
  }
  const sweepResults = [];
  for (const n of sweep) {
    const runs: SchedResult[] = [];
    for (let p = 0; p < passes; p++) runs.push(await runScheduler(model, device, n, 2000 + p, repeat));
    sweepResults.push({ inFlight: n, mbps: median(runs.map((r) => r.mbps)), best: Math.max(...runs.map((r) => r.mbps)), p50Us: median(runs.map((r) => r.p50Us)), p99Us: median(runs.map((r) => r.p99Us)) });
  }
  const ddMbps = dd.length ? median(dd.map((d) => d.mbps)) : null;
  const schedMbps = median(sched.map((s) => s.mbps));
  return {
    label,
    file: model.paths.experts,
    fileBytes,
    records: layers * perLayer,
    recordBytes: stride,
    readsPerMeasurement: repeat,
    mode: sched[0]!.mode,
    fallbackReason: sched[0]!.fallbackReason,
    dd: ddMbps === null ? { error: ddError } : { mbps: ddMbps, best: Math.max(...dd.map((d) => d.mbps)), runs: dd.map((d) => d.mbps) },
    scheduler: { inFlight: main, mbps: schedMbps, best: Math.max(...sched.map((s) => s.mbps)), runs: sched.map((s) => s.mbps), p50Us: median(sched.map((s) => s.p50Us)), p99Us: median(sched.map((s) => s.p99Us)) },
    checksum: {
      noVerifyMbps: median(noVerify.map((s) => s.mbps)),
      hashShare: median(sched.map((s) => s.verifyMs / 1000 / s.seconds)),
      throughputCost: 1 - schedMbps / median(noVerify.map((s) => s.mbps)),
    },
    raw: { inFlight: main, mbps: median(raw), best: Math.max(...raw) },
    rawSplit: { inFlight: main, requestBytes: Math.min(splitBytes, stride), mbps: median(rawSplit), best: Math.max(...rawSplit) },
    ratio: ddMbps ? schedMbps / ddMbps : null,
    ratioToRaw: schedMbps / median(raw),
    sweep: sweepResults,
  };
}

function printSize(r: SizeResult, fs: string | null, device: string): void {
  const f = (x: number) => x.toFixed(0).padStart(6);
  console.log(`\nbench:io  ${r.label}: ${r.file} (${fs ?? "?"}), ${r.records} records x ${r.recordBytes} B = ${(r.fileBytes / 1e6).toFixed(1)} MB, read ${r.readsPerMeasurement}x per measurement`);
  console.log(`  scheduler reads: ${r.mode}${r.fallbackReason ? ` (${r.fallbackReason})` : ""}; ${device}; ${ioThreadPoolSize()} IO threads; median of ${opts.passes} passes\n`);
  console.log("                                          MB/s   best");
  if ("mbps" in r.dd) console.log(`  dd bs=1M iflag=direct (sequential)    ${f(r.dd.mbps)} ${f(r.dd.best)}`);
  else console.log(`  dd: ${r.dd.error}`);
  const n = String(r.scheduler.inFlight).padStart(2);
  console.log(`  scheduler, random order, ${n} in flight  ${f(r.scheduler.mbps)} ${f(r.scheduler.best)}   read p50 ${r.scheduler.p50Us.toFixed(0)} us, p99 ${r.scheduler.p99Us.toFixed(0)} us`);
  console.log(`  same, without checksum checks         ${f(r.checksum.noVerifyMbps)}          checksums (xxhash64 on worker threads): main-thread hashing ${(r.checksum.hashShare * 100).toFixed(1)}% of read time, throughput cost ${(r.checksum.throughputCost * 100).toFixed(1)}%`);
  console.log(`  raw fs.read, same order, ${n} in flight  ${f(r.raw.mbps)} ${f(r.raw.best)}   (no scheduler, no pool)`);
  console.log(`  raw, each record as ${(r.rawSplit.requestBytes / 1024).toFixed(0)} KiB requests ${f(r.rawSplit.mbps)} ${f(r.rawSplit.best)}   (${n} records in flight)`);
  if (r.ratio !== null) console.log(`  ratio scheduler / dd: ${r.ratio.toFixed(2)}; scheduler / raw fs.read: ${r.ratioToRaw.toFixed(2)}`);
  console.log("\n  in flight   MB/s   best   p50 us   p99 us");
  for (const s of r.sweep) console.log(`  ${String(s.inFlight).padStart(9)} ${f(s.mbps)} ${f(s.best)} ${s.p50Us.toFixed(0).padStart(8)} ${s.p99Us.toFixed(0).padStart(8)}`);
}

let cleanup: string | null = null;
let fs: string | null = null;
const sources: { label: string; model: ExpertSource & { close(): void } }[] = [];
if (opts.file) {
  fs = fsType(opts.file);
  sources.push({ label: `${opts.file} as ${opts.stride ?? 65536} B records`, model: fileAsRecords(opts.file, Number(opts.stride ?? 65536)) });
} else if (opts.model) {
  fs = fsType(opts.model);
  sources.push({ label: opts.model, model: await openModel(opts.model) });
} else {
  const b = benchDir();
  cleanup = b.dir;
  fs = b.fs;
  if (opts.preset) {
    log(`synthesizing ${opts.preset} into ${b.dir} (${b.fs ?? "unknown fs"}) ...`);
    await synthesize({ preset: opts.preset as PresetName, seed: 1, out: b.dir, weights: "q4" });
    sources.push({ label: `${opts.preset} preset`, model: await openModel(b.dir) });
  } else {
    const path = join(b.dir, "scratch.bin");
    log(`writing ${opts["file-mb"]} MB of scratch data to ${path} (${b.fs ?? "unknown fs"}) ...`);
    writeScratch(path, Number(opts["file-mb"]));
    for (const { label, stride } of parseSizes(opts.sizes)) sources.push({ label: `${label} record`, model: fileAsRecords(path, stride) });
  }
}

try {
  let device: DeviceT | undefined;
  let deviceNote: string | null = null;
  try {
    device = Device.open();
  } catch (e) {
    deviceNote = `no shim device (${(e as Error).message.split("\n")[0]}): slots in host memory`;
  }
  const results: SizeResult[] = [];
  for (const s of sources) {
    results.push(await measure(s.label, s.model, device));
    s.model.close();
  }
  device?.close();
  const where = deviceNote ?? "shim buffers";
  if (opts.json) {
    console.log(JSON.stringify({ bench: "io", fs, ioThreads: ioThreadPoolSize(), passes: Number(opts.passes), device: where, sizes: results }));
  } else {
    for (const r of results) printSize(r, fs, where);
    console.log(`\n  scheduler / dd:  ${results.map((r) => `${r.label} ${r.ratio === null ? "n/a" : r.ratio.toFixed(2)}`).join(";  ")}`);
    console.log(`  scheduler / raw: ${results.map((r) => `${r.label} ${r.ratioToRaw.toFixed(2)}`).join(";  ")}`);
  }
} finally {
  if (cleanup) rmSync(cleanup, { recursive: true, force: true });
}
