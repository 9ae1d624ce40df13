/**
 * `bun run build:native`: builds metal-shim's native libraries into metal-shim/build/.
 *  - libcherenkov_cpu.(so|dylib): the CPU backend (metal-shim/cpu/*.cpp) together with
 *    kernels/*.metal compiled as C++ through metal-shim/gen-bindings.ts.
 *  - on macOS also libcherenkov_metal.dylib from metal-shim/metal/*.m, when present.
 *  - on Linux with nvcc and an NVIDIA GPU also libcherenkov_cuda.so (metal-shim/cuda/build.ts),
 *    for that GPU's architecture; without a GPU only when CHERENKOV_BUILD_CUDA=1 (no GPU is
 *    needed to build it, but it is a minute or more of nvcc for a library nothing here could
 *    run) or `--backend cuda`. A failing CUDA build only warns unless CHERENKOV_REQUIRE_CUDA=1.
 * Each backend builds on its own: one failing is reported (exit 1) but does not stop the
 * other. Incremental: an object is recompiled when a file it depends on (from the
 * compiler's -MMD output) or the flags changed; the library is relinked when an object changed.
 *
 *   bun metal-shim/build.ts [--force] [--quiet] [--optional] [--out DIR] [--backend cpu|metal|cuda]
 * --optional (postinstall): a failure prints a warning and exits 0.
 * --out DIR: build into DIR instead of metal-shim/build (say, a clang++ build beside the g++ one).
 * Compilers: CXX (C++), CC (C), OBJC (Objective-C, default clang; CC does not change it).
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { basename, join, relative, resolve } from "node:path";

import { paramsHeaderIsStale } from "../lib/gpu/params-gen.ts";
import { generate } from "./gen-bindings.ts";
import { buildCuda, findNvcc } from "./cuda/build.ts";
import { BUILD_DIR, canBuildMetal, hasNvidiaGpu, libraryInputs, localLibraryPath, type Backend } from "../lib/native-library.ts";

// Where libraries go and when they are stale is the runtime's knowledge (lib/native-library.ts).
export { BUILD_DIR, buildIsStale, canBuildMetal, localLibraryPath, type Backend } from "../lib/native-library.ts";

const ROOT = join(import.meta.dir, "..");
const CPU_DIR = join(ROOT, "metal-shim", "cpu");
const COMMON_DIR = join(ROOT, "metal-shim", "common"); // plain C shared by every backend (cherenkov_io.h); prelude/: the kernels' C++ shared with CUDA
const METAL_DIR = join(ROOT, "metal-shim", "metal");
const isMac = process.platform === "darwin";
/** True when this machine can build the CUDA backend (Linux with nvcc; no GPU needed). */
export function canBuildCuda(): boolean {
  return findNvcc() !== null;
}

/**
 * Whether a default build includes CUDA: where an NVIDIA GPU is present, or when
 * CHERENKOV_BUILD_CUDA=1 asks for it (=0 never). nvcc is still needed (else it is skipped).
 */
export function cudaWanted(env: Record<string, string | undefined> = process.env, gpu: boolean = hasNvidiaGpu()): boolean {
  if (env.CHERENKOV_BUILD_CUDA === "1") return true;
  if (env.CHERENKOV_BUILD_CUDA === "0") return false;
  return gpu;
}

/** The CUDA build: its line; "" without nvcc; a warning, not a failure, when it breaks (unless CHERENKOV_REQUIRE_CUDA=1). */
async function buildCudaOptional(opts: BuildOptions, outDir: string): Promise<string> {
  try {
    return await buildCuda({ force: opts.force, outDir });
  } catch (e) {
    if (process.env.CHERENKOV_REQUIRE_CUDA === "1") throw e;
    const message = e instanceof Error ? e.message : String(e);
    console.warn(`metal-shim: CUDA backend not built (CHERENKOV_REQUIRE_CUDA=1 makes this an error):\n${message}`);
    return "";
  }
}

const mtime = (path: string) => statSync(path).mtimeMs;
/** A path as printed: relative inside the repository, absolute outside it. */
const shown = (path: string) => (path.startsWith(ROOT + "/") ? relative(ROOT, path) : path);

