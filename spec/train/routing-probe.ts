// Runs a model one token at a time with the reference's own op functions, as
// ReferenceModel.forward does for a single row, and adds the one-layer lookahead of MODEL.md:
// right after layer l's MoE site read (the streams as they are then), layer l+1's MoE read,
// norm and router run on those streams and predict l+1's experts. The prediction never
// changes the result; it is recorded next to the experts layer l+1 really routes to.
import type { ModelConfig } from "../../lib/model/config.ts";
import type { Weights } from "../../lib/model/weights.ts";
import {
  attentionLayer,
  deltanetLayer,
  hcCoefficients,
  hcFinalRead,
  hcMixes,
  hcRead,
  matvec,
  moeRow,
  pleLayer,
  residualSite,
  rmsNorm,
  routerTopK,
  SequenceState,
  type AttentionWeights,
  type DeltaNetWeights,
  type HcHeadWeights,
  type HcSiteWeights,
  type MoeWeights,
  type PleWeights,
} from "../../lib/reference/index.ts";

interface ProbeLayer {
  ple: PleWeights | null;
  hcMixer: HcSiteWeights | null;
  mixerNorm: Float32Array;
  deltanet: DeltaNetWeights | null;
  attention: AttentionWeights | null;
  hcMoe: HcSiteWeights | null;
  moeNorm: Float32Array;
  moe: MoeWeights;
}

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
  private layers: ProbeLayer[];
  private embed: Float32Array;
  private lmHead: Float32Array;
  private finalNorm: Float32Array;
  private hcHead: HcHeadWeights | null;

  constructor(private weights: Weights) {
    const c = (this.config = weights.config);
    const get = (n: string) => weights.get(n);
    const n = c.hc.streams;
    const site = (p: string): HcSiteWeights | null => (n === 1 ? null : { fn: get(`${p}.fn`), base: get(`${p}.base`), scale: get(`${p}.scale`) });
    this.layers = c.layer_types.map((type, l) => {
      const p = `layers.${l}.`;
      const ple = c.ple && c.ple.layers.includes(l) ? c.ple : null;
      const qsa = c.attention.qsa;
      return {
        ple: ple
          ? {
              ...Object.fromEntries(["k", "k_bias", "v", "v_bias", "k_norm", "q_norm", "conv_norm", "conv"].map((t) => [t, get(`${p}ple.${t}`)])),
              tables: ple.orders.map((_, o) => Array.from({ length: ple.heads }, (_, j) => weights.pleTable(l, o, j))),
            } as PleWeights
          : null,
        hcMixer: site(`${p}hc_mixer`),
        mixerNorm: get(`${p}mixer_norm`),
        deltanet:
          type === "deltanet"
            ? (Object.fromEntries(["qkv", "z", "b", "a", "conv", "A_log", "dt_bias", "norm", "out"].map((t) => [t, get(`${p}dn.${t}`)])) as unknown as DeltaNetWeights)
            : null,
        attention:
          type === "attention"
            ? {
                ...(Object.fromEntries(["q", "gate", "k", "v", "q_norm", "k_norm", "o"].map((t) => [t, get(`${p}attn.${t}`)])) as Omit<AttentionWeights, "qsa">),
                qsa: qsa ? { iq: get(`${p}attn.iq`), ik: get(`${p}attn.ik`), ik_norm: get(`${p}attn.ik_norm`), iw: get(`${p}attn.iw`) } : null,
              }
            : null,
        hcMoe: site(`${p}hc_moe`),
        moeNorm: get(`${p}moe_norm`),
        moe: {
          router: get(`${p}moe.router`),
          shared:
            c.moe.shared_intermediate > 0
              ? { gate: get(`${p}moe.shared_gate`), up: get(`${p}moe.shared_up`), down: get(`${p}moe.shared_down`), expertGate: get(`${p}moe.shared_expert_gate`) }
              : null,
        },
      };
    });
    this.embed = get("embed");
    this.lmHead = c.tie_embeddings ? this.embed : get("lm_head");
    this.finalNorm = get("final_norm");
    this.hcHead = n === 1 ? null : { fn: get("hc_head.fn"), base: get("hc_head.base"), scale: get("hc_head.scale") };
    this.state = new SequenceState(c);
  }

  /** Layer `l`'s experts as the lookahead predicts them from the streams X [n, d] of one row. */
  predict(l: number, X: Float32Array): number[] {
    const c = this.config;
    const { d, n } = { d: c.hidden_size, n: c.hc.streams };
    const lw = this.layers[l]!;
    let x: Float32Array;
    if (lw.hcMoe) {
      const coeff = hcCoefficients(hcMixes(lw.hcMoe.fn, X, 2 * n + n * n, c.hc.eps), lw.hcMoe, c.hc);
      x = hcRead(X, coeff.pre, n, d);
    } else x = X.slice(0, d);
    const xn = rmsNorm(x, lw.moeNorm, c.rms_norm_eps);
    const logits = matvec(lw.moe.router, xn, new Float32Array(c.moe.experts), c.moe.experts, d);
    return routerTopK(logits, c.moe.top_k, c.moe.norm_topk_prob).experts;
  }

  /** Runs one token at the next position. */
  step(token: number): ProbeStep {
    const c = this.config;
    const st = this.state;
    const d = c.hidden_size;
    const n = c.hc.streams;
    const eps = c.rms_norm_eps;
    const p0 = st.length;
    st.tokens.push(token);
    const X = new Float32Array(n * d);
    for (let i = 0; i < n; i++) X.set(this.embed.subarray(token * d, (token + 1) * d), i * d);
    const out: ProbeStep = { experts: [], weights: [], predicted: [[]], logits: new Float32Array(0) };
    this.layers.forEach((lw, l) => {
      if (lw.ple) pleLayer(lw.ple, c, st.ple[l]!, X, 1, p0, st.tokens);
      residualSite(X, 1, d, c.hc, lw.hcMixer, lw.mixerNorm, eps, (xs) =>
        lw.deltanet ? deltanetLayer(lw.deltanet, c, st.deltanet[l]!, xs, 1, { chunk: 0 }) : attentionLayer(lw.attention!, c, st.attention[l]!, xs, 1, p0),
      );
      residualSite(X, 1, d, c.hc, lw.hcMoe, lw.moeNorm, eps, (xs) => {
        // X still holds the streams of this site's read: the lookahead's input.
        if (l + 1 < this.layers.length) out.predicted.push(this.predict(l + 1, X));
        const r = moeRow(lw.moe, c, (e) => this.weights.expert(l, e), xs);
        out.experts.push(r.routing.experts);
        out.weights.push(r.routing.weights);
        return r.y;
      });
    });
    st.length += 1;
    const x = hcFinalRead(X, n, d, this.hcHead, c.hc.eps);
    const h = rmsNorm(x, this.finalNorm, eps);
    out.logits = matvec(this.lmHead, h, new Float32Array(c.vocab_size), c.vocab_size, d);
    return out;
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
