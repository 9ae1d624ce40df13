// backend "auto" (issue 11 item 4): Metal on a Mac, else the faster CPU choice (the reference:
// docs/performance.md measures it 3-4x faster than the emulated cpu engine); CHERENKOV_BACKEND
// overrides; the CLI says which with --verbose.
import { expect, test } from "bun:test";
import { join } from "node:path";

import { autoBackend } from "../../lib/api/auto-backend.ts";
import { BackendUnavailableError } from "../../lib/api/backend.ts";
import { Model } from "../../lib/index.ts";
import { memoryBudget } from "../../lib/api/footprint.ts";
import { defaultModelDir } from "../../lib/model/default-model.ts";
import { readManifest } from "../../lib/model/format.ts";

test("auto: metal on macOS, cuda with an NVIDIA GPU, the reference elsewhere; CHERENKOV_BACKEND wins", () => {
  expect(autoBackend({}, "darwin").backend).toBe("metal");
  expect(autoBackend({}, "linux", false)).toEqual({ backend: "reference", reason: "no GPU backend on linux: the reference decodes faster than the emulated cpu engine" });
  expect(autoBackend({}, "linux", true)).toEqual({ backend: "cuda", reason: "an NVIDIA GPU: the engine through CUDA" });
  expect(autoBackend({ CHERENKOV_BACKEND: "cpu" }, "darwin")).toEqual({ backend: "cpu", reason: "CHERENKOV_BACKEND=cpu" });
  expect(() => autoBackend({ CHERENKOV_BACKEND: "gpu" }, "linux")).toThrow(BackendUnavailableError);
  expect(() => autoBackend({ CHERENKOV_BACKEND: "gpu" }, "linux")).toThrow("CHERENKOV_BACKEND=gpu: expected one of reference, cpu, metal, cuda");
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
  const choice = autoBackend(process.env, process.platform, undefined, { manifest, budget: memoryBudget() });
  expect(proc.stderr.toString()).toBe(`cherenkov: ${choice.backend} backend (auto: ${choice.reason})\n`);
  expect(proc.exitCode).toBe(0);
});
