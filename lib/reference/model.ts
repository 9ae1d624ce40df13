// The forward pass of qwen4-exp over one row batch (MODEL.md): tokens at positions
// state.length .. state.length + nb - 1 run layer by layer (as the engine runs them), the
// state grows by nb, and every row gets its logits, final hidden and routing.
import { NonFiniteError } from "../model/errors.ts";
import type { LayerType, ModelConfig } from "../model/config.ts";
import { denseTensorSpecs, numel } from "../model/tensors.ts";
import type { Weights } from "../model/weights.ts";
import { attentionLayer, type AttentionRowTrace, type AttentionWeights } from "./attention.ts";
import { deltanetLayer, type DeltaNetWeights } from "./deltanet.ts";
import { hcCoefficients, hcFinalRead, hcMixes, hcRead, residualSite, type HcHeadWeights, type HcSiteWeights } from "./hyperconnection.ts";
import { moeRow, routerTopK, type MoeWeights } from "./moe.ts";
import { mtpForward, type MtpRows, type MtpWeights } from "./mtp.ts";
import { matvec, rmsNorm } from "./ops.ts";
import { pleLayer, type PleWeights } from "./ple.ts";
import { SequenceState, type StateSnapshot } from "./state.ts";

/** The routing trace of one row batch (trunk layers only; the MTP layer is not included). */
export type RouteStep = {
  tokens: number[];
  /** [layer][row][k]: expert ids in rank order */
  experts: number[][][];
  /** [layer][row][k]: their routing weights */
  weights: number[][][];
};

export interface ForwardOptions {
  /** Snapshot the state after every row (verify batches); forces the recurrent DeltaNet. */
  snapshots?: boolean;
  /** Accepted for API symmetry: the final hidden rows are always returned. */
  collectHidden?: boolean;
  /**
   * DeltaNet form: 0 = recurrent, c > 0 = chunked with chunk size c. Default: recurrent for a
   * single row or with snapshots, else chunked with DEFAULT_CHUNK.
   */
  deltanetChunk?: number;
  /** Record the positions each attention row attended to (StepResult.selected). */
  collectSelections?: boolean;
  /**
   * Called at every layer's MoE site before its read, with the streams X [nb][n][d] as they
   * are then: the input of the one-layer lookahead (see predictExperts). Must not modify X.
   */
  onMoeSite?: (layer: number, X: Float32Array) => void;
  /** Rows whose logits to compute (the LM head is the largest matrix); default every row. */
  logitRows?: { from: number; count: number };
}

export interface StepResult {
  /** [vocab] logits of rows logitsFrom.. (ForwardOptions.logitRows; every row by default). */
  logits: Float32Array[];
  /** The row logits[0] belongs to. */
  logitsFrom: number;
  /** Per row: the final hidden after the final read and final RMSNorm (the MTP input). */
  hidden: Float32Array[];
  route: RouteStep;
  /** With `snapshots`: snapshots[r] = the state right after row r. */
  snapshots?: StateSnapshot[];
  /** With `collectSelections`: [layer][row] attended positions (null for DeltaNet layers). */
  selected?: (number[][] | null)[];
}

/** Chunk size of the chunked DeltaNet in multi-row forwards. */
export const DEFAULT_CHUNK = 64;

interface LayerWeights {
  type: LayerType;
  ple: PleWeights | null;
  hcMixer: HcSiteWeights | null;
  mixerNorm: Float32Array;
  deltanet: DeltaNetWeights | null;
  attention: AttentionWeights | null;
  hcMoe: HcSiteWeights | null;
  moeNorm: Float32Array;
  moe: MoeWeights;
}

/** Throws unless every id is an integer token of the vocabulary. */
/**
 * Throws a NonFiniteError naming the layer when `x` holds NaN or infinity: the model's result
 * would otherwise be a silent wrong token (argmax over NaN picks id 0).
 */
