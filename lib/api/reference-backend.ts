// The reference as a backend: exact, slow, pure TypeScript. Used as the oracle in tests and
// as the backend of last resort (`--backend reference`).
import type { Weights } from "../model/weights.ts";
import { MtpProposer, ReferenceModel, type SequenceState } from "../reference/index.ts";
import { argmax, topTwoMargin } from "../reference/ops.ts";
import { checkTokens } from "../reference/model.ts";
import { throwIfAborted, type Backend, type BackendSequence, type RowsResult, type SpeculativeResult } from "./backend.ts";

export interface ReferenceBackendOptions {
  /** Rows per prefill batch (default 512). */
  prefillChunk?: number;
}

class ReferenceSequence implements BackendSequence {
  private state: SequenceState;
  private proposer: MtpProposer | null;
  /** The newest committed row's hidden and position, waiting for its next token to reach the MTP head. */
  private pendingHidden: Float32Array | null = null;

  constructor(private model: ReferenceModel, private chunk: number) {
    this.state = model.newState();
    this.proposer = model.hasMtp ? new MtpProposer(model) : null;
  }

  get length() {
    return this.state.length;
  }

  /** Hands committed rows to the MTP proposer: row p's hidden pairs with token p+1. */
  private commitRows(tokens: number[], hidden: Float32Array[]) {
    if (!this.proposer) return;
    const hs = this.pendingHidden ? [this.pendingHidden, ...hidden] : hidden;
    const next = tokens;
    const pairs = this.pendingHidden ? next.length : next.length - 1;
    if (pairs > 0) this.proposer.commit(this.state, hs.slice(0, pairs), this.pendingHidden ? next : next.slice(1));
    this.pendingHidden = hs[hs.length - 1] ?? null;
  }

  async forward(tokens: number[], signal?: AbortSignal): Promise<RowsResult> {
    checkTokens(tokens, this.model.config.vocab_size, "token");
    const out: RowsResult = { next: [], margins: [] };
    for (let i = 0; i < tokens.length; i += this.chunk) {
      throwIfAborted(signal);
      const part = tokens.slice(i, i + this.chunk);
      const r = this.model.forward(this.state, part);
      this.commitRows(part, r.hidden);
      for (const l of r.logits) {
        out.next.push(argmax(l));
        out.margins.push(topTwoMargin(l));
      }
      await new Promise((r) => setImmediate(r)); // let an abort (e.g. a client disconnect) in between chunks
    }
    return out;
  }

  async speculate(next: number, drafts: number, signal?: AbortSignal): Promise<SpeculativeResult> {
    throwIfAborted(signal);
    if (!this.proposer) throw new Error("this model has no MTP head: speculative decoding is unavailable");
    // The proposer drafts for the position after the newest committed token: run `next`'s
    // pairing first by committing (pending hidden, next).
    if (this.pendingHidden) {
      this.proposer.commit(this.state, [this.pendingHidden], [next]);
      this.pendingHidden = null;
    }
    const ds = this.proposer.propose(this.state, drafts).slice(0, drafts);
    const r = this.model.forward(this.state, [next, ...ds], { snapshots: true });
    let a = 0;
    while (a < ds.length && argmax(r.logits[a]!) === ds[a]) a++;
    if (a < ds.length) this.state.restore(r.snapshots![a]!);
    const bonus = argmax(r.logits[a]!);
    const accepted = [...ds.slice(0, a), bonus];
    // rows 0..a are committed; row j's hidden pairs with accepted[j]
    this.proposer.commit(this.state, r.hidden.slice(0, a), accepted.slice(0, a));
    this.pendingHidden = r.hidden[a]!;
    return {
      next: accepted,
      margins: accepted.map((_, j) => topTwoMargin(r.logits[j]!)),
      proposed: ds.length,
    };
  }

  reset() {
    this.state = this.model.newState();
    this.proposer = this.model.hasMtp ? new MtpProposer(this.model) : null;
    this.pendingHidden = null;
  }

  dispose() {}
}

export class ReferenceBackend implements Backend {
  readonly name = "reference";
  readonly model: ReferenceModel;
  private chunk: number;
  constructor(private weights: Weights & { close?: () => void }, opts: ReferenceBackendOptions = {}) {
    this.model = new ReferenceModel(weights);
    this.chunk = opts.prefillChunk ?? 512;
  }
  get config() {
    return this.model.config;
  }
  get maxDrafts() {
    return this.model.config.mtp?.max_drafts ?? 0;
  }
  newSequence(): BackendSequence {
    return new ReferenceSequence(this.model, this.chunk);
  }
  stats() {
    return { backend: this.name };
  }
  async close() {
    this.weights.close?.();
  }
}
