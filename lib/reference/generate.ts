// Greedy generation with the reference model: plain (one row per step) or speculative
// (MTP drafts verified as one row batch, rolled back to the last accepted row). Both must
// produce the same tokens: speculation only changes how many rows a step runs.
import type { Weights } from "../model/weights.ts";
import { checkTokens, ReferenceModel, type RouteStep, type StepResult } from "./model.ts";
import { argmax, topTwoMargin } from "./ops.ts";
import type { SequenceState } from "./state.ts";

export interface GenerateOptions {
  /** Tokens to generate (the continuation, prompt excluded). */
  maxTokens: number;
  /** Drafts per verify step (0 = plain greedy); at most config.mtp.max_drafts. */
  drafts?: number;
  /** Prefill row-batch size (default: the whole prompt in one batch). */
  prefillChunk?: number;
  /** Stop after emitting eos_token_id (default false: always maxTokens tokens). */
  stopAtEos?: boolean;
  /** Where drafts come from (default: the model's MTP head). Tests plug in others. */
  proposer?: DraftProposer;
}

export interface DraftStats {
  /** Drafts proposed, in total. */
  proposed: number;
  /** Drafts accepted, in total. */
  accepted: number;
  /** byPosition[j]: how often draft j+1 of a step was accepted. */
  byPosition: number[];
  /** proposedByPosition[j]: how often a step proposed a draft j+1. */
  proposedByPosition: number[];
}

export interface Generation {
  /** The generated continuation. */
  tokens: number[];
  /** margins[i] = top1 - top2 logit of the row whose argmax is tokens[i]. */
  margins: number[];
  /** One entry per trunk forward, as executed (verify batches include rejected rows). */
  trace: RouteStep[];
  /** With drafts > 0: what speculation proposed and what was accepted. */
  drafts?: DraftStats;
}

/** A source of draft tokens for speculative decoding. */
export interface DraftProposer {
  /**
   * The trunk committed rows: hidden[i] is the final hidden of trunk position p_i (ascending,
   * continuing from the previous commit) and next[i] the token at p_i + 1.
   */
  commit(state: SequenceState, hidden: Float32Array[], next: number[]): void;
  /** Up to `count` drafts for the positions after the last committed next token. */
  propose(state: SequenceState, count: number): number[];
}

/**
 * Drafts from the MTP head. Committed rows are run lazily before drafting (the "catch-up":
 * MTP entry p = (h_p, tok[p+1]) at MTP position p); chained drafts then run one row each,
 * feeding (out, draft) back, and those speculative entries are dropped afterwards.
 */
export class MtpProposer implements DraftProposer {
  private pendingHidden: Float32Array[] = [];
  private pendingNext: number[] = [];
  constructor(private model: ReferenceModel) {
    if (!model.hasMtp) throw new Error("speculative decoding needs an MTP head (config.mtp is null)");
  }
  commit(_state: SequenceState, hidden: Float32Array[], next: number[]): void {
    this.pendingHidden.push(...hidden);
    this.pendingNext.push(...next);
  }
  /** `pick(logits, j)` chooses draft j from its MTP logits (default: the argmax). */
  propose(state: SequenceState, count: number, pick: (logits: Float32Array, j: number) => number = argmax): number[] {
    if (count <= 0) return [];
    if (this.pendingNext.length === 0) throw new Error("MtpProposer: nothing committed to draft from");
    let rows = this.model.mtpForward(state, this.pendingHidden, this.pendingNext);
    this.pendingHidden = [];
    this.pendingNext = [];
    const committed = state.mtpLength;
    const drafts = [pick(rows.logits[rows.logits.length - 1]!, 0)];
    let out = rows.out[rows.out.length - 1]!;
    while (drafts.length < count) {
      rows = this.model.mtpForward(state, [out], [drafts[drafts.length - 1]!]);
      drafts.push(pick(rows.logits[0]!, drafts.length));
      out = rows.out[0]!;
    }
    state.truncateMtp(committed);
    return drafts;
  }
}

