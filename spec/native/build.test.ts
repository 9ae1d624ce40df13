// metal-shim/build.ts: each backend builds on its own (issue 9 item 1: on a Mac the CPU
// backend failing used to stop the Metal one from being built at all), and the options
// that let a second build (say, clang++) live beside the default one.
import { expect, test } from "bun:test";
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { BUILD_DIR, NativeBuildError, buildEach, cpuLinkFlags, cudaWanted, localLibraryPath, metalBuildCommand, parseBuildArgs } from "../../metal-shim/build.ts";
import { cudaArch } from "../../metal-shim/cuda/build.ts";
import { hasNvidiaGpu } from "../../lib/native-library.ts";

test("a failing backend does not stop the next one; the failure is still reported", async () => {
  const ran: string[] = [];
  const err = await buildEach([
    { backend: "cpu", build: async () => (ran.push("cpu"), Promise.reject(new Error("kernels/x.metal:1: error: boom"))) },
    { backend: "metal", build: async () => (ran.push("metal"), "metal-shim: built libcherenkov_metal.dylib") },
  ]).catch((e) => e);
  expect(ran).toEqual(["cpu", "metal"]);
  expect(err).toBeInstanceOf(NativeBuildError);
  expect(err.lines).toEqual(["metal-shim: built libcherenkov_metal.dylib"]);
  expect(err.failed.map((f: { backend: string }) => f.backend)).toEqual(["cpu"]);
  expect(err.message).toContain("the cpu backend failed to build:\nkernels/x.metal:1: error: boom");
});

test("all backends building returns their lines", async () => {
  expect(await buildEach([{ backend: "cpu", build: async () => "a" }, { backend: "metal", build: async () => "" }])).toEqual(["a"]);
});

test("command line: --out, --backend, and clear errors", () => {
  expect(parseBuildArgs(["--force", "--quiet", "--out", "/tmp/x", "--backend", "cpu"])).toEqual({ force: true, quiet: true, optional: false, outDir: "/tmp/x", backends: ["cpu"] });
  expect(parseBuildArgs(["--backend", "cuda"]).backends).toEqual(["cuda"]);
  expect(() => parseBuildArgs(["--backend", "vulkan"])).toThrow("--backend vulkan: expected cpu, metal or cuda");
  expect(() => parseBuildArgs(["--out"])).toThrow("--out needs a value");
  expect(() => parseBuildArgs(["--fast"])).toThrow("unknown option --fast");
  expect(localLibraryPath("cpu", "/tmp/x")).toMatch(/^\/tmp\/x\/libcherenkov_cpu\.(so|dylib)$/);
  expect(localLibraryPath("cpu")).toStartWith(BUILD_DIR);
});

test("a compiler that fails makes the build exit 1 naming the backend", () => {
  const out = mkdtempSync(join(tmpdir(), "cherenkov-build-"));
  try {
    const proc = Bun.spawnSync([process.execPath, join(import.meta.dir, "..", "..", "metal-shim", "build.ts"), "--out", out, "--backend", "cpu"], {
      env: { ...process.env, CXX: "false", CC: "false" },
    });
    expect(proc.exitCode).toBe(1);
    expect(proc.stderr.toString()).toContain("the cpu backend failed to build");
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});

// Issue 21 item 3: nvcc alone (CI, a laptop with the toolkit) is no reason to spend minutes
// compiling a library nothing here could run.
test("a default build includes CUDA only with an NVIDIA GPU, or when CHERENKOV_BUILD_CUDA=1 asks", () => {
  expect(cudaWanted({}, false)).toBe(false);
  expect(cudaWanted({}, true)).toBe(true);
  expect(cudaWanted({ CHERENKOV_BUILD_CUDA: "1" }, false)).toBe(true);
  expect(cudaWanted({ CHERENKOV_BUILD_CUDA: "0" }, true)).toBe(false);
});

test("the CUDA architecture: CHERENKOV_CUDA_ARCH, else the GPU's compute capability, else sm_90", () => {
  expect(cudaArch({ CHERENKOV_CUDA_ARCH: "sm_80" }, "8.6")).toBe("sm_80");
  expect(cudaArch({}, "8.6")).toBe("sm_86");
  expect(cudaArch({}, "12.0")).toBe("sm_120");
  expect(cudaArch({}, null)).toBe("sm_90");
});

test.skipIf(hasNvidiaGpu())("without a GPU the default build does not start the CUDA build, nvcc or not", () => {
  const out = mkdtempSync(join(tmpdir(), "cherenkov-build-"));
  try {
    const env: Record<string, string | undefined> = { ...process.env, CXX: "false", CC: "false" };
    delete env.CHERENKOV_BUILD_CUDA;
    const proc = Bun.spawnSync([process.execPath, join(import.meta.dir, "..", "..", "metal-shim", "build.ts"), "--out", out], { env, stdout: "pipe", stderr: "pipe" });
    expect(proc.exitCode).toBe(1); // the cpu backend's compiler is `false`
    expect((proc.stdout.toString() + proc.stderr.toString()).toLowerCase()).not.toContain("cuda");
    expect(existsSync(join(out, "gen-cuda"))).toBe(false);
    expect(existsSync(join(out, "libcherenkov_cuda.so"))).toBe(false);
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});

// Issue 9 item 6: what a Mac build needs.
test("the Metal library is built for arm64, with an install name, by OBJC (not CC)", () => {
  const cmd = metalBuildCommand("/tmp/out/libcherenkov_metal.dylib.123.tmp", ["metal-shim/metal/device.m"], { CC: "gcc" });
  expect(cmd[0]).toBe("clang"); // CC=gcc (no Objective-C) does not leak into the Objective-C build
  expect(metalBuildCommand("/tmp/x", [], { CC: "gcc", OBJC: "/opt/llvm/bin/clang" })[0]).toBe("/opt/llvm/bin/clang");
  const pair = (flag: string) => cmd[cmd.indexOf(flag) + 1];
  expect(pair("-arch")).toBe("arm64");
  expect(pair("-install_name")).toBe("@rpath/libcherenkov_metal.dylib"); // not the temporary output path
  expect(pair("-mmacosx-version-min=14.0")).toBeDefined();
  expect(cmd).toEqual(expect.arrayContaining(["-fobjc-arc", "-dynamiclib", "-framework", "Metal", "Foundation"]));
  expect(cpuLinkFlags(true)).toEqual(["-dynamiclib", "-install_name", "@rpath/libcherenkov_cpu.dylib"]);
  expect(cpuLinkFlags(false)).toEqual(["-shared"]);
});
