// Layer-by-layer agreement of the engine with the reference (`cherenkov compare`): both run
// the same tokens in the same steps (the prompt as one batch, then one row per step, the
// engine's greedy tokens fed to both), and at every layer's MoE site, where both expose the
// hyper-connection streams X after the layer's mixer, the tool compares X and the layer's
// update (X minus X at the previous site) and the routed experts. An op that is wrong shows as
// an update error far above f32 rounding at a layer whose routing agrees; legitimate
// divergence (docs/model.md, "Comparing backends at depth") shows f32-level update errors,
// then an expert swap between two experts of near-equal weight or a q8 KV code that rounds
// the other way, after which the streams drift apart.
//
// The two run one after the other, not side by side: an 80b-shape model's reference and
// engine do not fit a 24 GB machine together.
import type { ModelFiles } from "../model/format.ts";
import { ReferenceModel } from "../reference/model.ts";
import type { Backend } from "../shim.ts";
import { encodeTrunkStep } from "./decode.ts";
import { loadEngine, type EngineOptions } from "./load.ts";
import { f32View, i32View } from "./scratch.ts";
import { SequenceState } from "./state.ts";
import { runStep, type SiteObservation } from "./step.ts";

/** One side's view of one step: X at each layer's MoE site, routing, and the greedy next token of the last row. */
interface SideStep {
  /** [layer] X [nb][n*d] copies. */
  X: Float32Array[];
  /** [layer][row] expert ids in rank order, and their weights. */
  experts: number[][][];
  weights: number[][][];
  next: number;
  margin: number;
}

export interface LayerAgreement {
  layer: number;
  type: "deltanet" | "attention";
  /** ||X_engine - X_ref|| / ||X_ref|| at the site, worst over steps, the reference running free: the accumulated difference. */
  streamsRel: number;
  /**
   * This layer's own error, worst over steps: the reference fed the engine's streams at the
   * previous site, its update to this site (the previous layer's MoE, this layer's PLE and mixer)
   * against the engine's, relative to the engine's.
   */
  updateRel: number;
  /** Rows whose routed expert sets differ from the same input (the forced run), of all rows over the steps. */
  routingDiffers: number;
  rows: number;
  /** Where routing differed: the largest weight an expert chosen by one side only had (small: a near-tie at the k-th place). */
  swappedWeight: number;
}

export interface StepAgreement {
  /** Rows in the step and the position of its first. */
  rows: number;
  pos0: number;
  engineNext: number;
  referenceNext: number;
  /** The reference's top-1 minus top-2 logit for its token. */
  referenceMargin: number;
}

export interface LayerComparison {
  tokens: number[];
  layers: LayerAgreement[];
  steps: StepAgreement[];
}

export interface CompareOptions {
  /** Decode steps after the prompt (default 4). */
  steps?: number;
  engine?: EngineOptions;
}


function relDiff(a: Float32Array, b: Float32Array): number {
  let num = 0;
  let den = 0;
  for (let i = 0; i < b.length; i++) {
    num += (a[i]! - b[i]!) ** 2;
    den += b[i]! ** 2;
  }
  return den === 0 ? (num === 0 ? 0 : Infinity) : Math.sqrt(num / den);
}

const minus = (a: Float32Array, b: Float32Array | null) => (b ? a.map((v, i) => v - b[i]!) : a);

/** Runs the engine over `prompt` and `steps` greedy tokens, recording every site. */
async function engineSide(files: ModelFiles, backend: Backend, prompt: number[], steps: number, opts: EngineOptions): Promise<{ tokens: number[]; batches: number[][]; sides: SideStep[] }> {
  const gpu = await loadEngine(files, backend, { ...opts, lookahead: opts.lookahead ?? true });
  const c = gpu.config;
  const seq = new SequenceState(gpu.device, c, gpu.maxContext);
  const counter = { value: 0 };
  const width = c.hc.streams * c.hidden_size;
  const k = c.moe.top_k;
  const sides: SideStep[] = [];
  const batches: number[][] = [];
  const tokens = [...prompt];
  try {
    const chunks: number[][] = [];
    for (let i = 0; i < prompt.length; i += gpu.prefillRows) chunks.push(prompt.slice(i, i + gpu.prefillRows));
    for (let s = 0; s < chunks.length + steps; s++) {
      const batch = s < chunks.length ? chunks[s]! : [tokens[tokens.length - 1]!];
      const nb = batch.length;
      const pos0 = seq.length;
      seq.checkRoom(nb);
      seq.writeTokens(pos0, batch);
      const side: SideStep = { X: [], experts: [], weights: [], next: -1, margin: NaN };
      const X = gpu.scratch.X;
      const observe = (o: SiteObservation) => {
        if (o.site.trunkLayer === null) return;
        // At the signal the GPU has written X through this layer's mixer and waits for the slot table.
        if (X.buffer.storage === "device") X.buffer.download(X.offset, nb * width * 4);
        side.X[o.site.layer] = f32View(X, nb * width).slice();
        side.experts[o.site.layer] = Array.from({ length: nb }, (_, r) => Array.from(o.ids.subarray(r * k, (r + 1) * k)));
        side.weights[o.site.layer] = Array.from({ length: nb }, (_, r) => Array.from(o.weights.subarray(r * k, (r + 1) * k)));
      };
      // Every site served at a handshake, resident or not: the observer reads X mid-step.
      await runStep(gpu, counter, (ctx, plan) => encodeTrunkStep(ctx, gpu, seq, { nb, pos0, verify: false, logits: { from: nb - 1, count: 1 } }, plan), observe, { handshakeAll: true });
      seq.length = pos0 + nb;
      side.next = i32View(gpu.scratch.head.next, 1)[0]!;
      side.margin = f32View(gpu.scratch.head.margins, 1)[0]!;
      sides.push(side);
      batches.push(batch);
      if (s >= chunks.length - 1 && s < chunks.length + steps - 1) tokens.push(side.next);
    }
  } finally {
    seq.dispose();
    await gpu.close();
  }
  return { tokens, batches, sides };
}

