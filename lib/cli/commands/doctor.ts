// `cherenkov doctor [DIR]`: what this machine gives the engine, for a first run and for bug
// reports: the backend `auto` picks and why, each usable backend's device limits, the native
// library's build (architecture; on macOS the SDK it was built with and the oldest macOS it
// loads on), the wired-memory limit (macOS), and with a model directory the expert pool the
// default budget gives it. Useful on every platform; nothing here loads a model.
import { existsSync, readFileSync } from "node:fs";
import { cpus, totalmem } from "node:os";
import { autoBackend } from "../../api/auto-backend.ts";
import { BudgetError, formatBytes } from "../../gpu/budget.ts";
import { defaultPoolPlan } from "../../gpu/load.ts";
import { openModel } from "../../model/format.ts";
import { libraryProblem, localLibraryPath, type Backend } from "../../native-library.ts";
import { Device, hasNvidiaGpu, type DeviceLimits } from "../../shim.ts";
import { parseFlags, UsageError, type FlagSpec } from "../args.ts";
import type { CliIO } from "../io.ts";

export const DOCTOR_FLAGS: FlagSpec = { json: { type: "boolean" }, "probe-gpu-wait": { type: "string" }, backend: { type: "string" } };

export const doctorUsage = `cherenkov doctor [DIR] [--json]
  Says what this machine gives the engine: the backend auto picks and why, each native
  backend's device limits (largest buffer, working set, page, SIMD width, GPU cores),
  the native library's build, the wired-memory limit (macOS), and with a model DIR the
  expert pool the default budget gives it. Send its output with a bug report.
    --json                one JSON object instead of the text
    --probe-gpu-wait S    hold one GPU event wait for S seconds (the watchdog lifted), then
                          release it: says whether the OS let the command buffer wait that
                          long, and its error if not (learns Metal's undocumented limit)
    --backend B           the backend the probe uses (metal, cuda, cpu; default: the GPU's)`;

/** What the native library file says about its build: architecture, and for Mach-O the SDK and the oldest macOS. */
export interface LibraryBuild {
  format: "ELF" | "Mach-O" | "unknown";
  arch: string;
  sdk?: string;
  minOS?: string;
}

const version = (v: number) => `${v >>> 16}.${(v >>> 8) & 0xff}${v & 0xff ? `.${v & 0xff}` : ""}`;

/** Reads a shared library's header: ELF e_machine, or Mach-O cputype and LC_BUILD_VERSION. */
export function libraryBuild(bytes: Uint8Array): LibraryBuild {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (bytes.length >= 20 && v.getUint32(0, false) === 0x7f454c46) {
    const machine = v.getUint16(18, true);
    return { format: "ELF", arch: ({ 62: "x86_64", 183: "arm64" } as Record<number, string>)[machine] ?? `e_machine ${machine}` };
  }
  if (bytes.length >= 32 && v.getUint32(0, true) === 0xfeedfacf) {
    const cputype = v.getUint32(4, true);
    const out: LibraryBuild = { format: "Mach-O", arch: cputype === 0x0100000c ? "arm64" : cputype === 0x01000007 ? "x86_64" : `cputype ${cputype}` };
    const ncmds = v.getUint32(16, true);
    let at = 32;
    for (let i = 0; i < ncmds && at + 8 <= bytes.length; i++) {
      const cmd = v.getUint32(at, true);
      if (cmd === 0x32 /* LC_BUILD_VERSION: platform, minos, sdk */) {
        out.minOS = version(v.getUint32(at + 12, true));
        out.sdk = version(v.getUint32(at + 16, true));
      }
      at += v.getUint32(at + 4, true);
    }
    return out;
  }
  return { format: "unknown", arch: "unknown" };
}

/** A command's trimmed stdout, or null when it is missing or fails. */
function probe(argv: string[]): string | null {
  try {
    const r = Bun.spawnSync(argv, { stderr: "ignore" });
    return r.exitCode === 0 ? r.stdout.toString().trim() : null;
  } catch {
    return null;
  }
}

/** macOS only: GPU cores from IOKit's registry (Metal does not report them). */
function appleGpuCores(): number | null {
  const text = probe(["ioreg", "-rc", "AGXAccelerator", "-d", "1"]);
  const m = text ? /"gpu-core-count"\s*=\s*(\d+)/.exec(text) : null;
  return m ? Number(m[1]) : null;
}

