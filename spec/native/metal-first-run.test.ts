// Issue 20: what a review predicts breaks on Metal's first run, pinned on Linux. Limits are
// emulated by the CPU backend (each case runs in its own process: the variables are read when
// a device opens); the Objective-C side is checked by compiling it against the transcribed SDK
// declarations (metal-shim/metal/check.ts).
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { presetConfig } from "../../lib/convert/presets.ts";
import { plannedBytes } from "../../lib/model/writer.ts";
import { Device } from "../../lib/shim.ts";
import { clangPath, findClang, METAL_DIR, OBJC_TARGET, objcFlags, type SdkGeneration } from "../../metal-shim/metal/check.ts";
import { optionalTool } from "../optional-tool.ts";

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
// A host wait holds no GPU: the OS limit does not apply, it lasts until the host sets the event.
d.setWaitTimeout(10000);
d.waitMode = "host";
const ev2 = d.event();
const cb = d.commandBuffer().wait(ev2, 1).commit();
setTimeout(() => ev2.set(1), 1500);
while (cb.status !== "completed" && cb.status !== "failed") await Bun.sleep(20);
out.host = cb.status === "completed" && ev2.value === 1 ? "completed after the host released it" : cb.error;
console.log(JSON.stringify(out));`;
  const r = run(["-e", script], { CHERENKOV_CPU_GPU_WAIT_LIMIT_MS: "800" });
  expect(r.code).toBe(0);
  const out = lastJson(r.output);
  expect(out.limit).toBe(800);
  expect(out.host).toBe("completed after the host released it");
  expect(out["10000"]).toMatch(/^command buffer 1: the GPU stopped it: Timeout \(the system ended a wait for event 1 >= 1 after its 800 ms limit\)$/);
  expect(out["300"]).toBe("command buffer 2: wait for event 1 >= 1 timed out after 300 ms");
});

/** A golden tiny model whose `after`-th expert read (counted from arming) is delayed 4 s. */
const slowRead = (engine: string, armBeforePrompt: boolean) => `import { Model } from "./lib/api/model.ts";
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
const model = await Model.load(dir, { backend: "cpu", engine: { ${engine}, io: { reader } } });
const s = model.session();
armed = ${armBeforePrompt};
let message = "", tokens = [];
try {
  await s.append([1, 2, 3]);
  armed = true;
  tokens = (await s.generate({ maxTokens: 4, stopAtEos: false })).tokens;
} catch (e) { message = e.message; }
const notes = JSON.stringify(model.stats()).match(/(GPU wait watchdog|handshakes wait on the host)[^"]*/)?.[0] ?? "";
const plain = await Model.load(dir, { backend: "cpu", engine: { ${engine} } });
const ps = plain.session();
await ps.append([1, 2, 3]);
const want = (await ps.generate({ maxTokens: 4, stopAtEos: false })).tokens;
await model.close();
await plain.close();
rmSync(dir, { recursive: true, force: true });
console.log(JSON.stringify({ message, notes, tokens, want, fired }));`;

test("a pool that can miss waits on the host under an OS limit: a 4 s read outlasts a 1.6 s limit and the step completes", () => {
  const r = run(["-e", slowRead("poolSlots: 2", false)], { CHERENKOV_CPU_GPU_WAIT_LIMIT_MS: "1600" });
  if (r.code !== 0) console.error(r.output.slice(-3000));
  expect(r.code).toBe(0);
  const out = lastJson(r.output);
  expect(out.fired).toBe(true);
  expect(out.message).toBe("");
  expect(out.tokens).toEqual(out.want);
  expect(out.notes).toBe("handshakes wait on the host: the OS ends GPU event waits after 1600 ms and the pool can miss");
}, 60_000);

test("with every record resident the step stays one command buffer, its watchdog below the OS limit: a slow read fails with the engine's message", () => {
  // The default 10 s watchdog would outlast the 1.6 s limit: the engine lowers it to 1.2 s.
  // No preload: the records must still be read by the steps (the slow one among them).
  const r = run(["-e", slowRead('pool: "100%", preload: false', true)], { CHERENKOV_CPU_GPU_WAIT_LIMIT_MS: "1600" });
  if (r.code !== 0) console.error(r.output.slice(-3000));
  expect(r.code).toBe(0);
  const out = lastJson(r.output);
  // The engine's IO deadline (3/4 of the lowered 1.2 s watchdog) names the late read before
  // either GPU wait gives up.
  expect(out.message).toMatch(/experts\.bin: the read of layer \d+ expert \d+ \(offset \d+\) did not finish within 900 ms/);
  expect(out.notes).toBe("GPU wait watchdog 1200 ms (asked 10000): the OS ends GPU event waits after 1600 ms");
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

// ---- items 5 and 6: the Objective-C, as far as a compiled object shows it ----------------------

const objcChecks = !(process.platform === "darwin" && !clangPath()) &&
  optionalTool({ tool: "clang-19", path: clangPath(), checks: "Metal object checks (spec/native/metal-first-run.test.ts)", enable: "apt-get install clang-19, or set CK_CLANG to a clang 19" });
const scratch = mkdtempSync(join(tmpdir(), "cherenkov-first-run-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));
let objects = 0;
/** The bytes of `file` compiled against one SDK generation's declarations (selector names and strings are in it). */
function objectText(file: string, sdk: SdkGeneration): string {
  const object = join(scratch, `o${objects++}.o`);
  const proc = Bun.spawnSync([findClang(), ...objcFlags(OBJC_TARGET, sdk), "-O2", "-c", join(METAL_DIR, file), "-o", object]);
  expect(proc.stderr.toString()).toBe("");
  expect(proc.exitCode).toBe(0);
  return readFileSync(object).toString("latin1");
}

(objcChecks ? describe : () => {})("Metal objects", () => {
  test("built with the macOS 14 SDK, the library still asks for precise FP32 functions on macOS 15 (by key)", () => {
    const sel14 = objectText("library.m", 14);
    expect(sel14).toContain("setMathFloatingPointFunctions:"); // the respondsToSelector: probe
    expect(sel14).toContain("mathFloatingPointFunctions\0");
    expect(sel14).toContain("mathMode\0");
    expect(sel14).toContain("setValue:forKey:");
    expect(sel14).toContain("setFastMathEnabled:");
    expect(sel14).toContain("___isPlatformVersionAtLeast"); // the @available(macOS 15) check
  });

  test("host waits: the command buffer is cut into parts, enqueued at commit, committed from the gates queue", () => {
    const commands = objectText("commands.m", 15);
    for (const sel of ["enqueue", "commit", "waitUntilCompleted", "waitUntilSignaledValue:timeoutMS:", "signaledValue"]) expect(commands).toContain(sel + "\0");
    expect(commands).toContain("_ck_encode_wait_host");
    expect(objectText("device.m", 15)).toContain("cherenkov.metal.gates");
  });

  test("start-up: the .metal files compile asynchronously, pipelines come from a binary archive; reflection, execution status and signposts wait for CHERENKOV_METAL_DEBUG", () => {
    const library = objectText("library.m", 15);
    expect(library).toContain("newLibraryWithSource:options:completionHandler:");
    expect(library).not.toContain("newLibraryWithSource:options:error:");
    // Pipelines through an on-disk binary archive named by the sources' hash, written back at release.
    for (const sel of ["newBinaryArchiveWithDescriptor:error:", "setBinaryArchives:", "newComputePipelineStateWithDescriptor:options:reflection:error:", "addComputePipelineFunctionsWithDescriptor:error:", "serializeToURL:error:"])
      expect(library).toContain(sel + "\0");
    expect(library).not.toContain("newComputePipelineStateWithFunction:");
    expect(library).toContain("pipelines-%016llx.metallib");
    expect(library).toContain("CHERENKOV_METAL_DEBUG");
    const source = readFileSync(join(METAL_DIR, "commands.m"), "utf8");
    expect(source).toMatch(/if \(ck_metal_debug\(\)\) \[enc insertDebugSignpost:/);
    expect(source).toMatch(/errorOptions = ck_metal_debug\(\) \? MTLCommandBufferErrorOptionEncoderExecutionStatus : MTLCommandBufferErrorOptionNone/);
    expect(readFileSync(join(METAL_DIR, "library.m"), "utf8")).toMatch(/ck_metal_debug\(\) \? \[l->dev->mtl newComputePipelineStateWithDescriptor:desc\s+options:MTLPipelineOptionBindingInfo/);
  });
});

// ---- item 8: docs/metal.md's numbers are this repository's -------------------------------------

test("docs/metal.md gives the current kernel and file counts and the real model sizes", () => {
  const doc = readFileSync(join(ROOT, "docs", "metal.md"), "utf8");
  const device = Device.open({ backend: "cpu" });
  const kernels = device.library().kernelNames().length;
  device.close();
  const files = readdirSync(join(ROOT, "kernels")).filter((f) => f.endsWith(".metal")).length;
  const counted = /(\d+) kernels from (\d+) `\.metal` files/.exec(doc);
  expect(counted && [Number(counted[1]), Number(counted[2])]).toEqual([kernels, files]);
  expect(doc).toContain(`(${kernels}\n   kernels;`);
  const gb = (preset: "30b-a3b-shape" | "80b-a3b-shape") => `${(plannedBytes(presetConfig(preset), "q4") / 1e9).toFixed(1)} GB`;
  expect(doc).toContain(`30b-a3b-shape model is ${gb("30b-a3b-shape")}`);
  expect(doc).toContain(`80b-a3b-shape one would be ${gb("80b-a3b-shape")}`);
  expect(doc).toMatch(/MTL_SHADER_VALIDATION=1 MTL_DEBUG_LAYER=1/);
  expect(doc).toContain("xcrun xctrace record --template 'Metal System Trace'");
  expect(doc).toContain("cherenkov doctor --probe-gpu-wait");
});
