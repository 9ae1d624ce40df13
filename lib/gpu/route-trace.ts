// Builds routing-trace steps (lib/gpu/trace.ts format) from what the host saw at a trunk
// step's sites: tokens, per layer the routed ids and weights of every row, the misses, and
// the lookahead's predicted union for the layer (made at the layer before).
import type { SiteObservation } from "./step.ts";
import type { TraceStep } from "./trace.ts";

export class RouteRecorder {
  private readonly experts: number[][][] = [];
  private readonly weights: number[][][] = [];
  private readonly misses: number[][] = [];
  private readonly predicted: number[][] = [];
  private predictedAny = false;

  constructor(
    private readonly tokens: readonly number[],
    private readonly layers: number,
    private readonly topK: number,
  ) {
    for (let l = 0; l < layers; l++) {
      this.experts.push([]);
      this.weights.push([]);
      this.misses.push([]);
      this.predicted.push([]);
    }
  }

  /** A SiteObserver: records trunk sites, ignores the MTP head's. */
  readonly observe = (o: SiteObservation): void => {
    const l = o.site.trunkLayer;
    if (l === null || l >= this.layers) return;
    const k = this.topK;
    for (let r = 0; r < o.site.rows; r++) {
      this.experts[l]!.push(Array.from(o.ids.subarray(r * k, (r + 1) * k)));
      this.weights[l]!.push(Array.from(o.weights.subarray(r * k, (r + 1) * k)));
    }
    this.misses[l] = [...o.misses];
    if (o.predicted && o.site.predicts !== null && o.site.predicts < this.layers) {
      this.predicted[o.site.predicts] = [...new Set(o.predicted)];
      this.predictedAny = true;
    }
  };

  step(): TraceStep {
    const step: TraceStep = { tokens: [...this.tokens], experts: this.experts, weights: this.weights, misses: this.misses };
    if (this.predictedAny) step.predicted = this.predicted;
    return step;
  }
}