/** Greedy generation from `prompt`; with drafts > 0, speculative with verification. */
export function generateGreedy(weights: Weights | ReferenceModel, prompt: number[], opts: GenerateOptions): Generation {
  const model = weights instanceof ReferenceModel ? weights : new ReferenceModel(weights);
  const c = model.config;
  const drafts = opts.drafts ?? 0;
  if (prompt.length === 0) throw new Error("generateGreedy: the prompt is empty");
  checkTokens(prompt, c.vocab_size, "prompt token");
  if (!Number.isInteger(opts.maxTokens) || opts.maxTokens < 0) throw new Error(`generateGreedy: maxTokens ${opts.maxTokens} must be an integer >= 0`);
  if (!Number.isInteger(drafts) || drafts < 0) throw new Error(`generateGreedy: drafts ${drafts} must be an integer >= 0`);
  if (drafts > 0 && !opts.proposer) {
    if (!c.mtp) throw new Error("generateGreedy: drafts need an MTP head, and config.mtp is null");
    if (drafts > c.mtp.max_drafts) throw new Error(`generateGreedy: drafts ${drafts} exceeds mtp.max_drafts (${c.mtp.max_drafts})`);
  }
  const chunk = opts.prefillChunk ?? prompt.length;
  if (!Number.isInteger(chunk) || chunk < 1) throw new Error(`generateGreedy: prefillChunk ${chunk} must be an integer >= 1`);

  const state = model.newState();
  const out: Generation = { tokens: [], margins: [], trace: [] };
  const eos = c.eos_token_id;
  let done = opts.maxTokens === 0;
  // Appends a generated token; false once generation must stop.
  const emit = (token: number, logits: Float32Array): boolean => {
    out.tokens.push(token);
    out.margins.push(topTwoMargin(logits));
    done = out.tokens.length >= opts.maxTokens || (opts.stopAtEos === true && token === eos);
    return !done;
  };
  const run = (tokens: number[], snapshots = false): StepResult => {
    const r = model.forward(state, tokens, { snapshots });
    out.trace.push(r.route);
    return r;
  };

  // Prefill.
  const prefillHidden: Float32Array[] = [];
  let last!: StepResult;
  for (let i = 0; i < prompt.length; i += chunk) {
    last = run(prompt.slice(i, i + chunk));
    prefillHidden.push(...last.hidden);
  }
  if (done) return out;
  let lastLogits = last.logits[last.logits.length - 1]!;
  let next = argmax(lastLogits);
  emit(next, lastLogits);

  if (drafts === 0) {
    while (!done) {
      const r = run([next]);
      lastLogits = r.logits[0]!;
      next = argmax(lastLogits);
      emit(next, lastLogits);
    }
    return out;
  }

  const proposer = opts.proposer ?? new MtpProposer(model);
  const stats: DraftStats = { proposed: 0, accepted: 0, byPosition: new Array(drafts).fill(0), proposedByPosition: new Array(drafts).fill(0) };
  out.drafts = stats;
  proposer.commit(state, prefillHidden, [...prompt.slice(1), next]);
  while (!done) {
    // A verify step yields accepted drafts + 1 bonus token: never draft past maxTokens.
    const k = Math.min(drafts, opts.maxTokens - out.tokens.length - 1);
    const ds = proposer.propose(state, k).slice(0, k);
    checkTokens(ds, c.vocab_size, "draft token");
    const r = run([next, ...ds], true);
    let a = 0;
    while (a < ds.length && argmax(r.logits[a]!) === ds[a]) a++;
    stats.proposed += ds.length;
    stats.accepted += a;
    for (let j = 0; j < ds.length; j++) stats.proposedByPosition[j]! += 1;
    for (let j = 0; j < a; j++) stats.byPosition[j]! += 1;
    const bonus = argmax(r.logits[a]!);
    if (a < ds.length) state.restore(r.snapshots![a]!);
    let going = true;
    for (let j = 0; j < a && going; j++) going = emit(ds[j]!, r.logits[j]!);
    if (going) emit(bonus, r.logits[a]!);
    if (done) break;
    proposer.commit(state, r.hidden.slice(0, a + 1), [...ds.slice(0, a), bonus]);
    next = bonus;
  }
  return out;
}
