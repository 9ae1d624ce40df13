/**
 * Where the package's own native library (metal-shim) lives, and whether it is older than
 * its sources. Pure and synchronous: lib/shim.ts uses it to load, metal-shim/build.ts to
 * build. The runtime never builds; it only says what to run.
 */
import { existsSync, readdirSync, statSync } from "node:fs";
import { join, relative } from "node:path";

export type Backend = "cpu" | "metal" | "cuda";

/** The package root (the folder holding lib/, metal-shim/, kernels/). */
export const PACKAGE_ROOT = join(import.meta.dir, "..");
export const BUILD_DIR = join(PACKAGE_ROOT, "metal-shim", "build");
const METAL_DIR = join(PACKAGE_ROOT, "metal-shim", "metal");
const isMac = process.platform === "darwin";

/** Where the package's build (or a build into outDir) puts a backend's library. */
export function localLibraryPath(backend: Backend, outDir: string = BUILD_DIR): string {
  return join(outDir, `libcherenkov_${backend}.${backend === "metal" || isMac ? "dylib" : "so"}`);
}

/** An NVIDIA GPU with its driver loaded (the device nodes the driver creates). */
export function hasNvidiaGpu(): boolean {
  return existsSync("/dev/nvidia0") || existsSync("/dev/nvidiactl");
}

/** True when this machine can build the Metal backend (macOS with its sources present). */
export function canBuildMetal(): boolean {
  return isMac && existsSync(METAL_DIR) && readdirSync(METAL_DIR).some((f) => f.endsWith(".m"));
}

/** Files and folders whose change means a backend's library must be rebuilt. */
export function libraryInputs(backend: Backend): string[] {
  const root = PACKAGE_ROOT;
  const include = join(root, "metal-shim", "include");
  const common = join(root, "metal-shim", "common");
  const kernels = join(root, "kernels");
  // cuda: as metal-shim/cuda/build.ts's cudaInputs (its build checks the same list)
  const dirs =
    backend === "cpu" ? [join(root, "metal-shim", "cpu"), common, include, kernels]
    : backend === "cuda" ? [join(root, "metal-shim", "cuda"), kernels, include, common]
    : [METAL_DIR, common, include];
  const out = [backend === "cuda" ? join(root, "metal-shim", "gen-bindings.ts") : join(root, "metal-shim", "build.ts")];
  if (backend === "cpu") {
    const gpu = join(root, "lib", "gpu");
    const params = readdirSync(gpu).filter((f) => /^params.*\.ts$/.test(f)).map((f) => join(gpu, f));
    out.push(join(root, "metal-shim", "gen-bindings.ts"), ...params);
  }
  const walk = (dir: string) => {
    if (!existsSync(dir)) return;
    out.push(dir); // a folder's mtime changes when a file is added or removed
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) walk(path);
      else out.push(path);
    }
  };
  dirs.forEach(walk);
  return out;
}

/** The first source newer than a backend's built library, or null when current (or not built). */
export function newerSource(backend: Backend, outDir: string = BUILD_DIR): string | null {
  const lib = localLibraryPath(backend, outDir);
  if (!existsSync(lib)) return null;
  const built = statSync(lib).mtimeMs;
  return libraryInputs(backend).find((p) => statSync(p).mtimeMs > built) ?? null;
}

/** Is a backend's library missing or older than its sources? */
export function buildIsStale(backend: Backend = "cpu", outDir: string = BUILD_DIR): boolean {
  return !existsSync(localLibraryPath(backend, outDir)) || newerSource(backend, outDir) !== null;
}

/**
 * A git checkout of cherenkov (not an installed package). Only there can sources change
 * after the build, so only there is a stale library an error; an installed package's files
 * may be copied in any order (cp -r, container layers) and their times mean nothing.
 */
export function isCheckout(): boolean {
  return existsSync(join(PACKAGE_ROOT, ".git"));
}

/** The command that builds the native library, for messages. */
export function buildCommand(): string {
  return isCheckout() ? "bun run build:native" : "bun pm trust cherenkov (runs its build), or bunx cherenkov build";
}

/** Why a backend's own library cannot be used as it is, or null when it can. One line. */
export function libraryProblem(backend: Backend): string | null {
  const lib = localLibraryPath(backend);
  const shown = isCheckout() ? relative(process.cwd(), lib) || lib : lib;
  if (!existsSync(lib)) {
    if (backend === "metal" && !isMac) return `the metal backend needs macOS (${shown} cannot be built on ${process.platform})`;
    if (backend === "cuda") return `the native cuda library ${shown} is not built: run ${buildCommand()} (needs nvcc)`;
    return `the native ${backend} library ${shown} is not built: run ${buildCommand()} (needs a C++ compiler)`;
  }
  if (isCheckout()) {
    const newer = newerSource(backend);
    if (newer) return `the native ${backend} library ${shown} is older than ${relative(PACKAGE_ROOT, newer)}: run bun run build:native`;
  }
  return null;
}
