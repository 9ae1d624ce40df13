// Limits a Mac has and this machine does not, emulated by the CPU backend so that code
// which ignores them fails here too:
//  - issue 9 item 4: 16 KiB pages (Apple silicon; CHERENKOV_CPU_PAGE_SIZE). The buffer and
//    error suites run again under them, so a size written as "4096" instead of derived from
//    ck_device_page_size fails;
//  - issue 9 item 6: a pipeline's maxTotalThreadsPerThreadgroup below the device's 1024
//    (Metal lowers it for register-heavy kernels; CHERENKOV_CPU_MAX_THREADS). The engine
//    runs with 256, so a threadgroup larger than the pipeline allows fails here too.
import { expect, test } from "bun:test";
import { join } from "node:path";

const ROOT = join(import.meta.dir, "..", "..");

function run(args: string[], env: Record<string, string>) {
  const proc = Bun.spawnSync([process.execPath, ...args], { cwd: ROOT, env: { ...process.env, CHERENKOV_BACKEND: "cpu", ...env } });
  return { code: proc.exitCode, output: proc.stdout.toString() + proc.stderr.toString() };
}

test("the CPU backend emulates 16 KiB pages: reported, buffers rounded and aligned to them", () => {
  const script = `import { Device } from "./lib/shim.ts";
const d = Device.open({ backend: "cpu" });
const b = d.buffer(1000);
console.log(JSON.stringify({ page: d.limits.pageSize, length: b.length, aligned: Number(b.contents) % 16384 === 0 }));`;
  const r = run(["-e", script], { CHERENKOV_CPU_PAGE_SIZE: "16384" });
  expect(r.code).toBe(0);
  expect(JSON.parse(r.output.trim().split("\n").pop()!)).toEqual({ page: 16384, length: 16384, aligned: true });
});

test("a page size that is not a power of two from the OS page fails device open, naming the variable", () => {
  const r = run(["-e", `import { Device } from "./lib/shim.ts"; Device.open({ backend: "cpu" });`], { CHERENKOV_CPU_PAGE_SIZE: "10000" });
  expect(r.code).not.toBe(0);
  expect(r.output).toContain("CHERENKOV_CPU_PAGE_SIZE=10000: expected a power of two");
});

test("buffer, error and event suites pass with 16 KiB pages", () => {
  const r = run(["test", "--timeout", "120000", "spec/native/buffers.test.ts", "spec/native/errors.test.ts", "spec/native/events.test.ts"], {
    CHERENKOV_CPU_PAGE_SIZE: "16384",
  });
  if (r.code !== 0) console.error(r.output.slice(-4000));
  expect(r.code).toBe(0);
  expect(r.output).toMatch(/^\s*0 fail$/m);
}, 300_000);

test("a pipeline limit below 1024 threads is enforced as Metal does, with the same message", () => {
  const script = `import { Device } from "./lib/shim.ts";
const d = Device.open({ backend: "cpu" });
const p = d.pipeline("selftest_add_f32");
const a = d.buffer(1024);
let message = "";
try { d.commandBuffer().dispatch(p, 1, 257, [null, a, a, a], new Uint8Array(24)); } catch (e) { message = e.message; }
console.log(JSON.stringify({ device: d.limits.maxThreadsPerThreadgroup, pipeline: p.maxThreads, message }));`;
  const r = run(["-e", script], { CHERENKOV_CPU_MAX_THREADS: "256" });
  expect(r.code).toBe(0);
  const out = JSON.parse(r.output.trim().split("\n").pop()!);
  expect(out.device).toBe(1024);
  expect(out.pipeline).toBe(256);
  expect(out.message).toMatch(/threadgroup 257x1x1 = 257 threads exceeds the pipeline's maximum of 256$/);
  expect(run(["-e", `import { Device } from "./lib/shim.ts"; Device.open({ backend: "cpu" });`], { CHERENKOV_CPU_MAX_THREADS: "100" }).output).toContain(
    "CHERENKOV_CPU_MAX_THREADS=100: expected a multiple of 32",
  );
});

test("the engine keeps every threadgroup within a 256-thread pipeline limit (and the error suite holds there)", () => {
  const r = run(["test", "--timeout", "120000", "spec/engine-step/models.test.ts", "spec/native/errors.test.ts"], { CHERENKOV_CPU_MAX_THREADS: "256" });
  if (r.code !== 0) console.error(r.output.slice(-4000));
  expect(r.code).toBe(0);
  expect(r.output).toMatch(/^\s*0 fail$/m);
}, 600_000);