function assertFinite(x: Float32Array, layer: number | null, part: string): void {
  for (let i = 0; i < x.length; i++) {
    if (Number.isFinite(x[i]!)) continue;
    const where = layer === null ? "the output logits" : `layer ${layer}`;
    throw new NonFiniteError(
      `${where}: non-finite value (${x[i]}) after ${part}: the weights or activations ${layer === null ? "of the output head" : `of layer ${layer}`} (or an earlier layer) are NaN or infinite`,
      layer,
    );
  }
}

export function checkTokens(tokens: readonly number[], vocab: number, what = "token"): void {
  tokens.forEach((t, i) => {
    if (!Number.isInteger(t) || t < 0 || t >= vocab)
      throw new RangeError(`${what} id ${t} (index ${i}) is outside the vocabulary (vocab_size ${vocab})`);
  });
}

export class ReferenceModel {
  readonly config: ModelConfig;
  private layers: LayerWeights[];
  private embed: Float32Array;
  private lmHead: Float32Array;
  private finalNorm: Float32Array;
  private hcHead: HcHeadWeights | null;
  private mtp: MtpWeights | null;

  constructor(readonly weights: Weights) {
    const c = (this.config = weights.config);
    // Check every dense tensor once, so a wrong file fails here naming the tensor.
    for (const spec of denseTensorSpecs(c)) {
      const t = weights.get(spec.name);
      if (t.length !== numel(spec.shape))
        throw new Error(`tensor ${spec.name}: ${t.length} values, expected shape [${spec.shape.join(", ")}]`);
    }
    const get = (name: string) => weights.get(name);
    const n = c.hc.streams;
    const site = (p: string): HcSiteWeights | null => (n === 1 ? null : { fn: get(`${p}.fn`), base: get(`${p}.base`), scale: get(`${p}.scale`) });
    const attention = (p: string, qsa: boolean): AttentionWeights => ({
      q: get(`${p}attn.q`),
      gate: get(`${p}attn.gate`),
      k: get(`${p}attn.k`),
      v: get(`${p}attn.v`),
      q_norm: get(`${p}attn.q_norm`),
      k_norm: get(`${p}attn.k_norm`),
      o: get(`${p}attn.o`),
      qsa:
        qsa && c.attention.qsa
          ? { iq: get(`${p}attn.iq`), ik: get(`${p}attn.ik`), ik_norm: get(`${p}attn.ik_norm`), iw: get(`${p}attn.iw`) }
          : null,
    });
    const moe = (p: string): MoeWeights => ({
      router: get(`${p}moe.router`),
      shared:
        c.moe.shared_intermediate > 0
          ? {
              gate: get(`${p}moe.shared_gate`),
              up: get(`${p}moe.shared_up`),
              down: get(`${p}moe.shared_down`),
              expertGate: get(`${p}moe.shared_expert_gate`),
            }
          : null,
    });
    this.layers = c.layer_types.map((type, l) => {
      const p = `layers.${l}.`;
      const ple = c.ple && c.ple.layers.includes(l) ? c.ple : null;
      return {
        type,
        ple: ple
          ? {
              k: get(`${p}ple.k`),
              k_bias: get(`${p}ple.k_bias`),
              v: get(`${p}ple.v`),
              v_bias: get(`${p}ple.v_bias`),
              k_norm: get(`${p}ple.k_norm`),
              q_norm: get(`${p}ple.q_norm`),
              conv_norm: get(`${p}ple.conv_norm`),
              conv: get(`${p}ple.conv`),
              tables: ple.orders.map((_, o) => Array.from({ length: ple.heads }, (_, j) => weights.pleTable(l, o, j))),
            }
          : null,
        hcMixer: site(`${p}hc_mixer`),
        mixerNorm: get(`${p}mixer_norm`),
        deltanet:
          type === "deltanet"
            ? {
                qkv: get(`${p}dn.qkv`),
                z: get(`${p}dn.z`),
                b: get(`${p}dn.b`),
                a: get(`${p}dn.a`),
                conv: get(`${p}dn.conv`),
                A_log: get(`${p}dn.A_log`),
                dt_bias: get(`${p}dn.dt_bias`),
                norm: get(`${p}dn.norm`),
                out: get(`${p}dn.out`),
              }
            : null,
        attention: type === "attention" ? attention(p, true) : null,
        hcMoe: site(`${p}hc_moe`),
        moeNorm: get(`${p}moe_norm`),
        moe: moe(p),
      };
    });
    this.embed = get("embed");
    this.lmHead = c.tie_embeddings ? this.embed : get("lm_head");
    this.finalNorm = get("final_norm");
    this.hcHead = n === 1 ? null : { fn: get("hc_head.fn"), base: get("hc_head.base"), scale: get("hc_head.scale") };
    this.mtp = c.mtp
      ? {
          embedNorm: get("mtp.embed_norm"),
          hiddenNorm: get("mtp.hidden_norm"),
          fc: get("mtp.fc"),
          mixerNorm: get("mtp.mixer_norm"),
          attention: attention("mtp.", false),
          moeNorm: get("mtp.moe_norm"),
          moe: moe("mtp."),
          norm: get("mtp.norm"),
        }
      : null;
  }

