// The engine as a Backend: sequences on the GPU step (metal-shim, CPU or Metal), with the
// expert pool, streaming IO and telemetry of lib/gpu. Behaves exactly as the reference
// backend does (the same tokens), only faster where a GPU is.
import type { ModelFiles } from "../model/format.ts";
import { Engine, EngineCheckpoint } from "../gpu/engine.ts";
import type { EngineOptions, LoadProgress } from "../gpu/load.ts";
import { PenaltyCounts } from "../reference/sampling.ts";
import type { Backend, BackendCheckpoint, BackendSequence, EngineBackendStats } from "./backend.ts";

export type { EngineOptions };

export class EngineBackend implements Backend {
  private constructor(
    readonly name: "cpu" | "metal" | "cuda",
    private readonly engine: Engine,
    private readonly files: ModelFiles,
  ) {}

  /** Loads `files` onto the `backend` device. */
  static async open(files: ModelFiles, backend: "cpu" | "metal" | "cuda", opts: EngineOptions = {}, onProgress?: LoadProgress): Promise<EngineBackend> {
    const engine = await Engine.load(files, backend, opts, onProgress);
    return new EngineBackend(backend, engine, files);
  }

  get config() {
    return this.engine.gpu.config;
  }

  get maxContext(): number {
    return this.engine.gpu.maxContext;
  }

  get maxDrafts(): number {
    return this.engine.gpu.maxDrafts;
  }

  newSequence(from?: BackendCheckpoint): BackendSequence {
    if (from && !(from instanceof EngineCheckpoint)) throw new Error("the checkpoint was made by another backend: it resumes only where it was made");
    return this.engine.newSequence(from);
  }

  penaltyCounts(): PenaltyCounts {
    return this.engine.penaltyCounts();
  }

  stats(): EngineBackendStats {
    return { backend: this.name, ...this.engine.stats() };
  }

  async close(): Promise<void> {
    await this.engine.close();
    this.files.close();
  }
}
