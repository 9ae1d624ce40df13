// Issue 9 item 4: the engine suites run on the selected backend, and asking for one this
// machine lacks fails loudly instead of passing on another backend.
import { expect, test } from "bun:test";
import { join } from "node:path";

import { defaultBackend, Device, loadShim } from "../../lib/shim.ts";
import { BACKEND, selectedBackend } from "../selected-backend.ts";

const ROOT = join(import.meta.dir, "..", "..");
const metalLoads = (() => {
  try {
    loadShim("metal");
    return true;
  } catch {
    return false;
  }
})();

test("without CHERENKOV_BACKEND the platform default is used; with it, that backend", () => {
  expect(selectedBackend({})).toBe(defaultBackend());
  expect(selectedBackend({ CHERENKOV_BACKEND: "cpu" })).toBe("cpu");
  const asked = process.env.CHERENKOV_BACKEND;
  expect(BACKEND).toBe(asked === "cpu" || asked === "metal" || asked === "cuda" ? asked : defaultBackend());
  expect(() => selectedBackend({ CHERENKOV_BACKEND: "vulkan" })).toThrow("CHERENKOV_BACKEND=vulkan: expected cpu, metal or cuda");
});

/** Without autobuild: a missing CUDA library fails at once instead of a minutes-long nvcc build. */
function withoutAutobuild<T>(fn: () => T): T {
  const before = process.env.CHERENKOV_NO_AUTOBUILD;
  process.env.CHERENKOV_NO_AUTOBUILD = "1";
  try {
    return fn();
  } finally {
    if (before === undefined) delete process.env.CHERENKOV_NO_AUTOBUILD;
    else process.env.CHERENKOV_NO_AUTOBUILD = before;
  }
}
const cudaRuns = withoutAutobuild(() => {
  try {
    Device.open({ backend: "cuda" }).close();
    return true;
  } catch {
    return false;
  }
});

test.skipIf(!cudaRuns)("CHERENKOV_BACKEND=cuda on a machine with an NVIDIA GPU selects cuda", () => {
  expect(selectedBackend({ CHERENKOV_BACKEND: "cuda" })).toBe("cuda");
});

test.skipIf(cudaRuns)("CHERENKOV_BACKEND=cuda where CUDA cannot run: the engine suites fail, naming it", () => {
  expect(() => withoutAutobuild(() => selectedBackend({ CHERENKOV_BACKEND: "cuda" }))).toThrow(/^CUDA is not available here \(CHERENKOV_BACKEND=cuda\)/);
  const proc = Bun.spawnSync([process.execPath, "test", "spec/engine-step/models.test.ts"], {
    cwd: ROOT,
    env: { ...process.env, CHERENKOV_BACKEND: "cuda", CHERENKOV_NO_AUTOBUILD: "1" },
  });
  const output = proc.stdout.toString() + proc.stderr.toString();
  expect(proc.exitCode).not.toBe(0);
  expect(output).toContain("CUDA is not available here");
  expect(output).not.toMatch(/^\(pass\)/m);
}, 60_000);

test.skipIf(metalLoads)("CHERENKOV_BACKEND=metal where Metal cannot load: the engine suites fail, naming it", () => {
  expect(() => selectedBackend({ CHERENKOV_BACKEND: "metal" })).toThrow(/^Metal is not available here \(CHERENKOV_BACKEND=metal\)/);
  const proc = Bun.spawnSync([process.execPath, "test", "spec/engine-step/models.test.ts"], {
    cwd: ROOT,
    env: { ...process.env, CHERENKOV_BACKEND: "metal" },
  });
  const output = proc.stdout.toString() + proc.stderr.toString();
  expect(proc.exitCode).not.toBe(0);
  expect(output).toContain("Metal is not available here");
  expect(output).not.toMatch(/^\(pass\)/m); // nothing ran on the CPU backend instead
}, 60_000);