  /** A fresh, empty sequence. */
  newState(): SequenceState {
    return new SequenceState(this.config);
  }

  /** Runs one row batch of tokens through the trunk, appending them to `state`. */
  /**
   * MODEL.md's one-layer lookahead: layer l's MoE site read, norm and router run on the
   * streams X [n][d] of one row (taken at an earlier layer's MoE site), predicting the experts
   * layer l would route to. It only informs prefetching, never the result.
   */
  predictExperts(l: number, X: Float32Array): number[] {
    const c = this.config;
    const d = c.hidden_size;
    const n = c.hc.streams;
    const lw = this.layers[l]!;
    const x = lw.hcMoe ? hcRead(X, hcCoefficients(hcMixes(lw.hcMoe.fn, X, 2 * n + n * n, c.hc.eps), lw.hcMoe, c.hc).pre, n, d) : X.slice(0, d);
    const xn = rmsNorm(x, lw.moeNorm, c.rms_norm_eps);
    const logits = matvec(lw.moe.router, xn, new Float32Array(c.moe.experts), c.moe.experts, d);
    return routerTopK(logits, c.moe.top_k, c.moe.norm_topk_prob).experts;
  }

  forward(state: SequenceState, tokens: number[], opts: ForwardOptions = {}): StepResult {
    const c = this.config;
    if (state.config !== c) throw new Error("forward: the state was made for another model config");
    if (tokens.length === 0) throw new Error("forward: empty row batch");
    checkTokens(tokens, c.vocab_size);
    const nb = tokens.length;
    const p0 = state.length;
    const d = c.hidden_size;
    const n = c.hc.streams;
    const eps = c.rms_norm_eps;
    const chunk = opts.deltanetChunk ?? (opts.snapshots || nb === 1 ? 0 : DEFAULT_CHUNK);
    if (!Number.isInteger(chunk) || chunk < 0) throw new Error(`forward: deltanetChunk ${chunk} must be an integer >= 0`);
    if (opts.snapshots && chunk !== 0) throw new Error("forward: row snapshots need the recurrent DeltaNet (deltanetChunk 0)");
    const rows = opts.logitRows ?? { from: 0, count: nb };
    if (!Number.isInteger(rows.from) || !Number.isInteger(rows.count) || rows.from < 0 || rows.count < 0 || rows.from + rows.count > nb)
      throw new RangeError(`forward: logitRows ${rows.from}..${rows.from + rows.count - 1} are outside the ${nb} rows`);

    for (const t of tokens) state.tokens.push(t);
    const X = new Float32Array(nb * n * d);
    for (let b = 0; b < nb; b++) {
      const e = this.embed.subarray(tokens[b]! * d, (tokens[b]! + 1) * d);
      for (let i = 0; i < n; i++) X.set(e, (b * n + i) * d);
    }
    const snaps = opts.snapshots ? Array.from({ length: nb }, (_, r) => state.blankSnapshot(p0 + r + 1)) : undefined;
    const route: RouteStep = { tokens: [...tokens], experts: [], weights: [] };
    const selected: (number[][] | null)[] = [];

    this.layers.forEach((lw, l) => {
      if (lw.ple) pleLayer(lw.ple, c, state.ple[l]!, X, nb, p0, state.tokens, snaps && ((r) => state.capturePle(snaps[r]!, l)));
      residualSite(X, nb, d, c.hc, lw.hcMixer, lw.mixerNorm, eps, (xs) => {
        if (lw.deltanet)
          return deltanetLayer(lw.deltanet, c, state.deltanet[l]!, xs, nb, {
            chunk,
            onRow: snaps && ((r) => state.captureDeltaNet(snaps[r]!, l)),
          });
        const trace: AttentionRowTrace = { selected: [] };
        const ys = attentionLayer(lw.attention!, c, state.attention[l]!, xs, nb, p0, trace);
        selected.push(trace.selected);
        return ys;
      });
      if (lw.deltanet) selected.push(null);
      assertFinite(X, l, `the ${lw.deltanet ? "DeltaNet" : "attention"} mixer`);
      const experts: number[][] = [];
      const weights: number[][] = [];
      opts.onMoeSite?.(l, X);
      residualSite(X, nb, d, c.hc, lw.hcMoe, lw.moeNorm, eps, (xs) => {
        const ys = new Float32Array(nb * d);
        for (let b = 0; b < nb; b++) {
          const r = moeRow(lw.moe, c, (e) => this.weights.expert(l, e), xs.subarray(b * d, (b + 1) * d));
          ys.set(r.y, b * d);
          experts.push(r.routing.experts);
          weights.push(r.routing.weights);
        }
        return ys;
      });
      route.experts.push(experts);
      route.weights.push(weights);
      assertFinite(X, l, "the MoE");
    });
    state.length += nb;

    const logits: Float32Array[] = [];
    const hidden: Float32Array[] = [];
    for (let b = 0; b < nb; b++) {
      const x = hcFinalRead(X.subarray(b * n * d, (b + 1) * n * d), n, d, this.hcHead, c.hc.eps);
      const h = rmsNorm(x, this.finalNorm, eps);
      hidden.push(h);
      if (b < rows.from || b >= rows.from + rows.count) continue;
      const z = matvec(this.lmHead, h, new Float32Array(c.vocab_size), c.vocab_size, d);
      assertFinite(z, null, "the output head (final norm, LM head)");
      logits.push(z);
    }
    const result: StepResult = { logits, logitsFrom: rows.from, hidden, route };
    if (snaps) result.snapshots = snaps;
    if (opts.collectSelections) result.selected = selected;
    return result;
  }

  /** Whether the model has an MTP draft head. */
  get hasMtp(): boolean {
    return this.mtp !== null;
  }

  /**
   * Runs MTP rows (hidden[i] of trunk position p, tokens[i] = the token at p + 1) at MTP
   * positions state.mtpLength + i, appending them to the MTP cache.
   */
  mtpForward(state: SequenceState, hidden: Float32Array[], tokens: number[]): MtpRows {
    if (!this.mtp || !state.mtp) throw new Error("this model has no MTP head (config.mtp is null)");
    if (state.config !== this.config) throw new Error("mtpForward: the state was made for another model config");
    checkTokens(tokens, this.config.vocab_size, "MTP token");
    const L = this.config.num_layers;
    return mtpForward(this.mtp, this.config, state.mtp, this.embed, this.lmHead, (e) => this.weights.expert(L, e), hidden, tokens, state.mtpLength);
  }
}