/**
 * Runs the reference over the same batches, recording every site. `forced`: at every site the
 * streams are replaced by the engine's (after recording the reference's own), so each layer
 * starts from the engine's input and its recorded X differs from the engine's only by what the
 * layer itself (the previous layer's MoE, this layer's mixer) computes differently.
 */
function referenceSide(files: ModelFiles, batches: number[][], forced: SideStep[] | null): SideStep[] {
  const model = new ReferenceModel(files);
  const state = model.newState();
  return batches.map((batch, s) => {
    const X: Float32Array[] = [];
    const onMoeSite = (l: number, x: Float32Array) => {
      X[l] = x.slice();
      if (forced) x.set(forced[s]!.X[l]!); // deliberately: the reference continues from the engine's streams
    };
    const r = model.forward(state, batch, { onMoeSite });
    const last = r.logits[r.logits.length - 1]!;
    let best = 0;
    for (let i = 1; i < last.length; i++) if (last[i]! > last[best]!) best = i;
    let second = -Infinity;
    for (let i = 0; i < last.length; i++) if (i !== best && last[i]! > second) second = last[i]!;
    return { X, experts: r.route.experts, weights: r.route.weights, next: best, margin: last[best]! - second };
  });
}

/**
 * Compares the engine on `backend` with the reference over `prompt` and `steps` more tokens.
 * Loads the engine, runs it, closes it, then runs the reference (one at a time).
 */
export async function compareLayers(files: ModelFiles, backend: Backend, prompt: number[], opts: CompareOptions = {}): Promise<LayerComparison> {
  if (prompt.length === 0) throw new Error("compare: the prompt is empty");
  const steps = opts.steps ?? 4;
  const c = files.config;
  const engine = await engineSide(files, backend, prompt, steps, opts.engine ?? {});
  const free = referenceSide(files, engine.batches, null);
  const forced = referenceSide(files, engine.batches, engine.sides);
  const layers: LayerAgreement[] = c.layer_types.map((type, layer) => ({ layer, type, streamsRel: 0, updateRel: 0, routingDiffers: 0, rows: 0, swappedWeight: 0 }));
  const stepRows: StepAgreement[] = [];
  let pos0 = 0;
  engine.sides.forEach((e, s) => {
    const r = free[s]!;
    const f = forced[s]!;
    const nb = engine.batches[s]!.length;
    for (const a of layers) {
      const l = a.layer;
      const ex = e.X[l];
      if (!ex || !r.X[l] || !f.X[l]) throw new Error(`compare: layer ${l} has no MoE site record`);
      a.streamsRel = Math.max(a.streamsRel, relDiff(ex, r.X[l]!));
      // The update from the same input: (forced X - input) against (engine X - input); layer 0's input is the embedding, equal on both.
      const input = l > 0 ? e.X[l - 1]! : null;
      const update = input ? ex.map((v, i) => v - input[i]!) : ex;
      a.updateRel = Math.max(a.updateRel, relDiff(f.X[l]!.map((v, i) => v - (input ? input[i]! : 0)), update));
      for (let row = 0; row < nb; row++) {
        a.rows++;
        const mine = e.experts[l]![row]!;
        const theirs = f.experts[l]![row]!;
        const onlyEngine = mine.filter((x) => !theirs.includes(x));
        if (onlyEngine.length === 0) continue;
        a.routingDiffers++;
        const onlyRef = theirs.filter((x) => !mine.includes(x));
        const w = (ids: number[], all: number[], ws: number[]) => Math.max(...ids.map((x) => ws[all.indexOf(x)]!));
        a.swappedWeight = Math.max(a.swappedWeight, w(onlyEngine, mine, e.weights[l]![row]!), w(onlyRef, theirs, f.weights[l]![row]!));
      }
    }
    stepRows.push({ rows: nb, pos0, engineNext: e.next, referenceNext: r.next, referenceMargin: r.margin });
    pos0 += nb;
  });
  return { tokens: engine.tokens, layers, steps: stepRows };
}

/**
 * The first layer whose own update (from the engine's input) differs by more than `threshold`
 * relative although the routing feeding it (the previous layer's MoE) agrees: a faulty op; or null.
 */
export function suspectLayer(cmp: LayerComparison, threshold = 1e-3): LayerAgreement | null {
  return cmp.layers.find((a) => a.updateRel > threshold && (a.layer === 0 || cmp.layers[a.layer - 1]!.routingDiffers === 0)) ?? null;
}
