// Issue 20 item 1: Metal's maxBufferLength is well below the working set on Apple silicon
// (~27 GB on a 48 GB M4 Pro), so an expert pool or a mapped experts.bin larger than one
// buffer must span several. The CPU backend emulates a small largest buffer
// (CHERENKOV_CPU_MAX_BUFFER_LENGTH); each case runs in its own process, since the variable is
// read when a device opens.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { synthesize } from "../../lib/convert/synth.ts";
import { tempDir } from "./helpers.ts";

const ROOT = join(import.meta.dir, "..", "..");
const LIMIT = 8 * 1024 * 1024; // the "small" preset: dense.bin 7.2 MB fits, experts.bin 18.9 MB does not
let model: { dir: string; remove(): void };

beforeAll(async () => {
  model = tempDir("buffer-limit");
  await synthesize({ preset: "small", seed: 3, out: model.dir, weights: "q4", workers: 0 });
});
afterAll(() => model.remove());

function run(script: string, env: Record<string, string> = {}) {
  const proc = Bun.spawnSync([process.execPath, "-e", script], { cwd: ROOT, env: { ...process.env, CHERENKOV_BACKEND: "cpu", ...env } });
  const output = proc.stdout.toString() + proc.stderr.toString();
  if (proc.exitCode !== 0) throw new Error(`exit ${proc.exitCode}:\n${output.slice(-3000)}`);
  return JSON.parse(output.trim().split("\n").pop()!);
}

const generate = (backing: string) => `import { Model } from "./lib/api/model.ts";
const m = await Model.load(${JSON.stringify(model.dir)}, { backend: "cpu", backing: "${backing}", pool: "100%", maxContext: 128, prefillChunk: 16 });
const r = await m.generate("The cat sat", { maxTokens: 6, stopAtEos: false });
const note = JSON.stringify(m.stats()).match(/expert pool in (\\d+) buffers/);
console.log(JSON.stringify({ tokens: r.tokens, buffers: note ? Number(note[1]) : 1 }));
await m.close();`;

test("the device reports its limits through ck_device_limit, the largest buffer among them", () => {
  const script = `import { Device } from "./lib/shim.ts";
const d = Device.open({ backend: "cpu" });
let refused = "";
try { d.buffer(${LIMIT} + 1); } catch (e) { refused = e.message; }
console.log(JSON.stringify({ ...d.limits, ok: d.buffer(${LIMIT}).length, refused }));`;
  const out = run(script, { CHERENKOV_CPU_MAX_BUFFER_LENGTH: String(LIMIT), CHERENKOV_CPU_THREADS: "3" });
  expect(out.maxBufferLength).toBe(LIMIT);
  expect(out.gpuCores).toBe(3);
  expect(out.gpuWaitLimitMs).toBe(0);
  expect(out.ok).toBe(LIMIT);
  expect(out.refused).toBe(`ck_buffer_new: ${LIMIT + out.pageSize} bytes is more than this device's largest buffer (${LIMIT} bytes)`);
  // Unlimited by default: 2^53.
  expect(run(`import { Device } from "./lib/shim.ts"; console.log(JSON.stringify(Device.open({ backend: "cpu" }).limits));`).maxBufferLength).toBe(2 ** 53);
  expect(() => run(`import { Device } from "./lib/shim.ts"; Device.open({ backend: "cpu" }); console.log("{}");`, { CHERENKOV_CPU_MAX_BUFFER_LENGTH: "1000" })).toThrow(
    "CHERENKOV_CPU_MAX_BUFFER_LENGTH=1000: expected a multiple of the page size",
  );
});

test("a pool larger than the largest buffer spans several and decodes the same tokens (wired and mapped)", () => {
  const free = run(generate("wired"));
  expect(free.buffers).toBe(1);
  for (const backing of ["wired", "mapped"]) {
    const limited = run(generate(backing), { CHERENKOV_CPU_MAX_BUFFER_LENGTH: String(LIMIT) });
    expect({ backing, ...limited }).toEqual({ backing, tokens: free.tokens, buffers: 3 });
  }
}, 120_000);
