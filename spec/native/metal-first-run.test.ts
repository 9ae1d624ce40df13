// Issue 20: what a review predicts breaks on Metal's first run, pinned on Linux. Limits are
// emulated by the CPU backend (each case runs in its own process: the variables are read when
// a device opens); the Objective-C side is checked by compiling it against the transcribed SDK
// declarations (metal-shim/metal/check.ts).
import { expect, test } from "bun:test";
import { join } from "node:path";

const ROOT = join(import.meta.dir, "..", "..");

function run(args: string[], env: Record<string, string>) {
  const proc = Bun.spawnSync([process.execPath, ...args], { cwd: ROOT, env: { ...process.env, CHERENKOV_BACKEND: "cpu", ...env } });
  return { code: proc.exitCode, output: proc.stdout.toString() + proc.stderr.toString() };
}
const lastJson = (output: string) => JSON.parse(output.trim().split("\n").pop()!);

// ---- item 2: threadgroup sizes from the pipeline's maximum -----------------------------------

test("sampling and argmax at real vocabularies fit a pipeline that refuses 1024 threads (Metal lowers the maximum)", () => {
  // The sampling suite draws at vocabularies up to 5003 (1024 threads asked) and checks every
  // token against the reference sampler; the output suite runs argmax at large vocabularies.
  const r = run(["test", "--timeout", "120000", "spec/kernels/sampling.test.ts", "spec/kernels/output.test.ts"], { CHERENKOV_CPU_MAX_THREADS: "256" });
  if (r.code !== 0) console.error(r.output.slice(-4000));
  expect(r.output).not.toContain("exceeds the pipeline's maximum");
  expect(r.code).toBe(0);
  expect(r.output).toMatch(/^\s*0 fail$/m);
}, 300_000);

// ---- item 3: GPU waits under an OS limit ------------------------------------------------------

test("an OS limit on GPU event waits ends a command buffer as Metal does (emulated), unless the engine's watchdog fires first", () => {
  const script = `import { Device } from "./lib/shim.ts";
const d = Device.open({ backend: "cpu" });
const ev = d.event();
const out = { limit: d.limits.gpuWaitLimitMs };
for (const timeout of [10000, 300]) {
  d.setWaitTimeout(timeout);
  const cb = d.commandBuffer().wait(ev, 1).commit();
  try { cb.waitUntilCompleted(20000); out[timeout] = "completed"; } catch (e) { out[timeout] = e.message; }
}
console.log(JSON.stringify(out));`;
  const r = run(["-e", script], { CHERENKOV_CPU_GPU_WAIT_LIMIT_MS: "800" });
  expect(r.code).toBe(0);
  const out = lastJson(r.output);
  expect(out.limit).toBe(800);
  expect(out["10000"]).toMatch(/^command buffer 1: the GPU stopped it: Timeout \(the system ended a wait for event 1 >= 1 after its 800 ms limit\)$/);
  expect(out["300"]).toBe("command buffer 2: wait for event 1 >= 1 timed out after 300 ms");
});

test("the engine keeps its watchdog below the OS's limit: a slow expert read fails with the engine's message, not Metal's", () => {
  // The default 10 s watchdog would outlast a 1.6 s OS limit: the engine lowers it to 1.2 s.
  const script = `import { Model } from "./lib/api/model.ts";
import { buildGoldenModel } from "./spec/golden/golden.ts";
import { goldenCases } from "./spec/golden/cases.ts";
import { fsRead } from "./lib/gpu/streaming.ts";
import { rmSync } from "node:fs";
const dir = await buildGoldenModel(goldenCases.find((x) => x.name === "tiny-all-s1"));
let armed = false, fired = false;
const reader = async (file, into, position) => {
  if (armed && !fired) { fired = true; await new Promise((r) => setTimeout(r, 4000)); }
  return fsRead(file, into, position);
};
const model = await Model.load(dir, { backend: "cpu", engine: { poolSlots: 2, io: { reader } } });
const s = model.session();
await s.append([1, 2, 3]);
armed = true;
let message = "";
try { await s.generate({ maxTokens: 4, stopAtEos: false }); } catch (e) { message = e.message; }
const notes = JSON.stringify(model.stats()).match(/GPU wait watchdog [^"]*/)?.[0] ?? "";
await model.close();
rmSync(dir, { recursive: true, force: true });
console.log(JSON.stringify({ message, notes }));`;
  const r = run(["-e", script], { CHERENKOV_CPU_GPU_WAIT_LIMIT_MS: "1600" });
  if (r.code !== 0) console.error(r.output.slice(-3000));
  expect(r.code).toBe(0);
  const out = lastJson(r.output);
  expect(out.message).toMatch(/gave up waiting for (layer \d+'s|the MTP head's) slot table: command buffer \d+: wait for event \d+ >= \d+ timed out after 1200 ms$/);
  expect(out.notes).toContain("GPU wait watchdog 1200 ms (asked 10000)");
}, 60_000);

// ---- item 4: mapped backing, read-only and shared ----------------------------------------------

test("--backing mapped maps experts.bin read-only and shared (the page cache's pages), and unmaps it at close", async () => {
  if (process.platform !== "linux") return; // /proc/self/maps
  const { tinyModel } = await import("../engine/fixture.ts");
  const { createExpertPool } = await import("../../lib/gpu/residency.ts");
  const { Device } = await import("../../lib/shim.ts");
  const { readFileSync } = await import("node:fs");
  const tiny = await tinyModel(5);
  const device = Device.open({ backend: "cpu" });
  const maps = () => readFileSync("/proc/self/maps", "utf8").split("\n").filter((l) => l.endsWith(tiny.model.paths.experts));
  try {
    const x = tiny.model.expertLayout;
    const pool = createExpertPool({ backing: "mapped", model: tiny.model, capacity: x.perLayer, device });
    const lines = maps();
    expect(lines.length).toBe(1);
    expect(lines[0]!.split(/\s+/)[1]).toBe("r--s");
    // The slots read the file's bytes.
    const a = pool.acquire(0, [0, 1]);
    await a.ready;
    const want = readFileSync(tiny.model.paths.experts).subarray(x.stride, 2 * x.stride);
    expect(Buffer.compare(pool.slotView(a.slotOf[1]!), want)).toBe(0);
    pool.release(0);
    await pool.close();
    expect(maps()).toEqual([]);
  } finally {
    device.close();
    tiny.cleanup();
  }
});
