// Runs a model one token at a time through the reference and records, next to the experts
// each layer routes to, MODEL.md's one-layer lookahead: right after layer l's MoE site read
// (the streams as they are then), ReferenceModel.predictExperts runs layer l+1's MoE read,
// norm and router on those streams. The prediction never changes the result.
import type { ModelConfig } from "../../lib/model/config.ts";
import type { Weights } from "../../lib/model/weights.ts";
import { ReferenceModel, type SequenceState } from "../../lib/reference/index.ts";

export interface ProbeStep {
  /** [layer][k] experts routed to, rank order */
  experts: number[][];
  /** [layer][k] their routing weights */
  weights: number[][];
  /** [layer][k] for layers 1..L-1: the lookahead's prediction made at layer l-1 (index 0 empty) */
  predicted: number[][];
  logits: Float32Array;
}

export class RoutingProbe {
  readonly config: ModelConfig;
  readonly state: SequenceState;
  private model: ReferenceModel;

  constructor(weights: Weights) {
    this.model = new ReferenceModel(weights);
    this.config = weights.config;
    this.state = this.model.newState();
  }

  /** Runs one token at the next position. */
  step(token: number): ProbeStep {
    const L = this.config.num_layers;
    const predicted: number[][] = [[]];
    const r = this.model.forward(this.state, [token], {
      onMoeSite: (l, X) => {
        if (l + 1 < L) predicted.push(this.model.predictExperts(l + 1, X));
      },
    });
    return {
      experts: r.route.experts.map((rows) => rows[0]!),
      weights: r.route.weights.map((rows) => rows[0]!),
      predicted,
      logits: r.logits[0]!,
    };
  }
}

/** |predicted ∩ actual| / k summed over layers 1..L-1 of the steps, and the count of sets. */
export function lookaheadHits(steps: ProbeStep[]): { hits: number; slots: number } {
  let hits = 0;
  let slots = 0;
  for (const s of steps)
    for (let l = 1; l < s.experts.length; l++) {
      const actual = new Set(s.experts[l]);
      hits += s.predicted[l]!.filter((e) => actual.has(e)).length;
      slots += s.experts[l]!.length;
    }
  return { hits, slots };
}