interface Job {
  compiler: string;
  source: string;
  object: string;
  flags: string[];
}

function compilerFor(lang: "c" | "c++" | "objc", env: Record<string, string | undefined> = process.env): string {
  // Objective-C has its own variable: CC may name a compiler without Objective-C (gcc).
  if (lang === "objc") return env.OBJC ?? "clang";
  if (lang === "c") return env.CC ?? (isMac ? "clang" : "gcc");
  return env.CXX ?? (isMac ? "clang++" : "g++");
}

function commonSources(): string[] {
  if (!existsSync(COMMON_DIR)) return [];
  return readdirSync(COMMON_DIR)
    .filter((f) => f.endsWith(".c"))
    .sort()
    .map((f) => join(COMMON_DIR, f));
}

function cFlags(): string[] {
  return ["-std=c11", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-I", join(ROOT, "metal-shim", "include")];
}

function commonFlags(): string[] {
  return ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-pthread", "-Wall"];
}

function runtimeFlags(): string[] {
  return [...commonFlags(), "-Wextra"];
}

function kernelFlags(genDir: string): string[] {
  const unknownAttributes = isMac ? "-Wno-unknown-attributes" : "-Wno-attributes";
  // Kernels type-pun device memory as freely as Metal allows: no strict aliasing.
  return [...commonFlags(), unknownAttributes, "-fno-strict-aliasing", "-I", join(CPU_DIR, "include"), "-I", COMMON_DIR, "-I", CPU_DIR, "-I", genDir];
}

/** Dependencies an object was built from, per the compiler's .d file. */
function dependencies(depFile: string): string[] | null {
  if (!existsSync(depFile)) return null;
  const text = readFileSync(depFile, "utf8").replace(/\\\n/g, " ");
  const colon = text.indexOf(": ");
  if (colon < 0) return null;
  return text
    .slice(colon + 2)
    .split(/\s+/)
    .filter(Boolean)
    .map((d) => d.replace(/\\ /g, " "));
}

function objectIsStale(job: Job, flagsChanged: boolean): boolean {
  if (flagsChanged || !existsSync(job.object)) return true;
  const deps = dependencies(job.object.replace(/\.o$/, ".d"));
  if (!deps) return true;
  const built = mtime(job.object);
  return deps.some((d) => !existsSync(d) || mtime(d) > built);
}

async function run(cmd: string[], what: string): Promise<void> {
  const proc = Bun.spawn(cmd, { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  const text = (out + err).trim();
  if (code !== 0) throw new Error(`${what} failed (exit ${code}):\n${cmd.join(" ")}\n${text}`);
  if (text) console.warn(`${what}:\n${text}`); // warnings: -Wall must stay clean
}

async function inParallel<T>(items: T[], limit: number, fn: (item: T) => Promise<void>): Promise<void> {
  let next = 0;
  const workers = Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) await fn(items[next++]!);
  });
  await Promise.all(workers);
}

export interface BuildOptions {
  /** Recompile everything. */
  force?: boolean;
  /** Build into this folder (default metal-shim/build). */
  outDir?: string;
  /** Build only these backends (default: every one this machine can build). */
  backends?: Backend[];
}

