// backend "auto" (issue 11 item 4): Metal on a Mac, else the faster CPU choice (the reference:
// docs/performance.md measures it 3-4x faster than the emulated cpu engine); CHERENKOV_BACKEND
// overrides; the CLI says which with --verbose.
import { expect, test } from "bun:test";
import { join } from "node:path";

import { autoBackend, gpuProblem, kernelProblem } from "../../lib/api/auto-backend.ts";
import { hasNvidiaGpu } from "../../lib/native-library.ts";
import { BackendUnavailableError } from "../../lib/api/backend.ts";
import { Model } from "../../lib/index.ts";
import { memoryBudget } from "../../lib/api/footprint.ts";
import { defaultModelDir } from "../../lib/model/default-model.ts";
import { readManifest } from "../../lib/model/format.ts";

const runs = { gpuProblem: () => null };
test("auto: metal on macOS, cuda with an NVIDIA GPU, the reference elsewhere; CHERENKOV_BACKEND wins", () => {
  expect(autoBackend({ env: {}, platform: "darwin", ...runs }).backend).toBe("metal");
  expect(autoBackend({ env: {}, platform: "linux", nvidia: () => false, ...runs })).toEqual({
    backend: "reference",
    reason: "no GPU backend on linux: the reference decodes faster than the emulated cpu engine",
    passedOver: [],
  });
  expect(autoBackend({ env: {}, platform: "linux", nvidia: () => true, ...runs })).toEqual({ backend: "cuda", reason: "an NVIDIA GPU: the engine through CUDA", passedOver: [] });
  expect(autoBackend({ env: { CHERENKOV_BACKEND: "cpu" }, platform: "darwin" })).toEqual({ backend: "cpu", reason: "CHERENKOV_BACKEND=cpu", passedOver: [] });
  expect(() => autoBackend({ env: { CHERENKOV_BACKEND: "gpu" }, platform: "linux" })).toThrow(BackendUnavailableError);
  expect(() => autoBackend({ env: { CHERENKOV_BACKEND: "gpu" }, platform: "linux" })).toThrow("CHERENKOV_BACKEND=gpu: expected one of reference, cpu, metal, cuda");
});

// Issue 21 item 2: a device node without a usable library, device or kernels is no reason to fail.
test("auto passes over a GPU backend that will not run here, and says why", () => {
  const notBuilt = "cherenkov: the native cuda library metal-shim/build/libcherenkov_cuda.so is not built: run bun run build:native (needs nvcc)";
  const asked: string[] = [];
  const choice = autoBackend({ env: {}, platform: "linux", nvidia: () => true, gpuProblem: (b) => (asked.push(b), notBuilt) });
  expect(asked).toEqual(["cuda"]);
  expect(choice.backend).toBe("reference");
  expect(choice.passedOver).toEqual([{ backend: "cuda", why: notBuilt }]);
  expect(choice.reason).toBe(`cuda passed over (${notBuilt}): the reference instead`);
  const noMetal = autoBackend({ env: {}, platform: "darwin", gpuProblem: () => "no metal device opens: x" });
  expect(noMetal.backend).toBe("reference");
  expect(noMetal.reason).toContain("metal passed over (no metal device opens: x)");
});

test("a model-specific check may refuse a candidate (the reference too, which is then an error)", () => {
  const bigForGpu = autoBackend({ env: {}, platform: "darwin", ...runs, accept: (b) => (b === "metal" ? "does not fit" : null) });
  expect(bigForGpu).toMatchObject({ backend: "reference", passedOver: [{ backend: "metal", why: "does not fit" }] });
  expect(() => autoBackend({ env: {}, platform: "linux", nvidia: () => false, accept: () => "too big" })).toThrow(
    'backend "auto" found no backend for this model here: reference: too big',
  );
});

test("the probes on this machine: metal needs macOS; cuda without a GPU does not run", () => {
  if (process.platform !== "darwin") expect(gpuProblem("metal")).toContain("the metal backend needs macOS");
  if (!hasNvidiaGpu()) expect(gpuProblem("cuda")).toMatch(/native cuda library .*libcherenkov_cuda\.so|no cuda device opens/);
});

test("a GPU the library has no kernels for is named with its compute capability", () => {
  const why = kernelProblem("NVIDIA GeForce RTX 3090 (cuda, sm_86, 82 SMs)", "no kernel image is available for execution on the device");
  expect(why).toBe(
    "the cuda library's kernels do not run on NVIDIA GeForce RTX 3090 (cuda, sm_86, 82 SMs) (compute capability sm_86): " +
      "no kernel image is available for execution on the device; rebuild for it: CHERENKOV_CUDA_ARCH=sm_86 bun run build:native",
  );
});

test.skipIf(process.platform === "darwin")("Model.load() with no backend runs auto's choice here", async () => {
  const expected = autoBackend().backend; // the tiny model fits any budget: the same choice as without a model
  await using model = await Model.load();
  expect(model.backendName).toBe(expected);
});

test("cherenkov run --verbose names the backend and why auto chose it", async () => {
  const proc = Bun.spawnSync([process.execPath, join(import.meta.dir, "../../lib/cli/main.ts"), "run", "--prompt", "x", "--max-tokens", "1", "--verbose"], {
    stdout: "pipe",
    stderr: "pipe",
  });
  const manifest = readManifest(await defaultModelDir());
  const choice = autoBackend({ model: { manifest, budget: memoryBudget() } });
  expect(proc.stderr.toString()).toBe(`cherenkov: ${choice.backend} backend (auto: ${choice.reason})\n`);
  expect(proc.exitCode).toBe(0);
});

// Issue 21 item 11: a GPU backend named on a machine where it cannot run is a usage error
// (exit 2) saying why, on Linux for metal and cuda alike; never a driver error mid-load (exit 1).
test.skipIf(process.platform === "darwin" || hasNvidiaGpu())("--backend cuda and --backend metal without their GPU exit 2 saying why", () => {
  for (const backend of ["cuda", "metal"]) {
    const proc = Bun.spawnSync([process.execPath, join(import.meta.dir, "../../lib/cli/main.ts"), "run", "-p", "x", "-n", "1", "--backend", backend], { stdout: "pipe", stderr: "pipe" });
    expect(proc.stderr.toString()).toStartWith(`cherenkov run: --backend: backend "${backend}" is not available here: `);
    expect(proc.exitCode).toBe(2);
  }
});
