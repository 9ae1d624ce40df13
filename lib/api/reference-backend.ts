// The reference as a backend: exact, slow, pure TypeScript. Used as the oracle in tests and
// as the backend of last resort (`--backend reference`).
import { ContextFullError } from "../gpu/state.ts";
import type { Weights } from "../model/weights.ts";
import { MtpProposer, ReferenceModel, type SequenceState } from "../reference/index.ts";
import { argmax, topTwoMargin } from "../reference/ops.ts";
import { checkTokens } from "../reference/model.ts";
import type { KvCache } from "../reference/kvcache.ts";
import { Draw, PenaltyCounts, sampleToken, samplingDistribution, speculativeTokens, tokenLogprobs, type RowSampling } from "../reference/sampling.ts";
import { forwardRange, rangeWithin, throwIfAborted, type Backend, type BackendCheckpoint, type BackendSequence, type ForwardOptions, type ForwardResult, type SampleRequest, type SpeculativeResult, type TokenLogprobs, type ReferenceBackendStats } from "./backend.ts";

/** A KV cache's live content. */
interface SavedCache {
  length: number;
  codes: Int8Array;
  scales: Float32Array;
  values: Float32Array;
}

const saveCache = (c: KvCache): SavedCache => ({ length: c.length, ...c.live() });

/** Refills an empty cache with saved content (append grows it, then the saved bytes overwrite). */
function loadCache(c: KvCache, saved: SavedCache): void {
  const zero = new Float32Array(c.heads * c.dim);
  for (let p = 0; p < saved.length; p++) c.append(zero);
  c.codes.set(saved.codes);
  c.scales.set(saved.scales);
  c.values.set(saved.values);
}

/** A copy of a reference sequence: its state's live values and the MTP head's pending rows. */
class ReferenceCheckpoint implements BackendCheckpoint {
  readonly bytes: number;
  constructor(
    readonly model: ReferenceModel,
    readonly length: number,
    readonly tokens: number[],
    readonly deltanet: ({ conv: Float32Array; S: Float32Array } | null)[],
    readonly attention: ({ k: SavedCache; v: SavedCache; ik: SavedCache | null } | null)[],
    readonly ple: (Float32Array | null)[],
    readonly mtp: { k: SavedCache; v: SavedCache } | null,
    /** (hidden, next token) pairs committed to the MTP proposer but not yet run by it. */
    readonly mtpPending: { hidden: Float32Array[]; next: number[] },
    readonly pendingHidden: Float32Array | null,
  ) {
    const arrays: ArrayBufferView[] = [];
    const cache = (c: SavedCache | null) => c && arrays.push(c.codes, c.scales, c.values);
    for (const d of deltanet) if (d) arrays.push(d.conv, d.S);
    for (const a of attention) if (a) [a.k, a.v, a.ik].forEach(cache);
    for (const h of ple) if (h) arrays.push(h);
    if (mtp) [mtp.k, mtp.v].forEach(cache);
    arrays.push(...mtpPending.hidden);
    if (pendingHidden) arrays.push(pendingHidden);
    this.bytes = arrays.reduce((a, v) => a + v.byteLength, 0) + 4 * (tokens.length + mtpPending.next.length);
  }
}

export interface ReferenceBackendOptions {
  /** Rows per prefill batch (default 512). */
  prefillChunk?: number;
  /** Positions a sequence may hold, as the engine's maxContext (default: unbounded, the caches grow). */
  maxContext?: number;
}

class ReferenceSequence implements BackendSequence {
  private state: SequenceState;
  private proposer: MtpProposer | null;
  /** The newest committed row's hidden and position, waiting for its next token to reach the MTP head. */
  private pendingHidden: Float32Array | null = null;
  /** What has been committed to the proposer and not yet consumed by a proposal (for checkpoints). */
  private mtpPending: { hidden: Float32Array[]; next: number[] } = { hidden: [], next: [] };

  constructor(
    private model: ReferenceModel,
    private chunk: number,
    private maxContext: number | null,
    from?: ReferenceCheckpoint,
  ) {
    this.state = model.newState();
    this.proposer = model.hasMtp ? new MtpProposer(model) : null;
    if (from) this.resume(from);
  }

  /** Hands (hidden, next) pairs to the MTP proposer, remembering them until a proposal consumes them. */
  private commitToProposer(hidden: Float32Array[], next: number[]): void {
    this.proposer!.commit(this.state, hidden, next);
    this.mtpPending.hidden.push(...hidden);
    this.mtpPending.next.push(...next);
  }