async function buildCpu(opts: BuildOptions, outDir: string): Promise<string> {
  if (paramsHeaderIsStale())
    throw new Error("kernels/params.h is stale: run `bun lib/gpu/params-gen.ts` (lib/gpu/params.ts is its source)");
  const genDir = join(outDir, "gen");
  const objDir = join(outDir, "obj");
  mkdirSync(objDir, { recursive: true });
  const generated = generate(ROOT, genDir);
  const cxx = compilerFor("c++");
  const runtime = readdirSync(CPU_DIR)
    .filter((f) => f.endsWith(".cpp"))
    .sort()
    .map((f) => join(CPU_DIR, f));
  const cc = compilerFor("c");
  const jobs: Job[] = [
    ...runtime.map((source) => ({ compiler: cxx, source, object: join(objDir, `cpu_${basename(source, ".cpp")}.o`), flags: runtimeFlags() })),
    ...commonSources().map((source) => ({ compiler: cc, source, object: join(objDir, `common_${basename(source, ".c")}.o`), flags: cFlags() })),
    ...generated.sources.map((source) => ({ compiler: cxx, source, object: join(objDir, `gen_${basename(source, ".cpp")}.o`), flags: kernelFlags(genDir) })),
  ];
  const lib = localLibraryPath("cpu", outDir);
  const stampPath = join(outDir, "stamp.json");
  const stamp = JSON.stringify({ cxx, cc, runtime: runtimeFlags(), c: cFlags(), kernels: kernelFlags(genDir), objects: jobs.map((j) => j.object) });
  const flagsChanged = opts.force === true || !existsSync(stampPath) || readFileSync(stampPath, "utf8") !== stamp;
  const stale = jobs.filter((j) => objectIsStale(j, flagsChanged));
  const started = performance.now();
  await inParallel(stale, availableParallelism(), (j) =>
    run([j.compiler, ...j.flags, "-MMD", "-MF", j.object.replace(/\.o$/, ".d"), "-c", j.source, "-o", j.object], `compile ${shown(j.source)}`),
  );
  const relink = flagsChanged || stale.length > 0 || !existsSync(lib) || jobs.some((j) => mtime(j.object) > mtime(lib));
  if (relink) {
    const tmp = `${lib}.${process.pid}.tmp`;
    await run([cxx, ...cpuLinkFlags(), "-pthread", "-o", tmp, ...jobs.map((j) => j.object), "-lm"], `link ${shown(lib)}`);
    renameSync(tmp, lib); // atomic: a process loading the old library keeps its copy
    writeFileSync(stampPath, stamp);
  } else {
    const now = new Date();
    utimesSync(lib, now, now); // sources touched without effect: mark the library current
  }
  const seconds = ((performance.now() - started) / 1000).toFixed(1);
  return relink
    ? `metal-shim: built ${shown(lib)} (${generated.kernels} kernels; compiled ${stale.length} of ${jobs.length} files in ${seconds} s)`
    : "";
}

/**
 * The one command that builds libcherenkov_metal.dylib: Apple silicon only (-arch arm64),
 * loadable on macOS 14, ARC, and an install name that does not record the temporary
 * output path (a program linking against the library finds it through its rpath).
 */
export function metalBuildCommand(output: string, sources: string[], env: Record<string, string | undefined> = process.env): string[] {
  return [
    compilerFor("objc", env), "-arch", "arm64", "-mmacosx-version-min=14.0", "-fobjc-arc", "-O2", "-Wall",
    "-fvisibility=hidden", "-dynamiclib", "-install_name", "@rpath/libcherenkov_metal.dylib",
    "-framework", "Metal", "-framework", "Foundation", "-I", join(ROOT, "metal-shim", "include"),
    "-o", output, ...sources,
  ];
}

/** Link flags of the CPU library (-install_name on macOS, as for the Metal one). */
export function cpuLinkFlags(mac = isMac): string[] {
  return mac ? ["-dynamiclib", "-install_name", "@rpath/libcherenkov_cpu.dylib"] : ["-shared"];
}

async function buildMetal(opts: BuildOptions, outDir: string): Promise<string> {
  if (!canBuildMetal()) return "";
  const sources = readdirSync(METAL_DIR)
    .filter((f) => f.endsWith(".m"))
    .map((f) => join(METAL_DIR, f));
  if (sources.length === 0) return "";
  const lib = localLibraryPath("metal", outDir);
  const newest = Math.max(...libraryInputs("metal").map(mtime));
  if (!opts.force && existsSync(lib) && mtime(lib) >= newest) return "";
  const tmp = `${lib}.${process.pid}.tmp`;
  await run(metalBuildCommand(tmp, [...sources, ...commonSources()]), "build the Metal backend");
  renameSync(tmp, lib);
  return `metal-shim: built ${shown(lib)}`;
}

/** One build at a time across processes (say, two test runs on a fresh checkout): mkdir is atomic. */
async function withBuildLock<T>(outDir: string, fn: () => Promise<T>): Promise<T> {
  const lock = join(outDir, ".lock");
  const started = Date.now();
  for (;;) {
    try {
      mkdirSync(lock);
      break;
    } catch {
      const age = existsSync(lock) ? Date.now() - statSync(lock).mtimeMs : 0;
      if (age > 10 * 60_000) rmSync(lock, { recursive: true, force: true }); // left by a killed build
      else if (Date.now() - started > 5 * 60_000) throw new Error(`metal-shim: ${lock} held for 5 minutes; remove it if no build runs`);
      else await Bun.sleep(100);
    }
  }
  try {
    return await fn();
  } finally {
    rmSync(lock, { recursive: true, force: true });
  }
}

