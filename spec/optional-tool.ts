/**
 * Tests that need a tool a fresh machine may lack (clang-19 for the strict Metal checks,
 * clang++ for the second-compiler build, ...). The README's test command must pass with
 * only a C++ compiler, so without the tool those tests are skipped, with one plain line
 * saying what was skipped and how to enable it. Under CI=true a missing tool is a failing
 * test instead: CI installs the tool on purpose, and a check that silently stopped running
 * there would hide breakage.
 *
 *   const clang = clangPath();
 *   const describeStrict = optionalTool({ tool: "clang-19", path: clang, checks: "strict Metal checks",
 *     enable: "apt-get install clang-19, or set CK_CLANG" }) ? describe : describe.skip;
 */
import { test } from "bun:test";

export interface OptionalTool {
  /** The tool as a user installs it, e.g. "clang-19". */
  tool: string;
  /** Where it was found, or null when it was not. */
  path: string | null;
  /** What the tests that need it check, e.g. "strict Metal checks (metal-shim/metal/check.ts)". */
  checks: string;
  /** How to enable them, e.g. "apt-get install clang-19, or set CK_CLANG". */
  enable: string;
  /**
   * false for a tool CI does not install (nvcc): skipped with the message even under CI=true.
   * Default true; spec/package/ci.test.ts checks that .ci/run installs every required tool.
   */
  requiredUnderCi?: boolean;
}

/** CI=true (or 1): every optional tool is required. */
export function toolsRequired(env: Record<string, string | undefined> = process.env): boolean {
  const ci = env.CI?.toLowerCase();
  return ci === "true" || ci === "1";
}

/** The line printed when a tool is missing. */
export function skipMessage(t: OptionalTool): string {
  return `${t.checks}: skipped, ${t.tool} not found (to run them: ${t.enable}; required when CI=true)`;
}

/**
 * True when the tool was found and its tests should run. Otherwise registers, in the
 * calling test file, either a skipped test named by skipMessage() (also printed), or under
 * CI=true a test that fails naming the tool, and returns false.
 */
export function optionalTool(t: OptionalTool): boolean {
  if (t.path) return true;
  if (toolsRequired() && t.requiredUnderCi !== false) {
    test(`${t.tool} is installed (required when CI=true for ${t.checks})`, () => {
      throw new Error(`${t.tool} not found, and CI=true requires ${t.checks}: ${t.enable}`);
    });
  } else {
    const line = skipMessage(t);
    console.warn(line);
    test.skip(line, () => {});
  }
  return false;
}
