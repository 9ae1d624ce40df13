/**
 * `bun run bench:io`: the streaming IO scheduler against the disk's own bandwidth.
 *
 * Reads every expert record of a model in a seeded random order through the engine's wired
 * pool (lib/gpu/residency.ts: shim buffers as slots, the IO scheduler, O_DIRECT on Linux),
 * and times `dd if=experts.bin of=/dev/null bs=1M iflag=direct` on the same file in the
 * same run, alternating the two (and raw node:fs reads without the scheduler) for --passes
 * rounds, at the scheduler's default depth. Then sweeps the reads in flight (1, 4, 8, 16). Prints a table, or one JSON object with --json.
 *
 * Options: --model DIR (default: synthesize --preset, default small, into a folder on a
 * real disk: not tmpfs, which would measure memory), --dir DIR (where to synthesize),
 * --file PATH --stride BYTES (any file read as records of that size, e.g. to see larger
 * records than the small preset's 64 KiB), --passes N (default 3), --min-mb N (each measurement reads the file as many times as it
 * takes to move at least N MB, default 256: the small preset's 19 MB alone is over in tens
 * of milliseconds), --in-flight 1,4,8,16, --json.
 *
 * Bun's file IO pool is sized once, at process start, from UV_THREADPOOL_SIZE (else about
 * the core count); reads in flight beyond it only queue. When it is unset this script runs
 * itself again with UV_THREADPOOL_SIZE=16 so the sweep means what it says.
 */
import { existsSync, mkdtempSync, readFileSync, realpathSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";

const SWEEP_THREADS = 16;
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
    preset: { type: "string", default: "small" },
    passes: { type: "string", default: "3" },
    "min-mb": { type: "string", default: "256" },
    "in-flight": { type: "string", default: "1,4,8,16" },
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
async function runScheduler(model: ExpertSource, device: DeviceT | undefined, inFlight: number, seed: number, repeat: number): Promise<SchedResult> {
  const { layers, perLayer, stride } = model.expertLayout;
  const records = layers * perLayer;
  const io = new IoScheduler({ maxInFlight: inFlight });
  const pool = createExpertPool({ backing: "wired", model, capacity: poolSlots(records, stride), device, scheduler: io });
  for (let s = 0; s < pool.capacity; s++) pool.slotView(s).fill(0);
  let seconds = 0;
  for (let round = 0; round < repeat; round++) seconds += await poolRound(pool, shuffled(records, seed * 131 + round));
  const st = io.stats();
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
  };
}

/** Slots for the benchmark's pool: every record, up to 1 GiB of them. */
function poolSlots(records: number, stride: number): number {
  return Math.min(records, Math.max(64, Math.floor((1 << 30) / stride)));
}

/**
 * The same reads without the scheduler or the pool: node:fs read callbacks, `inFlight` at a
 * time, into the same kind of slot memory (warm, record i of a round into slot i). What the
 * scheduler's own overhead is measured against.
 */
