// lib/shim.ts loads only the package's own build or an explicitly configured file
// (issue 13 item 6): an explicit path that is wrong is an error, never a fallback; a file
// that is not a metal-shim library is refused before dlopen runs any of its code; a missing
// build names the command to run. And CHERENKOV_DEBUG_FFI tracing.
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import { cpSync, existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { loadShim, setShimPath, ShimError } from "../../lib/shim.ts";
import { localLibraryPath } from "../../lib/native-library.ts";

const ROOT = join(import.meta.dir, "..", "..");
const scratch = mkdtempSync(join(tmpdir(), "cherenkov-shim-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));
afterEach(() => setShimPath(null));

/** Runs a script in a child bun (the library path settings are read once per process). */
function child(script: string, env: Record<string, string>) {
  const proc = Bun.spawnSync([process.execPath, "-e", script], { cwd: ROOT, env: { ...process.env, ...env }, stdout: "pipe", stderr: "pipe" });
  return { code: proc.exitCode, out: proc.stdout.toString(), err: proc.stderr.toString() };
}

test("a missing explicit library is an error naming it, not a fallback to the package's build", () => {
  setShimPath("/nonexistent/libcherenkov.so");
  expect(() => loadShim("cpu")).toThrow(ShimError);
  expect(() => loadShim("cpu")).toThrow("setShimPath=/nonexistent/libcherenkov.so: no such file");
});

test("an explicit path that is a folder or not a shared library is refused", () => {
  setShimPath(scratch);
  expect(() => loadShim("cpu")).toThrow(`setShimPath=${scratch}: not a regular file`);
  const text = join(scratch, "notes.so");
  writeFileSync(text, "ck_abi_version\0 ck_device_open\0 but not a library");
  setShimPath(text);
  expect(() => loadShim("cpu")).toThrow(/notes\.so: not a (ELF|Mach-O) shared library/);
});

describe.skipIf(process.platform !== "linux")("a foreign library (Linux: built here with the C++ compiler)", () => {
  test("is refused before its constructor runs; Model.load with that path fails instead of using another backend", () => {
    const marker = join(scratch, "constructor-ran");
    const source = join(scratch, "foreign.cpp");
    const lib = join(scratch, "libforeign.so");
    writeFileSync(source, `#include <cstdio>
__attribute__((constructor)) static void ran() { if (FILE *f = std::fopen("${marker}", "w")) std::fclose(f); }
extern "C" int foreign_entry(void) { return 7; }
`);
    const cc = Bun.spawnSync([process.env.CXX ?? "g++", "-shared", "-fPIC", "-o", lib, source], { stderr: "pipe" });
    expect(cc.stderr.toString()).toBe("");
    const r = child(
      `import { Model } from "./lib/index.ts";
       try { await Model.load(undefined, { backend: "auto" }); console.log("loaded"); } catch (e) { console.log(e.name + ": " + e.message); }`,
      { CHERENKOV_SHIM_PATH: lib, CHERENKOV_BACKEND: "cpu" },
    );
    expect(r.out.trim()).toBe(`BackendUnavailableError: backend "cpu" is not available here: CHERENKOV_SHIM_PATH=${lib}: does not export ck_abi_version; not a metal-shim library`);
    expect(r.err).toBe("");
    expect(existsSync(marker)).toBe(false);
  });
});

test("the metal backend off macOS says it needs macOS, in one line", () => {
  if (process.platform === "darwin") return void expect(loadShim("metal").symbols.ck_abi_version()).toBe(3);
  expect(() => loadShim("metal")).toThrow(/^cherenkov: the metal backend needs macOS \(.*libcherenkov_metal\.dylib cannot be built on linux\)$/);
});

test("a library that is not built: one line naming the command; nothing is built at load", () => {
  // A copy of the package's runtime without a build: lib/ and the folders the check reads.
  const pkg = join(scratch, "pkg");
  for (const dir of ["lib", "kernels", "metal-shim/include", "metal-shim/cpu", "metal-shim/common"])
    cpSync(join(ROOT, dir), join(pkg, dir), { recursive: true });
  const r = child(`import { loadShim } from ${JSON.stringify(join(pkg, "lib", "shim.ts"))};
    try { loadShim("cpu"); console.log("loaded"); } catch (e) { console.log(e.message); }`, {});
  const built = join(pkg, "metal-shim", "build", localLibraryPath("cpu").split("/").pop()!);
  expect(r.err + r.out.trim()).toBe(`cherenkov: the native cpu library ${built} is not built: run bun pm trust cherenkov (runs its build), or bunx cherenkov build (needs a C++ compiler)`);
  expect(existsSync(join(pkg, "metal-shim", "build"))).toBe(false);
});

test("setShimPath loads exactly that file", () => {
  const local = loadShim("cpu").path;
  setShimPath(local);
  const shim = loadShim("cpu");
  expect(shim.path).toBe(local);
  expect(shim.symbols.ck_abi_version()).toBe(4);
});

test("CHERENKOV_DEBUG_FFI=1 logs each native call with its arguments and result", () => {
  const script = `import { Device } from ${JSON.stringify(join(import.meta.dir, "../../lib/shim.ts"))};
const d = Device.open({ backend: "cpu" }); const e = d.event(); e.set(7); d.close();`;
  const proc = Bun.spawnSync([process.execPath, "-e", script], {
    env: { ...process.env, CHERENKOV_DEBUG_FFI: "1" },
    stderr: "pipe",
  });
  const log = proc.stderr.toString();
  expect(proc.exitCode).toBe(0);
  expect(log).toMatch(/^\[ffi\] ck_device_open\(\) -> \d+$/m);
  expect(log).toMatch(/^\[ffi\] ck_event_set\(\d+, 7\) -> 0$/m);
});
