// Issue 9 item 4: the engine suites run on the selected backend, and asking for one this
// machine lacks fails loudly instead of passing on another backend.
import { expect, test } from "bun:test";
import { join } from "node:path";

import { defaultBackend, loadShim } from "../../lib/shim.ts";
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
  expect(BACKEND).toBe(process.env.CHERENKOV_BACKEND === "cpu" || process.env.CHERENKOV_BACKEND === "metal" ? process.env.CHERENKOV_BACKEND : defaultBackend());
  expect(() => selectedBackend({ CHERENKOV_BACKEND: "cuda" })).toThrow("CHERENKOV_BACKEND=cuda: expected cpu or metal");
});

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
