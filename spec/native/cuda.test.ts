// The CUDA backend's build (metal-shim/cuda): the source rewrite, the generated entry points,
// and, where nvcc is installed, the library it builds. No GPU is needed for any of this; the
// kernels and engine run on a GPU with CHERENKOV_BACKEND=cuda (docs/cuda.md has the results).
import { describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { buildIsStale, cudaWanted, localLibraryPath } from "../../metal-shim/build.ts";
import { findNvcc } from "../../metal-shim/cuda/build.ts";
import { toolsRequired } from "../optional-tool.ts";
import { generateCuda, rewriteForCuda } from "../../metal-shim/cuda/gen.ts";
import { collectKernels } from "../../metal-shim/gen-bindings.ts";

const ROOT = join(import.meta.dir, "..", "..");

describe("rewriteForCuda", () => {
  const cases: [string, string][] = [
    ["threadgroup float partial[32];", "__shared__ float partial[32];"],
    ["threadgroup float* mine = partial + sg;", " float* mine = partial + sg;"],
    ["device const float* x", " const float* x"],
    ["constant P& p", "const P& p"],
    ["thread float4* acc", " float4* acc"],
    ["inline float f(float x) { return x; }", "__device__ inline float f(float x) { return x; }"],
    ["  static float4 load4(device const uchar* w, ulong e) {", "  __device__ static float4 load4( const uchar* w, ulong e) {"],
    ["kernel void k(device float* y [[buffer(1)]]) {", "__device__ void k( float* y              ) {"],
    ["p.kernel + q->device", "p.kernel + q->device"],
    ["static_assert(MV_R == 4, \"x\");", "static_assert(MV_R == 4, \"x\");"],
  ];
  for (const [from, to] of cases) test(from, () => expect(rewriteForCuda(from)).toBe(to));

  test("explicit instantiations are removed whole, keeping the line count", () => {
    const src = 'template [[host_name("a_f32")]] kernel decltype(a<float>) a<float>;\ntemplate [[host_name("a_f16")]]\nkernel void a<half>(device half* x [[buffer(1)]]);\nint z;';
    const out = rewriteForCuda(src);
    expect(out.split("\n").length).toBe(src.split("\n").length);
    expect(out.trim()).toBe("int z;");
  });
});

test("every pipeline of kernels/ gets one __global__ entry point and one table row", () => {
  const dir = mkdtempSync(join(tmpdir(), "cherenkov-cuda-gen-"));
  try {
    const r = generateCuda(ROOT, dir);
    const pipelines = [...collectKernels(ROOT).values()].flat();
    expect(r.kernels).toBe(pipelines.length);
    const text = r.sources.filter((s) => s.endsWith(".cu")).map((s) => readFileSync(s, "utf8")).join("\n");
    for (const k of pipelines) {
      // The kernel's MSL [[max_total_threads_per_threadgroup(N)]] is its launch bound (registers a thread may use).
      expect(text).toContain(`__global__ void __launch_bounds__(${k.maxThreads ?? 1024}) ckg_${k.name}(const ck::Launch L)`);
      expect(text).toContain(`"${k.name}", "${k.where}"`);
    }
    expect(existsSync(join(dir, "registry.cu"))).toBe(true);
    // The hot q4 kernels declare their bound (else __launch_bounds__(1024) caps them at 64 registers: they spilled).
    const bound = (name: string) => pipelines.find((k) => k.name === name)?.maxThreads;
    expect(bound("matvec_q4_f32")).toBe(128);
    expect(bound("matvec_split_q4_f32")).toBe(256);
    expect(bound("moe_gate_up_q4_f32")).toBe(128);
    expect(bound("moe_down_q4_f32")).toBe(128);
    // A kernel that calls ck_inputs_ready() (kernels/grid.h) is not made to wait at its entry,
    // except when it must read the cancel word; every other kernel waits there first.
    const entry = (name: string) => text.slice(text.indexOf(`ckg_${name}(`)).split("\n")[1]!.trim();
    const waiting = pipelines.filter((k) => k.waitsForInputs).map((k) => k.name);
    expect(waiting).toEqual(expect.arrayContaining(["matvec_multi_q4_r1_f32", "matvec_split_hc_q4_r1_f32", "matvec_split_bf16_f32", "matvec_q4_r1_f32", "matvec_q4_staged_r1_f32"]));
    for (const k of pipelines)
      expect(entry(k.name)).toBe(k.waitsForInputs ? "if (L.cancel != nullptr) ck::after_previous_grid();" : "ck::after_previous_grid();");
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

// `bun run build:native` builds the CUDA library where nvcc is; `bun run test` does not (it
// takes minutes on a 2-core machine), so locally a stale library is skipped with a plain line;
// under CI=true (build:native ran first) it must be fresh. Without nvcc nothing is built, and
// these checks say so plainly: no machine is required to have the CUDA toolkit.
const nvcc = findNvcc() !== null;
// A default build makes it only where it is wanted (a GPU, or CHERENKOV_BUILD_CUDA=1: CI sets it).
const wanted = cudaWanted();
const fresh = nvcc && wanted && (toolsRequired() || !buildIsStale("cuda"));
if (!nvcc) console.warn("CUDA library checks: skipped, nvcc not found (install the CUDA toolkit, then bun run build:native)");
else if (!wanted) console.warn("CUDA library checks: skipped, no NVIDIA GPU here (CHERENKOV_BUILD_CUDA=1 builds the library anyway)");
else if (!fresh) console.warn("CUDA library checks: skipped, libcherenkov_cuda.so is older than its sources (run bun run build:native; required when CI=true)");
test.skipIf(!fresh)("build:native built libcherenkov_cuda.so, exporting every cherenkov.h function", () => {
  const lib = localLibraryPath("cuda");
  expect(existsSync(lib)).toBe(true);
  expect(buildIsStale("cuda")).toBe(false);
  const header = readFileSync(join(ROOT, "metal-shim", "include", "cherenkov.h"), "utf8");
  const wanted = [...header.matchAll(/CK_API [^;(]*?\b(ck_\w+)\s*\(/g)].map((m) => m[1]!);
  const nm = Bun.spawnSync(["nm", "-D", "--defined-only", lib]).stdout.toString();
  const exported = new Set([...nm.matchAll(/ T (ck_\w+)/g)].map((m) => m[1]!));
  expect(wanted.length).toBeGreaterThan(30);
  for (const f of wanted) expect(exported.has(f)).toBe(true);
});

test.skipIf(!fresh)("a bad CHERENKOV_CUDA_SPIN_US fails the device's opening with the variable named (before any GPU is looked for)", () => {
  const script = `import { Device } from "./lib/shim.ts"; try { Device.open({ backend: "cuda" }).close(); console.log("opened"); } catch (e) { console.log((e as Error).message); }`;
  for (const bad of ["abc", "-5", "20000000", "12x"]) {
    const r = Bun.spawnSync(["bun", "-e", script], { cwd: ROOT, env: { ...process.env, CHERENKOV_CUDA_SPIN_US: bad } });
    expect(r.stdout.toString()).toContain(`CHERENKOV_CUDA_SPIN_US=${bad}: expected microseconds`);
  }
});
