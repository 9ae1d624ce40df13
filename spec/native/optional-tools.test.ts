// The README's test command passes on a machine without clang-19: the strict Metal
// checks say they were skipped and how to enable them. Under CI=true the same missing
// tool fails the run. Runs metal-check.test.ts in a child with clang-19 hidden
// (CK_CLANG pointing at nothing).
import { describe, expect, test } from "bun:test";
import { join } from "node:path";

import { skipMessage, toolsRequired } from "../optional-tool.ts";

const ROOT = join(import.meta.dir, "..", "..");

function runMetalCheckWithoutClang(ci: string | undefined) {
  const env: Record<string, string | undefined> = { ...process.env, CK_CLANG: "/nonexistent/clang-19", CI: ci };
  if (ci === undefined) delete env.CI;
  const proc = Bun.spawnSync([process.execPath, "test", "./spec/native/metal-check.test.ts"], { cwd: ROOT, env, stdout: "pipe", stderr: "pipe" });
  return { code: proc.exitCode, output: proc.stdout.toString() + proc.stderr.toString() };
}

describe.skipIf(process.platform === "darwin")("clang-19 missing (on macOS Apple's toolchain stands in instead)", () => {
  test("without CI the strict checks are skipped with a plain message; the ABI check still runs", () => {
    const r = runMetalCheckWithoutClang(undefined);
    expect(r.output).toContain("strict Metal checks (spec/native/metal-check.test.ts): skipped, clang-19 not found (to run them: apt-get install clang-19");
    expect(r.output).toMatch(/\b0 fail\b/);
    expect(r.output).toMatch(/\b[1-9]\d* pass\b/); // (c) abi needs no clang
    expect(r.code).toBe(0);
  });

  test("with CI=true the missing tool fails the run, naming it", () => {
    const r = runMetalCheckWithoutClang("true");
    expect(r.output).toContain("clang-19 not found, and CI=true requires strict Metal checks");
    expect(r.code).not.toBe(0);
  });
});

test("CI=true or CI=1 require optional tools; anything else does not", () => {
  expect(toolsRequired({ CI: "true" })).toBe(true);
  expect(toolsRequired({ CI: "1" })).toBe(true);
  expect(toolsRequired({ CI: "false" })).toBe(false);
  expect(toolsRequired({})).toBe(false);
  expect(skipMessage({ tool: "x", path: null, checks: "y", enable: "z" })).toBe("y: skipped, x not found (to run them: z; required when CI=true)");
});