  checkpoint(): ReferenceCheckpoint {
    const s = this.state;
    const copy = (c: KvCache | null) => (c ? saveCache(c) : null);
    return new ReferenceCheckpoint(
      this.model,
      s.length,
      s.tokens.slice(),
      s.deltanet.map((d) => (d ? { conv: d.conv.slice(), S: d.S.slice() } : null)),
      s.attention.map((a) => (a ? { k: saveCache(a.k), v: saveCache(a.v), ik: copy(a.ik) } : null)),
      s.ple.map((p) => p?.history.slice() ?? null),
      s.mtp ? { k: saveCache(s.mtp.k), v: saveCache(s.mtp.v) } : null,
      { hidden: this.mtpPending.hidden.map((h) => h.slice()), next: this.mtpPending.next.slice() },
      this.pendingHidden?.slice() ?? null,
    );
  }

  /** Fills the fresh state with a checkpoint's copy. */
  private resume(from: ReferenceCheckpoint): void {
    const s = this.state;
    s.length = from.length;
    s.tokens.push(...from.tokens);
    s.deltanet.forEach((d, l) => {
      if (!d) return;
      d.conv.set(from.deltanet[l]!.conv);
      d.S.set(from.deltanet[l]!.S);
    });
    s.attention.forEach((a, l) => {
      if (!a) return;
      const saved = from.attention[l]!;
      loadCache(a.k, saved.k);
      loadCache(a.v, saved.v);
      if (a.ik) loadCache(a.ik, saved.ik!);
    });
    s.ple.forEach((p, l) => p?.history.set(from.ple[l]!));
    if (s.mtp && from.mtp) {
      loadCache(s.mtp.k, from.mtp.k);
      loadCache(s.mtp.v, from.mtp.v);
    }
    if (this.proposer && from.mtpPending.next.length > 0) this.commitToProposer(from.mtpPending.hidden.map((h) => h.slice()), from.mtpPending.next.slice());
    this.pendingHidden = from.pendingHidden?.slice() ?? null;
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
    if (pairs > 0) this.commitToProposer(hs.slice(0, pairs), this.pendingHidden ? next : next.slice(1));
    this.pendingHidden = hs[hs.length - 1] ?? null;
  }

  private disposed = false;

  private check(): void {
    if (this.disposed) throw new Error("the sequence is disposed");
  }

  /** The last row's logits (for resample). */
  private lastLogits: Float32Array | null = null;

  async resample(sample: SampleRequest): Promise<{ next: number; logprobs?: TokenLogprobs } | null> {
    this.check();
    const z = this.lastLogits;
    if (!z) return null;
    const next = sampleToken(z, rowSampling(sample, this.state.length));
    return { next, ...(sample.logprobs !== null ? { logprobs: tokenLogprobs(z, next, sample.logprobs) } : {}) };
  }

  /** Throws a ContextFullError unless `rows` more positions fit (the engine's rule and words). */
  private checkRoom(rows: number): void {
    if (this.maxContext !== null && this.state.length + rows > this.maxContext)
      throw new ContextFullError(
        `context full: the sequence holds ${this.state.length} tokens and ${rows} more would exceed maxContext ${this.maxContext} ` +
          "(raise it with Model.load(dir, { engine: { maxContext } }))",
      );
  }

  async forward(tokens: number[], opts: ForwardOptions = {}): Promise<ForwardResult> {
    this.check();
    checkTokens(tokens, this.model.config.vocab_size, "token");
    this.checkRoom(tokens.length);
    const { signal, sample } = opts;
    const wanted = forwardRange(opts, tokens.length);
    const out: ForwardResult = { first: wanted.from, next: [], margins: [] };
    // The sequence's last row's logits, when this call computed them (for resample).
    let last: Float32Array | null = null;
    for (let i = 0; i < tokens.length; i += this.chunk) {
      throwIfAborted(signal);
      this.check();
      const part = tokens.slice(i, i + this.chunk);
      const logitRows = rangeWithin(wanted, i, i + part.length);
      const r = this.model.forward(this.state, part, { logitRows });
      this.commitRows(part, r.hidden);
      for (const l of r.logits) {
        out.next.push(argmax(l));
        out.margins.push(topTwoMargin(l));
      }
      last = logitRows.count > 0 && logitRows.from + logitRows.count === part.length ? r.logits[r.logits.length - 1]! : null;
      await new Promise((r) => setImmediate(r)); // let an abort (e.g. a client disconnect) in between chunks
    }
    this.lastLogits = last;
    if (sample && last) {
      // The last row draws the token at position `length` (the row count now).
      const t = sampleToken(last, rowSampling(sample, this.state.length));
      out.next[out.next.length - 1] = t;
      if (sample.logprobs !== null) out.logprobs = [tokenLogprobs(last, t, sample.logprobs)];
    }
    return out;
  }

