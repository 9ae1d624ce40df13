// What backend "auto" means on this machine, and why (the CLI prints it with --verbose).
// No fallback: when the chosen backend cannot load, Model.load fails saying what to run.

import { hasNvidiaGpu } from "../shim.ts";
import { BackendUnavailableError } from "./backend.ts";
import { referenceOrStreaming, type MemoryBudget } from "./footprint.ts";
import type { ValidManifest } from "../model/format.ts";

export type ConcreteBackend = "reference" | "cpu" | "metal" | "cuda";

export interface BackendChoice {
  backend: ConcreteBackend;
  /** One line: why this backend. */
  reason: string;
}

const NAMES: readonly ConcreteBackend[] = ["reference", "cpu", "metal", "cuda"];

/**
 * CHERENKOV_BACKEND when set; Metal on macOS; CUDA where an NVIDIA GPU is present; elsewhere the reference,
 * which decodes 3-4x faster than the cpu engine (an emulated GPU, meant for testing) on
 * every model measured (docs/performance.md, "Choosing a CPU backend"), but only when `model`'s
 * reference footprint fits the memory budget: else the cpu engine, which streams (footprint.ts).
 */
export function autoBackend(
  env: Record<string, string | undefined> = process.env,
  platform: string = process.platform,
  nvidia: boolean = platform === "linux" && hasNvidiaGpu(),
  model?: { manifest: ValidManifest; budget: MemoryBudget },
): BackendChoice {
  const asked = env.CHERENKOV_BACKEND;
  if (asked) {
    if (!NAMES.includes(asked as ConcreteBackend))
      throw new BackendUnavailableError(`CHERENKOV_BACKEND=${asked}: expected one of ${NAMES.join(", ")}`);
    return { backend: asked as ConcreteBackend, reason: `CHERENKOV_BACKEND=${asked}` };
  }
  if (platform === "darwin") return { backend: "metal", reason: "macOS: the GPU through Metal" };
  if (nvidia) return { backend: "cuda", reason: "an NVIDIA GPU: the engine through CUDA" };
  if (model) return referenceOrStreaming(model.manifest, model.budget, platform);
  return {
    backend: "reference",
    reason: `no GPU backend on ${platform}: the reference decodes faster than the emulated cpu engine`,
  };
}
