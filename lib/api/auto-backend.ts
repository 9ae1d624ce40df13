// What backend "auto" means on this machine, and why (the CLI prints it with --verbose;
// `cherenkov doctor` prints the whole choice). The GPU backend of the platform when it will
// actually run here: its library is built, a device opens, and (CUDA) its kernels run on this
// GPU; otherwise the reference, with the reason the GPU backend was passed over. A backend
// named explicitly never falls back: Model.load fails saying what to run.

import { hasNvidiaGpu } from "../native-library.ts";
import { Params, packParams } from "../gpu/params.ts";
import { Device, loadShim } from "../shim.ts";
import { BackendUnavailableError } from "./backend.ts";
import { referenceOrStreaming, type MemoryBudget } from "./footprint.ts";
import type { ValidManifest } from "../model/format.ts";

export type ConcreteBackend = "reference" | "cpu" | "metal" | "cuda";

export interface BackendChoice {
  backend: ConcreteBackend;
  /** One line: why this backend. */
  reason: string;
  /** The backends tried before it, each with why it was passed over (one line). */
  passedOver: { backend: ConcreteBackend; why: string }[];
}

/** What the choice looks at; each defaults to this machine (tests pass their own). */
export interface AutoProbes {
  env?: Record<string, string | undefined>;
  platform?: string;
  /** An NVIDIA GPU's device nodes are present. */
  nvidia?: () => boolean;
  /** Why a GPU backend will not run here (library, device, kernels), or null when it will: gpuProblem(). */
  gpuProblem?: (backend: "metal" | "cuda") => string | null;
  /**
   * Why a candidate will not do for the model at hand (say, its memory footprint), or null.
   * Asked of every candidate, the reference included; a refused reference is an error.
   */
  accept?: (backend: ConcreteBackend) => string | null;
  /**
   * The model to load and the memory budget: without a GPU backend, the reference only when its
   * footprint fits, else the cpu engine, which streams (lib/api/footprint.ts).
   */
  model?: { manifest: ValidManifest; budget: MemoryBudget };
}

const NAMES: readonly ConcreteBackend[] = ["reference", "cpu", "metal", "cuda"];

/**
 * CHERENKOV_BACKEND when set; else Metal on macOS, CUDA where an NVIDIA GPU is present, when
 * it will run (gpuProblem); else the reference, which decodes 3-4x faster than the cpu engine
 * (an emulated GPU, meant for testing) on every model measured (docs/performance.md,
 * "Choosing a CPU backend").
 */
export function autoBackend(probes: AutoProbes = {}): BackendChoice {
  const env = probes.env ?? process.env;
  const platform = probes.platform ?? process.platform;
  const asked = env.CHERENKOV_BACKEND;
  if (asked) {
    if (!NAMES.includes(asked as ConcreteBackend))
      throw new BackendUnavailableError(`CHERENKOV_BACKEND=${asked}: expected one of ${NAMES.join(", ")}`);
    return { backend: asked as ConcreteBackend, reason: `CHERENKOV_BACKEND=${asked}`, passedOver: [] };
  }
  const problem = probes.gpuProblem ?? gpuProblem;
  const accept = probes.accept ?? (() => null);
  const passedOver: BackendChoice["passedOver"] = [];
  const gpu: { backend: "metal" | "cuda"; reason: string } | null =
    platform === "darwin" ? { backend: "metal", reason: "macOS: the GPU through Metal" }
    : platform === "linux" && (probes.nvidia ?? hasNvidiaGpu)() ? { backend: "cuda", reason: "an NVIDIA GPU: the engine through CUDA" }
    : null;
  if (gpu) {
    const why = problem(gpu.backend) ?? accept(gpu.backend);
    if (why === null) return { ...gpu, passedOver };
    passedOver.push({ backend: gpu.backend, why });
  }
  const refused = accept("reference");
  if (refused !== null) {
    passedOver.push({ backend: "reference", why: refused });
    throw new BackendUnavailableError(`backend "auto" found no backend for this model here: ${passedOver.map((p) => `${p.backend}: ${p.why}`).join("; ")}`);
  }
  const over = passedOver.map((p) => `${p.backend} passed over (${p.why})`).join("; ");
  if (probes.model) {
    const c = referenceOrStreaming(probes.model.manifest, probes.model.budget, platform);
    return { ...c, reason: over ? `${over}; ${c.reason}` : c.reason, passedOver };
  }
  const reason = over
    ? `${over}: the reference instead`
    : `no GPU backend on ${platform}: the reference decodes faster than the emulated cpu engine`;
  return { backend: "reference", reason, passedOver };
}

const probed = new Map<"metal" | "cuda", string | null>();

/**
 * Why `backend` will not run on this machine, or null when it will: its library loads, a
 * device opens, and on CUDA a kernel runs (a library built for another GPU generation has
 * no kernels this GPU can run). Probed once per process; the device is closed again.
 */
export function gpuProblem(backend: "metal" | "cuda"): string | null {
  if (!probed.has(backend)) probed.set(backend, probe(backend));
  return probed.get(backend)!;
}

function probe(backend: "metal" | "cuda"): string | null {
  try {
    loadShim(backend);
  } catch (e) {
    return (e as Error).message;
  }
  let device: Device;
  try {
    device = Device.open({ backend });
  } catch (e) {
    return `no ${backend} device opens: ${(e as Error).message}`;
  }
  try {
    if (backend === "cuda") runProbeKernel(device);
    return null;
  } catch (e) {
    return kernelProblem(device.name, (e as Error).message);
  } finally {
    device.close();
  }
}

/** Scales 64 floats by 2 on the device and checks the result. */
function runProbeKernel(device: Device): void {
  const n = 64;
  const x = device.buffer(n * 4);
  const y = device.buffer(n * 4);
  const cb = device.commandBuffer();
  try {
    for (let i = 0; i < n; i++) x.f32[i] = i;
    const params = packParams(Params.Selftest, { n, cols: 0, scale: 2, row_stride: 0 });
    cb.dispatch("selftest_scale_f32", 1, n, [null, x, y], params).commit().waitUntilCompleted(60_000);
    if (y.f32[n - 1] !== 2 * (n - 1)) throw new Error(`a probe kernel gave ${y.f32[n - 1]} where ${2 * (n - 1)} was due`);
  } finally {
    cb.release();
    x.release();
    y.release();
  }
}

/** The message for a GPU whose kernels do not run, naming its compute capability. */
export function kernelProblem(deviceName: string, error: string): string {
  const sm = /\bsm_(\d+)\b/.exec(deviceName)?.[0];
  const rebuild = sm ? `rebuild for it: CHERENKOV_CUDA_ARCH=${sm} bun run build:native` : "rebuild the library for this GPU (CHERENKOV_CUDA_ARCH)";
  return `the cuda library's kernels do not run on ${deviceName}${sm ? ` (compute capability ${sm})` : ""}: ${error}; ${rebuild}`;
}