  async speculate(next: number, drafts: number, signal?: AbortSignal, sample?: SampleRequest): Promise<SpeculativeResult> {
    throwIfAborted(signal);
    this.check();
    if (!this.proposer) throw new Error("this model has no MTP head: speculative decoding is unavailable");
    this.checkRoom(1);
    // Drafts only into room the context has (they are rows of the verifying step).
    if (this.maxContext !== null) drafts = Math.min(drafts, this.maxContext - this.state.length - 1);
    // The proposer drafts for the position after the newest committed token: run `next`'s
    // pairing first by committing (pending hidden, next).
    if (this.pendingHidden) {
      this.commitToProposer([this.pendingHidden], [next]);
      this.pendingHidden = null;
    }
    // Under sampling, draft j is drawn from q_j (the MTP logits through the same transform)
    // at position length + 1 + j, and verified by rejection sampling against the target rows.
    const pos = this.state.length + 1;
    const qs: Float64Array[] = [];
    const pick = sample
      ? (logits: Float32Array, j: number) => {
          const row = rowSampling(sample, pos + j, dsSoFar);
          const q = samplingDistribution(logits, row.params, row.counts ?? null, row.extras);
          qs.push(q);
          const t = sampleToken(logits, row, Draw.draft);
          dsSoFar.push(t);
          return t;
        }
      : argmax;
    const dsSoFar: number[] = [];
    const ds = this.proposer.propose(this.state, drafts, pick).slice(0, drafts);
    if (drafts > 0) this.mtpPending = { hidden: [], next: [] };
    const r = this.model.forward(this.state, [next, ...ds], { snapshots: true });
    let a = 0;
    let accepted: number[];
    if (sample) {
      const v = speculativeTokens(r.logits, ds, qs, rowSampling(sample, pos));
      a = v.accepted;
      accepted = v.tokens;
    } else {
      while (a < ds.length && argmax(r.logits[a]!) === ds[a]) a++;
      accepted = [...ds.slice(0, a), argmax(r.logits[a]!)];
    }
    if (a < ds.length) this.state.restore(r.snapshots![a]!);
    this.lastLogits = r.logits[a]!;
    // rows 0..a are committed; row j's hidden pairs with accepted[j]
    this.commitToProposer(r.hidden.slice(0, a), accepted.slice(0, a));
    this.pendingHidden = r.hidden[a]!;
    const logprobs: TokenLogprobs[] | undefined =
      sample && sample.logprobs !== null ? accepted.map((t, j) => tokenLogprobs(r.logits[j]!, t, sample.logprobs!)) : undefined;
    return {
      next: accepted,
      margins: accepted.map((_, j) => topTwoMargin(r.logits[j]!)),
      proposed: ds.length,
      ...(logprobs ? { logprobs } : {}),
    };
  }

  reset() {
    this.lastLogits = null;
    this.state = this.model.newState();
    this.proposer = this.model.hasMtp ? new MtpProposer(this.model) : null;
    this.pendingHidden = null;
    this.mtpPending = { hidden: [], next: [] };
  }

  dispose() {
    this.disposed = true;
  }
}

/** A row's sampling inputs from a request: it draws the token at `position`. */
function rowSampling(s: SampleRequest, position: number, extras: readonly number[] = []): RowSampling {
  return { params: s.params, seed: s.seed, position, counts: s.counts, extras };
}

export class ReferenceBackend implements Backend {
  readonly name = "reference";
  readonly model: ReferenceModel;
  private chunk: number;
  readonly maxContext: number | null;
  constructor(private weights: Weights & { close?: () => void }, opts: ReferenceBackendOptions = {}) {
    this.model = new ReferenceModel(weights);
    this.chunk = opts.prefillChunk ?? 512;
    this.maxContext = opts.maxContext ?? null;
  }
  get config() {
    return this.model.config;
  }
  get maxDrafts() {
    return this.model.config.mtp?.max_drafts ?? 0;
  }
  newSequence(from?: BackendCheckpoint): BackendSequence {
    if (from && !(from instanceof ReferenceCheckpoint && from.model === this.model))
      throw new Error("the checkpoint was made by another model or backend: it resumes only where it was made");
    return new ReferenceSequence(this.model, this.chunk, this.maxContext, from);
  }
  penaltyCounts(): PenaltyCounts {
    return new PenaltyCounts(this.model.config.vocab_size);
  }
  stats(): ReferenceBackendStats {
    return { backend: this.name };
  }
  async close() {
    this.weights.close?.();
  }
}