interface BackendReport {
  backend: Backend;
  library: string;
  problem?: string;
  build?: LibraryBuild;
  device?: string;
  limits?: DeviceLimits;
}

function probeBackend(backend: Backend): BackendReport {
  const library = localLibraryPath(backend);
  const problem = libraryProblem(backend);
  const report: BackendReport = { backend, library };
  if (existsSync(library)) report.build = libraryBuild(readFileSync(library).subarray(0, 65536));
  if (problem) return { ...report, problem };
  try {
    const d = Device.open({ backend });
    try {
      report.device = d.name;
      report.limits = { ...d.limits };
      if (backend === "metal" && !report.limits.gpuCores) report.limits.gpuCores = appleGpuCores() ?? 0;
    } finally {
      d.close();
    }
  } catch (e) {
    report.problem = e instanceof Error ? e.message : String(e);
  }
  return report;
}

/** The backends worth probing here: the platform's GPU backend when it can exist, and the cpu engine. */
function backendsHere(): BackendReport[] {
  if (process.platform === "darwin") return [probeBackend("metal"), probeBackend("cpu")];
  if (hasNvidiaGpu()) return [probeBackend("cuda"), probeBackend("cpu")];
  const cuda: BackendReport = { backend: "cuda", library: localLibraryPath("cuda"), problem: "no NVIDIA GPU here (no /dev/nvidia0 or /dev/nvidiactl)" };
  if (existsSync(cuda.library)) cuda.build = libraryBuild(readFileSync(cuda.library).subarray(0, 65536));
  return [cuda, probeBackend("cpu")];
}

export interface WaitProbe {
  backend: Backend;
  seconds: number;
  /** "completed": the GPU waited the whole time; otherwise the command buffer's error. */
  outcome: string;
  elapsedMs: number;
}

/**
 * Holds one GPU-side event wait for `seconds` with the device's watchdog lifted, then sets the
 * event from the host. Apple documents that the OS may end a command buffer that waits too long
 * for an event (MTLCommandBufferErrorTimeout) but gives no number: this measures it.
 */
export async function probeGpuWait(backend: Backend, seconds: number): Promise<WaitProbe> {
  const d = Device.open({ backend });
  try {
    const ev = d.event();
    d.setWaitTimeout(Math.min(2 ** 32 - 1, Math.round(seconds * 1000) + 600_000));
    const t0 = performance.now();
    const cb = d.commandBuffer().wait(ev, 1).commit();
    const release = setTimeout(() => ev.set(1), seconds * 1000);
    let outcome = "completed";
    let elapsedMs = 0;
    // Poll, so the host's timer can fire: the wait itself never blocks the event loop for long.
    for (;;) {
      const state = cb.status;
      if (state === "completed" || state === "failed") {
        elapsedMs = performance.now() - t0;
        if (state === "failed") outcome = cb.error;
        break;
      }
      await Bun.sleep(20);
    }
    clearTimeout(release);
    ev.set(1);
    cb.release();
    ev.release();
    return { backend, seconds, outcome, elapsedMs: Math.round(elapsedMs) };
  } finally {
    d.close();
  }
}

