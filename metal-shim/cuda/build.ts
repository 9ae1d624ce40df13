/**
 * Builds the CUDA backend, libcherenkov_cuda.so, wherever nvcc is found (metal-shim/build.ts
 * calls this; no GPU is needed to build). kernels/*.metal go through metal-shim/cuda/gen.ts
 * (the prelude in metal-shim/cuda/include and metal-shim/common/prelude) and nvcc; runtime.cu is the C ABI. The CUDA
 * runtime is linked statically, so the library needs only the driver (libcuda) at run time.
 * Incremental: an object is rebuilt when its source, or anything under kernels/ or
 * metal-shim/cuda/ or metal-shim/include/, is newer than it, and everything when the compile
 * flags differ from the last build's (stamp-cuda.json beside the library).
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, statSync, writeFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import { basename, join, relative } from "node:path";

import { generateCuda } from "./gen.ts";

const ROOT = join(import.meta.dir, "..", "..");
const CUDA_DIR = import.meta.dir;
const libraryIn = (outDir: string) => join(outDir, "libcherenkov_cuda.so");
/**
 * One architecture (nvcc's -arch=sm_XY: that GPU generation's code plus PTX for newer ones):
 * CHERENKOV_CUDA_ARCH, else this machine's GPU's compute capability, else Hopper (sm_90, the
 * H200). One, not a list: each architecture is another full compile (minutes on 2 cores).
 */
export function cudaArch(env: Record<string, string | undefined> = process.env, detected: string | null = detectedComputeCapability()): string {
  if (env.CHERENKOV_CUDA_ARCH) return env.CHERENKOV_CUDA_ARCH;
  return detected ? `sm_${detected.replace(".", "")}` : "sm_90";
}

/** The first GPU's compute capability ("8.6") per nvidia-smi; null without one. */
function detectedComputeCapability(): string | null {
  if (!Bun.which("nvidia-smi")) return null;
  const r = Bun.spawnSync(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], { stdout: "pipe", stderr: "ignore" });
  const first = r.exitCode === 0 ? r.stdout.toString().trim().split("\n")[0]!.trim() : "";
  return /^\d+\.\d+$/.test(first) ? first : null;
}

/** The device-code flags every kernel object is compiled with (spec/native/cuda-spills.test.ts uses them too). */
export function cudaCompileFlags(arch: string = cudaArch()): string[] {
  return ["-std=c++17", "-O3", `-arch=${arch}`];
}

/** The include path of a generated kernel file: the prelude (its own, then the shared one), bind.cuh, genDir. */
export function cudaIncludes(genDir: string): string[] {
  return ["-I", join(CUDA_DIR, "include"), "-I", join(ROOT, "metal-shim", "common"), "-I", CUDA_DIR, "-I", genDir];
}

/** The nvcc to use: $NVCC, else nvcc on PATH, else /usr/local/cuda/bin/nvcc; null when none. */
export function findNvcc(): string | null {
  if (process.platform !== "linux") return null;
  const candidates = [process.env.NVCC, Bun.which("nvcc"), "/usr/local/cuda/bin/nvcc"].filter(Boolean) as string[];
  return candidates.find((p) => existsSync(p)) ?? null;
}

/** Files whose change means the CUDA library must be rebuilt. */
export function cudaInputs(): string[] {
  const out: string[] = [join(ROOT, "metal-shim", "gen-bindings.ts")];
  const walk = (dir: string) => {
    if (!existsSync(dir)) return;
    out.push(dir);
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) walk(path);
      else out.push(path);
    }
  };
  [CUDA_DIR, join(ROOT, "kernels"), join(ROOT, "metal-shim", "include"), join(ROOT, "metal-shim", "common")].forEach(walk);
  return out;
}

const mtime = (p: string) => statSync(p).mtimeMs;

/** Is the library at `lib` missing or older than its sources? */
export function cudaBuildIsStale(lib: string): boolean {
  if (!existsSync(lib)) return true;
  const built = mtime(lib);
  return cudaInputs().some((p) => mtime(p) > built);
}