/** A backend's build failed; the others were still built. `lines` are what did build. */
export class NativeBuildError extends Error {
  override name = "NativeBuildError";
  constructor(
    readonly failed: { backend: Backend; message: string }[],
    readonly lines: string[],
  ) {
    super(failed.map((f) => `metal-shim: the ${f.backend} backend failed to build:\n${f.message}`).join("\n\n"));
  }
}

/**
 * Builds whatever is stale, each backend on its own: a failing backend does not stop
 * the next one. Returns the lines it would print; throws NativeBuildError after trying
 * every backend when any failed.
 */
export async function buildNative(opts: BuildOptions = {}): Promise<string[]> {
  const outDir = opts.outDir ?? BUILD_DIR;
  mkdirSync(outDir, { recursive: true });
  const builders: Record<Backend, (o: BuildOptions, dir: string) => Promise<string>> = { cpu: buildCpu, metal: buildMetal, cuda: buildCudaOptional };
  const wanted = opts.backends ?? (["cpu", "metal", ...(cudaWanted() ? ["cuda"] : [])] as Backend[]);
  return withBuildLock(outDir, () => buildEach(wanted.map((backend) => ({ backend, build: () => builders[backend](opts, outDir) }))));
}

/** Runs each backend's build in turn, whatever the previous one did; throws NativeBuildError at the end if any failed. */
export async function buildEach(steps: { backend: Backend; build: () => Promise<string> }[]): Promise<string[]> {
  const lines: string[] = [];
  const failed: { backend: Backend; message: string }[] = [];
  for (const { backend, build } of steps) {
    try {
      const line = await build();
      if (line) lines.push(line);
    } catch (e) {
      failed.push({ backend, message: e instanceof Error ? e.message : String(e) });
    }
  }
  if (failed.length) throw new NativeBuildError(failed, lines);
  return lines;
}

/** Parses the command line of `bun metal-shim/build.ts`. */
export function parseBuildArgs(argv: string[]): BuildOptions & { quiet: boolean; optional: boolean } {
  const out: BuildOptions & { quiet: boolean; optional: boolean } = { quiet: false, optional: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const value = () => {
      const v = argv[++i];
      if (v === undefined || v.startsWith("--")) throw new Error(`metal-shim/build.ts: ${arg} needs a value`);
      return v;
    };
    if (arg === "--force") out.force = true;
    else if (arg === "--quiet") out.quiet = true;
    else if (arg === "--optional") out.optional = true;
    else if (arg === "--out") out.outDir = resolve(value());
    else if (arg === "--backend") {
      const b = value();
      if (b !== "cpu" && b !== "metal" && b !== "cuda") throw new Error(`metal-shim/build.ts: --backend ${b}: expected cpu, metal or cuda`);
      (out.backends ??= []).push(b);
    } else throw new Error(`metal-shim/build.ts: unknown option ${arg} (--force, --quiet, --optional, --out DIR, --backend cpu|metal|cuda)`);
  }
  return out;
}

if (import.meta.main) {
  let args: ReturnType<typeof parseBuildArgs>;
  try {
    args = parseBuildArgs(process.argv.slice(2));
  } catch (e) {
    console.error(e instanceof Error ? e.message : String(e));
    process.exit(2);
  }
  try {
    const lines = await buildNative(args);
    if (lines.length) console.log(lines.join("\n"));
    else if (!args.quiet) console.log("metal-shim: up to date");
  } catch (e) {
    if (e instanceof NativeBuildError && e.lines.length) console.log(e.lines.join("\n"));
    const message = e instanceof Error ? e.message : String(e);
    if (args.optional) {
      console.warn(`metal-shim: native build skipped: ${message}\n(run \`bun run build:native\` once a C++ compiler is installed)`);
      process.exit(0);
    }
    console.error(message);
    process.exit(1);
  }
}