export async function doctorCommand(argv: string[], io: CliIO): Promise<number> {
  const { flags, positionals } = parseFlags(argv, DOCTOR_FLAGS, 1);
  if (flags["probe-gpu-wait"] !== undefined) {
    const seconds = Number(flags["probe-gpu-wait"]);
    if (!(seconds > 0 && seconds <= 3600)) throw new UsageError(`--probe-gpu-wait ${flags["probe-gpu-wait"]}: expected seconds in (0, 3600]`);
    const asked = flags.backend as string | undefined;
    if (asked !== undefined && asked !== "metal" && asked !== "cuda" && asked !== "cpu") throw new UsageError(`--backend ${asked}: expected metal, cuda or cpu`);
    const backend = (asked as Backend | undefined) ?? backendsHere().find((b) => !b.problem)?.backend ?? "cpu";
    const r = await probeGpuWait(backend, seconds);
    if (flags.json) io.stdout(JSON.stringify(r) + "\n");
    else
      io.stdout(
        r.outcome === "completed"
          ? `${backend}: a GPU event wait of ${seconds} s completed (released by the host after ${r.elapsedMs} ms): the OS allows at least that\n`
          : `${backend}: the GPU event wait ended after ${r.elapsedMs} ms, before the host released it at ${seconds} s: ${r.outcome}\n` +
            `  set CHERENKOV_METAL_GPU_WAIT_LIMIT_MS to a little less than ${r.elapsedMs} so the engine's watchdog fires first\n`,
      );
    return 0;
  }
  let auto: { backend: string; reason: string };
  try {
    auto = autoBackend();
  } catch (e) {
    auto = { backend: "none", reason: e instanceof Error ? e.message : String(e) };
  }
  const host = { platform: process.platform, arch: process.arch, cpu: cpus()[0]?.model ?? "unknown", cores: cpus().length, memory: totalmem(), bun: Bun.version };
  // macOS: the GPU's wired-memory limit (0 = the OS default, about 65-75% of RAM).
  const wiredLimitMb = process.platform === "darwin" ? probe(["sysctl", "-n", "iogpu.wired_limit_mb"]) : null;
  const backends = backendsHere();

  let model: Record<string, unknown> | undefined;
  const dir = positionals[0];
  if (dir) {
    const files = await openModel(dir);
    try {
      // The pool the model gets: on auto's backend when it is a device backend, else the first here.
      const device = backends.find((b) => b.limits && b.backend === auto.backend) ?? backends.find((b) => b.limits);
      model = { dir, experts: files.expertLayout.layers * files.expertLayout.perLayer, recordBytes: files.expertLayout.stride };
      if (device?.limits) {
        try {
          const p = defaultPoolPlan(files, device.limits);
          model.pool = { backend: device.backend, slots: p.plan.slots, bytes: p.plan.bytes, buffers: p.buffers, reason: p.plan.reason };
        } catch (e) {
          if (!(e instanceof BudgetError)) throw e;
          model.pool = { backend: device.backend, problem: e.message };
        }
      }
    } finally {
      files.close();
    }
  }

  const report = { auto, host, wiredLimitMb: wiredLimitMb === null ? undefined : Number(wiredLimitMb), backends, model };
  if (flags.json) {
    io.stdout(JSON.stringify(report) + "\n");
    return 0;
  }
  const lines: string[] = [];
  lines.push(`auto backend: ${auto.backend} (${auto.reason})`);
  lines.push(`host: ${host.platform} ${host.arch}, ${host.cpu} x ${host.cores}, ${formatBytes(host.memory)} RAM, bun ${host.bun}`);
  if (wiredLimitMb !== null) lines.push(`wired limit: iogpu.wired_limit_mb = ${wiredLimitMb}${wiredLimitMb === "0" ? " (the OS default)" : ""}`);
  for (const b of backends) {
    const build = b.build ? `${b.build.format} ${b.build.arch}${b.build.sdk ? `, macOS SDK ${b.build.sdk}, loads on macOS ${b.build.minOS}` : ""}` : "not built";
    lines.push(`${b.backend}: ${b.library} (${build})`);
    if (b.problem) lines.push(`  unavailable: ${b.problem.split("\n")[0]}`);
    if (b.device && b.limits) {
      const l = b.limits;
      lines.push(`  device: ${b.device}`);
      lines.push(`  largest buffer ${l.maxBufferLength >= 2 ** 53 ? "no limit" : formatBytes(l.maxBufferLength)}, working set ${formatBytes(l.maxWorkingSet)}, page ${l.pageSize} B, SIMD width ${l.simdWidth}`);
      lines.push(`  GPU cores ${l.gpuCores || "unknown"}, threadgroup ${l.maxThreadsPerThreadgroup} threads / ${l.maxThreadgroupMemory} B, GPU wait limit ${l.gpuWaitLimitMs ? `${l.gpuWaitLimitMs} ms` : "none known"}`);
    }
  }
  if (model) {
    lines.push(`model: ${model.dir}: ${model.experts} expert records of ${formatBytes(model.recordBytes as number)}`);
    const pool = model.pool as { backend: string; slots?: number; bytes?: number; buffers?: number; reason?: string; problem?: string } | undefined;
    if (!pool) lines.push("  pool: no backend here to plan it on");
    else if (pool.problem) lines.push(`  pool (${pool.backend}): ${pool.problem}`);
    else lines.push(`  pool (${pool.backend}, default budget): ${pool.slots} records, ${formatBytes(pool.bytes!)} in ${pool.buffers} buffer${pool.buffers === 1 ? "" : "s"}; ${pool.reason}`);
  }
  io.stdout(lines.join("\n") + "\n");
  return 0;
}
