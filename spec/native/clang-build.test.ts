// Issue 9 item 1: the CPU backend (runtime + kernels/*.metal compiled as C++) builds with
// clang++, the compiler every Mac has, and the kernel tests pass on that build. The build
// goes to its own folder (metal-shim/build/clang++-19, incremental) and the kernel tests run
// in a child `bun test spec/kernels` with CHERENKOV_SHIM_PATH naming the clang library.
import { describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

import { BUILD_DIR, localLibraryPath } from "../../metal-shim/build.ts";
import { clangPath } from "../../metal-shim/metal/check.ts";
import { optionalTool } from "../optional-tool.ts";

const ROOT = join(import.meta.dir, "..", "..");
const OUT = join(BUILD_DIR, "clang++-19");
/** clang++-19 ($CK_CLANGXX when set), found on PATH or in LLVM's folder. */
function clangxxPath(): string | null {
  const candidates = process.env.CK_CLANGXX ? [process.env.CK_CLANGXX] : ["clang++-19", "/usr/lib/llvm-19/bin/clang++"];
  for (const c of candidates) {
    const found = c.includes("/") ? (existsSync(c) ? c : null) : Bun.which(c);
    if (found) return found;
  }
  return null;
}
const clangxx = clangxxPath();
const clang = clangPath();

const enabled = optionalTool({
  tool: "clang-19",
  path: clangxx && clang,
  checks: "clang++-19 build of the CPU backend + kernel tests on it (spec/native/clang-build.test.ts)",
  enable: "apt-get install clang-19 (clang++-19), or set CK_CLANGXX and CK_CLANG",
});

if (enabled) {
  describe("CPU backend built with clang++-19", () => {
    const lib = localLibraryPath("cpu", OUT);

    test(
      "builds without errors or warnings",
      () => {
        const proc = Bun.spawnSync([process.execPath, join(ROOT, "metal-shim", "build.ts"), "--backend", "cpu", "--out", OUT, "--quiet"], {
          cwd: ROOT,
          env: { ...process.env, CXX: clangxx!, CC: clang! },
        });
        const output = (proc.stdout.toString() + proc.stderr.toString()).trim();
        // Warnings are printed per file ("compile kernels/...:"); -Wall must stay clean with clang too.
        expect({ code: proc.exitCode, warnings: output.split("\n").filter((l) => /warning:|error:/.test(l)) }).toEqual({ code: 0, warnings: [] });
        // The library really is clang's: ELF objects record the producing compiler in .comment.
        if (process.platform === "linux") expect(readFileSync(lib).toString("latin1")).toMatch(/clang version 19/);
      },
      600_000,
    );

    test(
      "the kernel tests pass on the clang++ build",
      () => {
        const proc = Bun.spawnSync([process.execPath, "test", "--timeout", "120000", "spec/kernels"], {
          cwd: ROOT,
          env: { ...process.env, CHERENKOV_SHIM_PATH: lib, CHERENKOV_NO_AUTOBUILD: "1", CHERENKOV_BACKEND: "cpu" },
        });
        const output = proc.stdout.toString() + proc.stderr.toString();
        const pass = Number(/^\s*(\d+) pass$/m.exec(output)?.[1] ?? 0);
        const fail = Number(/^\s*(\d+) fail$/m.exec(output)?.[1] ?? -1);
        if (proc.exitCode !== 0 || fail !== 0) console.error(output.slice(-6000));
        expect({ code: proc.exitCode, fail }).toEqual({ code: 0, fail: 0 });
        expect(pass).toBeGreaterThan(100);
      },
      600_000,
    );
  });
}
