/**
 * The metal-shim backend the engine suites run on: CHERENKOV_BACKEND (cpu or metal) when
 * set, else the platform default (metal on a Mac that has it, cpu elsewhere). Asking for a
 * backend this machine cannot load fails the importing test file at once, naming why: a
 * `CHERENKOV_BACKEND=metal` run on a machine without Metal must never pass on the CPU
 * backend instead.
 */
import { defaultBackend, loadShim, type Backend } from "../lib/shim.ts";

const NAMES: Record<Backend, string> = { cpu: "The CPU backend", metal: "Metal" };

/** The selected backend, checked loadable; throws naming the backend and the reason. */
export function selectedBackend(env: Record<string, string | undefined> = process.env): Backend {
  const asked = env.CHERENKOV_BACKEND;
  if (asked !== undefined && asked !== "cpu" && asked !== "metal")
    throw new Error(`CHERENKOV_BACKEND=${asked}: expected cpu or metal`);
  const backend: Backend = asked ?? defaultBackend();
  try {
    loadShim(backend);
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    const source = asked ? `CHERENKOV_BACKEND=${asked}` : "the platform default backend";
    throw new Error(`${NAMES[backend]} is not available here (${source}); the engine tests will not fall back to another backend.\n${why}`);
  }
  return backend;
}

/** Evaluated once per test process, when an engine suite imports it. */
export const BACKEND: Backend = selectedBackend();
