// Fixed limits of the GPU step, shared by the engine, the kernels' tests and the docs.

/** Rows per step: a prefill chunk, or 1 + drafts when verifying. Scratch is sized for it. */
export const MAX_NB = 1024;
/** Rollback planes: a verify batch may have up to this many rows after the first. */
export const MAX_SNAP = 8;
/** The most hyper-connection streams the hc kernels hold (HC_MAX_STREAMS in kernels/hc.h). */
export const HC_MAX_STREAMS = 8;
/** The most streams of a site the small-site kernel forms serve (HC_SMALL_STREAMS in kernels/hc-site.h). */
export const HC_SMALL_STREAMS = 4;
/** SIMD width every backend runs with (Metal's on Apple silicon; the CPU emulator's). */
export const SIMD_WIDTH = 32;

/**
 * Threads for a kernel that takes any multiple of the SIMD width: `wanted`, lowered to the
 * pipeline's maximum rounded down to the execution width. Metal lowers
 * maxTotalThreadsPerThreadgroup below the device's 1024 for register-heavy kernels, so a
 * fixed 1024 can be refused on a Mac that no other machine here shows (docs/metal.md).
 */
export function threadsWithin(pipeline: { readonly name: string; readonly maxThreads: number }, wanted: number, width = SIMD_WIDTH): number {
  const cap = Math.floor(pipeline.maxThreads / width) * width;
  if (cap < width) throw new Error(`${pipeline.name}: the pipeline allows ${pipeline.maxThreads} threads per threadgroup, less than one SIMD group of ${width}`);
  return Math.min(wanted, cap);
}

/**
 * The row count from which a step takes a matrix-unit kernel instead of its row-by-row form
 * (the GEMM, attn_tiles): the environment variable `env` when set (a positive integer; tuning
 * runs, tests that send tiny prompts through the tiled kernels), else `gpuDefault` on a GPU and
 * never (Infinity) on the CPU backend, whose tile products are fiber-switching emulation.
 */
export function tiledMinRows(env: string, backend: string, gpuDefault: number): number {
  const value = process.env[env];
  if (value === undefined || value === "") return backend === "cpu" ? Infinity : gpuDefault;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`${env}=${value}: expected a positive integer`);
  return n;
}

/**
 * How the engine's handshakes wait (Device.waitMode). Under an OS limit on GPU event waits
 * (gpuWaitLimitMs > 0) a pool that can miss may hold the GPU at a site while records are read
 * for seconds: those steps wait on the host instead (the GPU never blocks; a submission per
 * site). With every record resident, or no limit known, the step stays one command buffer.
 */
export function waitModeFor(gpuWaitLimitMs: number, poolSlots: number, records: number): "gpu" | "host" {
  return gpuWaitLimitMs > 0 && poolSlots < records ? "host" : "gpu";
}

/**
 * The engine's GPU-wait watchdog under an OS limit on GPU event waits (Device.limits.gpuWaitLimitMs;
 * 0: none known): three quarters of the OS limit when the requested timeout would reach it,
 * so that a wait the host never answers ends with the engine's message ("wait for event ...
 * timed out"), not the OS's ("the GPU stopped it: Timeout").
 */
export function watchdogTimeoutMs(requestedMs: number, gpuWaitLimitMs: number): number {
  if (!(gpuWaitLimitMs > 0) || requestedMs < gpuWaitLimitMs) return requestedMs;
  return Math.max(1, Math.floor(gpuWaitLimitMs * 0.75));
}