async function runRaw(model: ExpertSource, device: DeviceT | undefined, inFlight: number, seed: number, repeat: number): Promise<number> {
  const { layers, perLayer, stride } = model.expertLayout;
  const records = layers * perLayer;
  const io = new IoScheduler({ maxInFlight: 1 });
  const pool = createExpertPool({ backing: "wired", model, capacity: poolSlots(records, stride), device, scheduler: io });
  const views = Array.from({ length: pool.capacity }, (_, i) => pool.slotView(i).fill(0));
  const file = io.open(model.paths.experts); // opened as the pool's is (O_DIRECT)
  let seconds = 0;
  for (let round = 0; round < repeat; round++) {
    const order = shuffled(records, seed * 131 + round);
    let next = 0;
    const t0 = performance.now();
    await Promise.all(
      Array.from({ length: inFlight }, async () => {
        while (next < order.length) {
          const i = next++;
          const view = views[i % views.length]!;
          const at = order[i]! * stride;
          for (let got = 0; got < stride; ) got += await fsRead(file, view.subarray(got), at + got);
        }
      }),
    );
    seconds += (performance.now() - t0) / 1000;
  }
  await pool.close();
  await io.close();
  return (records * stride * repeat) / seconds / 1e6;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

let cleanup: string | null = null;
let modelDir = "";
let where: { fs: string | null } = { fs: null };
if (opts.file) {
  where = { fs: fsType(opts.file) };
} else if (opts.model) {
  modelDir = opts.model;
  where = { fs: fsType(modelDir) };
} else {
  const b = benchDir();
  cleanup = b.dir;
  modelDir = b.dir;
  where = b;
  log(`synthesizing ${opts.preset} into ${b.dir} (${b.fs ?? "unknown fs"}) ...`);
  await synthesize({ preset: opts.preset as PresetName, seed: 1, out: modelDir, weights: "q4" });
}

try {
  let model: ExpertSource & { close(): void };
  if (opts.file) {
    const recordBytes = Number(opts.stride ?? 65536);
    const n = Math.floor(statSync(opts.file).size / recordBytes);
    if (!(recordBytes > 0 && recordBytes % 4096 === 0) || n < 1) throw new Error(`--stride ${opts.stride}: a multiple of 4096, at most the file's size`);
    model = { paths: { experts: opts.file }, expertLayout: { stride: recordBytes, layers: n, perLayer: 1 }, close() {} };
  } else {
    model = await openModel(modelDir);
  }
  const { layers, perLayer, stride } = model.expertLayout;
  const fileBytes = statSync(model.paths.experts).size;
  let device: DeviceT | undefined;
  let deviceNote: string | null = null;
  try {
    device = Device.open();
  } catch (e) {
    deviceNote = `no shim device (${(e as Error).message.split("\n")[0]}): slots in host memory`;
  }
  const passes = Number(opts.passes);
  const sweep = opts["in-flight"].split(",").map(Number);
  // The headline row uses the scheduler's default depth.
  const main = sweep.includes(DEFAULT_MAX_IN_FLIGHT) ? DEFAULT_MAX_IN_FLIGHT : sweep[sweep.length - 1]!;
  const repeat = Math.max(1, Math.ceil((Number(opts["min-mb"]) * 1e6) / fileBytes));
  log(`${layers * perLayer} records of ${stride} bytes (${(fileBytes / 1e6).toFixed(1)} MB), read ${repeat}x per measurement; ${passes} passes; ${ioThreadPoolSize()} IO threads`);

  const dd: DdResult[] = [];
  const sched: SchedResult[] = [];
  const raw: number[] = [];
  let ddError: string | null = null;
  for (let p = 0; p < passes; p++) {
    const d = runDd(model.paths.experts, repeat);
    if ("error" in d) ddError = d.error;
    else dd.push(d);
    sched.push(await runScheduler(model, device, main, 1000 + p, repeat));
    raw.push(await runRaw(model, device, main, 1000 + p, repeat)); // same orders: interleaved, so drift hits both
  }
  const sweepResults = [];
  for (const n of sweep) {
    const runs: SchedResult[] = [];
    for (let p = 0; p < passes; p++) runs.push(await runScheduler(model, device, n, 2000 + p, repeat));
    sweepResults.push({ inFlight: n, mbps: median(runs.map((r) => r.mbps)), best: Math.max(...runs.map((r) => r.mbps)), p50Us: median(runs.map((r) => r.p50Us)), p99Us: median(runs.map((r) => r.p99Us)) });
  }
  device?.close();
  model.close();

  const ddMbps = dd.length ? median(dd.map((d) => d.mbps)) : null;
  const schedMbps = median(sched.map((s) => s.mbps));
  const result = {
    bench: "io",
    file: model.paths.experts,
    fs: where.fs,
    fileBytes,
    records: layers * perLayer,
    recordBytes: stride,
    passes,
    readsPerMeasurement: repeat,
    ioThreads: ioThreadPoolSize(),
    mode: sched[0]!.mode,
    fallbackReason: sched[0]!.fallbackReason,
    device: deviceNote ?? "shim buffers",
    dd: ddMbps === null ? { error: ddError } : { mbps: ddMbps, best: Math.max(...dd.map((d) => d.mbps)), runs: dd.map((d) => d.mbps) },
    scheduler: { inFlight: main, mbps: schedMbps, best: Math.max(...sched.map((s) => s.mbps)), runs: sched.map((s) => s.mbps), p50Us: median(sched.map((s) => s.p50Us)), p99Us: median(sched.map((s) => s.p99Us)) },
    raw: { inFlight: main, mbps: median(raw), best: Math.max(...raw) },
    ratio: ddMbps ? schedMbps / ddMbps : null,
    ratioToRaw: schedMbps / median(raw),
    sweep: sweepResults,
  };
  if (opts.json) {
    console.log(JSON.stringify(result));
  } else {
    const f = (x: number) => x.toFixed(0).padStart(6);
    console.log(`bench:io  ${result.file} (${where.fs ?? "?"}), ${result.records} records x ${stride} B = ${(fileBytes / 1e6).toFixed(1)} MB, read ${repeat}x per measurement`);
    console.log(`  scheduler reads: ${result.mode}${result.fallbackReason ? ` (${result.fallbackReason})` : ""}; ${result.device}; ${result.ioThreads} IO threads; median of ${passes} passes\n`);
    console.log("                                        MB/s   best");
    if (ddMbps !== null) console.log(`  dd bs=1M iflag=direct (sequential)  ${f(ddMbps)} ${f(result.dd.best!)}`);
    else console.log(`  dd: ${ddError}`);
    console.log(`  scheduler, random order, ${String(main).padStart(2)} in flight ${f(schedMbps)} ${f(result.scheduler.best)}   read p50 ${result.scheduler.p50Us.toFixed(0)} us, p99 ${result.scheduler.p99Us.toFixed(0)} us`);
    console.log(`  raw fs.read, same order, ${String(main).padStart(2)} in flight ${f(result.raw.mbps)} ${f(result.raw.best)}   (no scheduler, no pool)`);
    if (result.ratio !== null) console.log(`  ratio scheduler / dd: ${result.ratio.toFixed(2)}; scheduler / raw fs.read: ${result.ratioToRaw.toFixed(2)}`);
    console.log("\n  in flight   MB/s   best   p50 us   p99 us");
    for (const s of sweepResults)
      console.log(`  ${String(s.inFlight).padStart(9)} ${f(s.mbps)} ${f(s.best)} ${s.p50Us.toFixed(0).padStart(8)} ${s.p99Us.toFixed(0).padStart(8)}`);
  }
} finally {
  if (cleanup) rmSync(cleanup, { recursive: true, force: true });
}
