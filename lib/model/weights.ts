// The weights as the reference sees them: every tensor dequantized to f32. Backed either by
// a model directory on disk (format.ts) or by memory (synthetic models in tests).
import type { ModelConfig } from "./config.ts";
import { initPleTable, initTensor } from "./init.ts";
import { denseTensorSpecs, expertPartSpecs, type TensorSpec } from "./tensors.ts";

export interface ExpertWeights {
  /** [intermediate, d] */
  gate: Float32Array;
  /** [intermediate, d] */
  up: Float32Array;
  /** [d, intermediate] */
  down: Float32Array;
}

export interface Weights {
  readonly config: ModelConfig;
  /** A dense tensor by name (see tensors.ts), dequantized, row-major. Throws naming the tensor if absent. */
  get(name: string): Float32Array;
  has(name: string): boolean;
  /**
   * Routed expert e of expert layer l (l = num_layers is the MTP layer). Use it before the
   * next expert() call: a model directory recycles evicted experts' storage.
   */
  expert(layer: number, e: number): ExpertWeights;
  /** PLE table of (layer, order index o, head j): rows x head_dim. */
  pleTable(layer: number, o: number, j: number): Float32Array;
}

export const expertName = (l: number, e: number) => `experts.${l}.${e}`;
export const pleTableName = (l: number, o: number, j: number) => `ple.${l}.${o}.${j}`;

/**
 * Synthetic weights held in memory, generated on demand from (seed, tensor name): the same
 * values `cherenkov synth` writes (before any quantization).
 */
export class RandomWeights implements Weights {
  private cache = new Map<string, Float32Array>();
  private specs: Map<string, TensorSpec>;
  constructor(readonly config: ModelConfig, readonly seed: number) {
    this.specs = new Map(denseTensorSpecs(config).map((s) => [s.name, s]));
  }
  has(name: string) {
    return this.specs.has(name);
  }
  get(name: string): Float32Array {
    const spec = this.specs.get(name);
    if (!spec) throw new Error(`missing tensor ${name}`);
    let t = this.cache.get(name);
    if (!t) this.cache.set(name, (t = initTensor(spec, this.seed)));
    return t;
  }
  expert(layer: number, e: number): ExpertWeights {
    const [gate, up, down] = expertPartSpecs(this.config).map((p) => {
      const name = `${expertName(layer, e)}.${p.name}`;
      let t = this.cache.get(name);
      if (!t) this.cache.set(name, (t = initTensor({ ...p, name }, this.seed)));
      return t;
    });
    return { gate: gate!, up: up!, down: down! };
  }
  pleTable(layer: number, o: number, j: number): Float32Array {
    const p = this.config.ple;
    if (!p) throw new Error("model has no PLE");
    const name = pleTableName(layer, o, j);
    let t = this.cache.get(name);
    if (!t) this.cache.set(name, (t = initPleTable(name, p.rows[o]![j]!, p.head_dim, this.seed)));
    return t;
  }
}
