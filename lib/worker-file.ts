// Where a worker's source file is, or null where the app was bundled (`bun build`, `bun build
// --compile`): a bundle carries the modules the app imports, not the files handed to
// `new Worker`, so a worker there fails to load (a build error delivered late, or a hang).
// Callers do the worker's job on their own thread instead (same results; only the thread
// differs), and say so where it matters.
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** The worker file `name` beside the module at `base` (its import.meta.url), when it is there. */
export function workerFile(name: string, base: string): string | null {
  const url = new URL(name, base);
  if (url.protocol !== "file:") return null;
  return existsSync(fileURLToPath(url)) ? url.href : null;
}
