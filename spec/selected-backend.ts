/**
 * The metal-shim backend the engine suites run on: CHERENKOV_BACKEND (cpu, metal or cuda)
 * when set, else the platform default (metal on a Mac that has it, cuda where an NVIDIA GPU
 * and the CUDA library are, cpu elsewhere). Asking for a
 * backend this machine cannot load fails the importing test file at once, naming why: a
 * `CHERENKOV_BACKEND=metal` (or `cuda`) run on a machine without that GPU must never pass on
 * the CPU backend instead.
 */
import { defaultBackend, Device, loadShim, type Backend } from "../lib/shim.ts";

const NAMES: Record<Backend, string> = { cpu: "The CPU backend", metal: "Metal", cuda: "CUDA" };

/** The selected backend, checked loadable; throws naming the backend and the reason. */
export function selectedBackend(env: Record<string, string | undefined> = process.env): Backend {
  const asked = env.CHERENKOV_BACKEND;
  if (asked !== undefined && asked !== "cpu" && asked !== "metal" && asked !== "cuda")
    throw new Error(`CHERENKOV_BACKEND=${asked}: expected cpu, metal or cuda`);
  const backend: Backend = asked ?? defaultBackend();
  try {
    loadShim(backend);
    // The CUDA library loads wherever it was built; only opening a device proves a GPU is there.
    if (backend === "cuda") Device.open({ backend }).close();
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    const source = asked ? `CHERENKOV_BACKEND=${asked}` : "the platform default backend";
    throw new Error(`${NAMES[backend]} is not available here (${source}); the engine tests will not fall back to another backend.\n${why}`);
  }
  return backend;
}

/** Evaluated once per test process, when an engine suite imports it. */
export const BACKEND: Backend = selectedBackend();
