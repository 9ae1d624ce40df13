// `cherenkov doctor` (issue 20 item 7) runs here as it will on a Mac: the backend auto picks,
// each backend's device limits, the library's build, and the pool a model gets by default.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { autoBackend } from "../../lib/api/auto-backend.ts";
import { libraryBuild } from "../../lib/cli/commands/doctor.ts";
import { main } from "../../lib/cli/main.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import { localLibraryPath } from "../../lib/native-library.ts";
import { tempDir } from "../engine-step/helpers.ts";

const ROOT = join(import.meta.dir, "..", "..");
let model: { dir: string; remove(): void };
beforeAll(async () => {
  model = tempDir("doctor");
  await synthesize({ preset: "small", seed: 2, out: model.dir, weights: "q4", workers: 0 });
});
afterAll(() => model.remove());

async function cli(...argv: string[]) {
  let stdout = "";
  let stderr = "";
  const code = await main(argv, { stdout: (t) => (stdout += t), stderr: (t) => (stderr += t), stderrIsTTY: false });
  return { code, stdout, stderr };
}

test("doctor --json: auto's choice and reason, the cpu device's limits, the library's build, the model's default pool", async () => {
  const r = await cli("doctor", model.dir, "--json");
  expect(r.code).toBe(0);
  const out = JSON.parse(r.stdout);
  expect(out.auto).toEqual(autoBackend());
  const cpu = out.backends.find((b: { backend: string }) => b.backend === "cpu");
  expect(cpu.build).toEqual({ format: "ELF", arch: process.arch === "x64" ? "x86_64" : "arm64" });
  expect(cpu.device).toMatch(/^cpu /);
  expect(cpu.limits.pageSize).toBeGreaterThanOrEqual(4096);
  expect(cpu.limits.maxBufferLength).toBe(2 ** 53);
  expect(cpu.limits.gpuCores).toBeGreaterThanOrEqual(1);
  expect(cpu.limits.maxWorkingSet).toBeGreaterThan(0);
  // "small": 9 expert layers x 32 experts, all of which fit this machine's budget.
  expect(out.model.experts).toBe(288);
  // The pool is planned on auto's backend, or (auto: reference) the first backend with device limits.
  const withLimits = out.backends.filter((b: { limits?: unknown }) => b.limits).map((b: { backend: string }) => b.backend);
  const planned = withLimits.includes(out.auto.backend) ? out.auto.backend : withLimits[0];
  expect(out.model.pool).toMatchObject({ backend: planned, slots: 288, buffers: 1 });
  if (process.platform === "linux") expect(out.backends.map((b: { backend: string }) => b.backend)).toEqual(["cuda", "cpu"]);
});

test("doctor as a process: a device whose largest buffer is small gets the pool in several buffers, said in words", () => {
  const proc = Bun.spawnSync([process.execPath, "lib/cli/main.ts", "doctor", model.dir], {
    cwd: ROOT,
    // The cpu device's limit is what the variable narrows: the pool must be sized for cpu.
    env: { ...process.env, CHERENKOV_BACKEND: "cpu", CHERENKOV_CPU_MAX_BUFFER_LENGTH: String(8 * 1024 * 1024) },
  });
  const text = proc.stdout.toString();
  expect(proc.exitCode).toBe(0);
  expect(text).toMatch(/^auto backend: \w+ \(.+\)$/m);
  expect(text).toContain("largest buffer 8.0 MiB");
  expect(text).toMatch(/pool \(cpu, default budget\): 288 records, 18\.0 MiB in 3 buffers; budget: /);
});

test("the library's build is read from its header: ELF here, arm64 Mach-O with the SDK and oldest macOS of LC_BUILD_VERSION", () => {
  expect(libraryBuild(readFileSync(localLibraryPath("cpu")).subarray(0, 64)).format).toBe("ELF");
  // A minimal arm64 dylib header with one LC_BUILD_VERSION (platform macOS, minos 14.0, sdk 15.2).
  const bytes = new Uint8Array(32 + 24);
  const v = new DataView(bytes.buffer);
  v.setUint32(0, 0xfeedfacf, true);
  v.setUint32(4, 0x0100000c, true);
  v.setUint32(16, 1, true);
  v.setUint32(32, 0x32, true);
  v.setUint32(36, 24, true);
  v.setUint32(40, 1, true);
  v.setUint32(44, (14 << 16) | (0 << 8), true);
  v.setUint32(48, (15 << 16) | (2 << 8), true);
  expect(libraryBuild(bytes)).toEqual({ format: "Mach-O", arch: "arm64", minOS: "14.0", sdk: "15.2" });
  expect(libraryBuild(new Uint8Array(8)).format).toBe("unknown");
});

test("doctor --probe-gpu-wait holds one GPU event wait: completed where nothing limits it, the OS's error where something does", () => {
  const probe = (env: Record<string, string>) => {
    const proc = Bun.spawnSync([process.execPath, "lib/cli/main.ts", "doctor", "--probe-gpu-wait", "1.2", "--backend", "cpu", "--json"], {
      cwd: ROOT,
      env: { ...process.env, ...env },
    });
    expect(proc.exitCode).toBe(0);
    return JSON.parse(proc.stdout.toString());
  };
  const free = probe({});
  expect(free.outcome).toBe("completed");
  expect(free.elapsedMs).toBeGreaterThanOrEqual(1150);
  // Emulated OS limit (CHERENKOV_CPU_GPU_WAIT_LIMIT_MS): the probe reports where it ended.
  const limited = probe({ CHERENKOV_CPU_GPU_WAIT_LIMIT_MS: "300" });
  expect(limited.outcome).toBe("command buffer 1: the GPU stopped it: Timeout (the system ended a wait for event 1 >= 1 after its 300 ms limit)");
  expect(limited.elapsedMs).toBeGreaterThanOrEqual(290);
});