async function run(cmd: string[], what: string): Promise<void> {
  const proc = Bun.spawn(cmd, { cwd: ROOT, stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  if (code !== 0) throw new Error(`${what} failed (exit ${code}):\n${cmd.join(" ")}\n${(out + err).trim()}`);
}

/** Builds what is stale; returns the line to print ("" when up to date or no nvcc). */
export async function buildCuda(opts: { force?: boolean; outDir: string }): Promise<string> {
  const nvcc = findNvcc();
  if (!nvcc) return "";
  const CUDA_LIBRARY = libraryIn(opts.outDir);
  const ARCH = cudaArch();
  // CHERENKOV_CUDA_STAMPS_BUILD=1: a profiling build whose kernels record their end clocks
  // (metal-shim/cuda/profile.h "Stamps").
  const stamps = process.env.CHERENKOV_CUDA_STAMPS_BUILD === "1" ? ["-DCK_STAMPS"] : [];
  const flags = [...cudaCompileFlags(ARCH), ...stamps, "-Xcompiler", "-fPIC,-fvisibility=hidden", "-Xptxas", "-warn-spills"];
  const stampPath = join(opts.outDir, "stamp-cuda.json");
  const stamp = JSON.stringify({ nvcc, flags });
  const flagsChanged = opts.force === true || !existsSync(stampPath) || readFileSync(stampPath, "utf8") !== stamp;
  if (!flagsChanged && !cudaBuildIsStale(CUDA_LIBRARY)) return "";
  const GEN_DIR = join(opts.outDir, "gen-cuda");
  const OBJ_DIR = join(opts.outDir, "obj-cuda");
  mkdirSync(OBJ_DIR, { recursive: true });
  const generated = generateCuda(ROOT, GEN_DIR);
  const newestInput = Math.max(...cudaInputs().map(mtime));
  const include = cudaIncludes(GEN_DIR);
  const jobs = [
    ...generated.sources.map((s) => ({ source: s, object: join(OBJ_DIR, `${basename(s, ".cu")}.o`), extra: include })),
    { source: join(CUDA_DIR, "runtime.cu"), object: join(OBJ_DIR, "runtime.o"), extra: [] as string[] },
  ];
  const stale = jobs.filter((j) => flagsChanged || !existsSync(j.object) || mtime(j.object) < Math.max(newestInput, mtime(j.source)));
  const started = performance.now();
  let next = 0;
  const workers = Array.from({ length: Math.min(availableParallelism(), stale.length) }, async () => {
    while (next < stale.length) {
      const j = stale[next++]!;
      await run([nvcc, ...flags, ...j.extra, "-c", j.source, "-o", j.object], `nvcc ${relative(ROOT, j.source)}`);
    }
  });
  await Promise.all(workers);
  const common = readdirSync(join(ROOT, "metal-shim", "common")).filter((f) => f.endsWith(".c")).map((f) => join(ROOT, "metal-shim", "common", f));
  const tmp = `${CUDA_LIBRARY}.${process.pid}.tmp`;
  await run(
    [nvcc, "-shared", `-arch=${ARCH}`, "-cudart", "static", "-Xcompiler", "-fPIC,-fvisibility=hidden", "-I", join(ROOT, "metal-shim", "include"), "-o", tmp, ...jobs.map((j) => j.object), ...common, "-lpthread", "-lrt", "-ldl"],
    `link ${relative(ROOT, CUDA_LIBRARY)}`,
  );
  renameSync(tmp, CUDA_LIBRARY);
  writeFileSync(stampPath, stamp);
  const seconds = ((performance.now() - started) / 1000).toFixed(1);
  return `metal-shim: built ${relative(ROOT, CUDA_LIBRARY)} (${generated.kernels} kernels, ${ARCH}; compiled ${stale.length} of ${jobs.length} files in ${seconds} s)`;
}
