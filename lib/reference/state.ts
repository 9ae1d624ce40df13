// The state of one sequence (MODEL.md, DESIGN.md "Sequence state"): per DeltaNet layer the
// conv window and the recurrent state, per attention layer the K/V cache and the QSA index
// keys, per PLE layer the conv history, the tokens seen (the n-gram hash looks back), and
// the MTP layer's KV cache. Caches only grow, so a snapshot copies the fixed-size parts and
// remembers lengths; restoring truncates the caches back to those lengths.
import { dims, type ModelConfig } from "../model/config.ts";
import { KvCache } from "./kvcache.ts";

export interface DeltaNetState {
  /** The last K-1 conv inputs, oldest first: [K-1, channels]. */
  conv: Float32Array;
  /** Recurrent state per value head: [Hv, dk, dv]. */
  S: Float32Array;
}

export interface AttentionState {
  k: KvCache;
  v: KvCache;
  /** QSA index keys [positions, 1, di]; null for dense attention. */
  ik: KvCache | null;
}

export interface PleState {
  /** The last (K-1) * dilation conv inputs (RMSNorm(v, cn)), oldest first: [(K-1)*dil, d]. */
  history: Float32Array;
}

/** A point to roll back to. Valid while the caches up to its length are untouched. */
export class StateSnapshot {
  /** DeltaNet states per layer (null for attention layers); filled as a forward pass goes. */
  readonly deltanet: (DeltaNetState | null)[];
  /** PLE conv histories per layer (null where no PLE). */
  readonly ple: (Float32Array | null)[];
  constructor(
    readonly owner: SequenceState,
    readonly epoch: number,
    /** Trunk positions (tokens) covered. */
    readonly length: number,
    readonly mtpLength: number,
    layers: number,
  ) {
    this.deltanet = new Array(layers).fill(null);
    this.ple = new Array(layers).fill(null);
  }
}

export class SequenceState {
  /** Trunk positions processed (the next row's position). */
  length = 0;
  /** Every token processed, by position (the PLE hash reads back up to max order - 1). */
  readonly tokens: number[] = [];
  readonly deltanet: (DeltaNetState | null)[];
  readonly attention: (AttentionState | null)[];
  readonly ple: (PleState | null)[];
  /** The MTP layer's cache: entry p is the draft-head row at position p. */
  readonly mtp: AttentionState | null;
  // Restores bump the epoch and log how far they truncated, so a stale snapshot is refused.
  private epoch = 0;
  private truncations: { epoch: number; length: number; mtpLength: number }[] = [];

  constructor(readonly config: ModelConfig) {
    const c = config;
    const D = dims(c);
    const at = c.attention;
    const newAttention = (qsa: boolean): AttentionState => ({
      k: new KvCache(at.kv_cache, at.kv_heads, at.head_dim),
      v: new KvCache(at.kv_cache, at.kv_heads, at.head_dim),
      ik: qsa && at.qsa ? new KvCache(at.kv_cache, 1, at.qsa.head_dim) : null,
    });
    this.deltanet = c.layer_types.map((t) =>
      t === "deltanet"
        ? {
            conv: new Float32Array((c.deltanet.conv_kernel - 1) * D.dnConvChannels),
            S: new Float32Array(c.deltanet.value_heads * c.deltanet.key_dim * c.deltanet.value_dim),
          }
        : null,
    );
    this.attention = c.layer_types.map((t) => (t === "attention" ? newAttention(true) : null));
    this.ple = c.layer_types.map((_, l) =>
      c.ple && c.ple.layers.includes(l) ? { history: new Float32Array((c.ple.conv_kernel - 1) * D.pleDilation * D.d) } : null,
    );
    this.mtp = c.mtp ? newAttention(false) : null;
  }

  get mtpLength(): number {
    return this.mtp ? this.mtp.k.length : 0;
  }

  /** An empty snapshot at `length` whose fixed-size parts the caller fills (per-row snapshots). */
  blankSnapshot(length: number): StateSnapshot {
    return new StateSnapshot(this, this.epoch, length, this.mtpLength, this.config.num_layers);
  }

  /** Copies the fixed-size state of DeltaNet layer l into snap. */
  captureDeltaNet(snap: StateSnapshot, l: number): void {
    const s = this.deltanet[l]!;
    snap.deltanet[l] = { conv: s.conv.slice(), S: s.S.slice() };
  }

  /** Copies the conv history of PLE layer l into snap. */
  capturePle(snap: StateSnapshot, l: number): void {
    snap.ple[l] = this.ple[l]!.history.slice();
  }

  /** A snapshot of the whole state as it is now. */
  snapshot(): StateSnapshot {
    const snap = this.blankSnapshot(this.length);
    this.deltanet.forEach((s, l) => s && this.captureDeltaNet(snap, l));
    this.ple.forEach((s, l) => s && this.capturePle(snap, l));
    return snap;
  }

  /** Rolls the whole state (trunk and MTP cache) back to a snapshot taken earlier. */
  restore(snap: StateSnapshot): void {
    if (snap.owner !== this) throw new Error("restore: the snapshot belongs to another sequence");
    if (snap.length > this.length || snap.mtpLength > this.mtpLength)
      throw new Error(`restore: snapshot at length ${snap.length} is ahead of the state (length ${this.length})`);
    for (const t of this.truncations) {
      if (t.epoch >= snap.epoch && (snap.length > t.length || snap.mtpLength > t.mtpLength))
        throw new Error(`restore: snapshot at length ${snap.length} is stale (the state was rolled back to ${t.length} after it was taken)`);
    }
    this.deltanet.forEach((s, l) => {
      if (!s) return;
      const saved = snap.deltanet[l];
      if (!saved) throw new Error(`restore: snapshot lacks DeltaNet layer ${l}`);
      s.conv.set(saved.conv);
      s.S.set(saved.S);
    });
    this.ple.forEach((s, l) => {
      if (!s) return;
      const saved = snap.ple[l];
      if (!saved) throw new Error(`restore: snapshot lacks PLE layer ${l}`);
      s.history.set(saved);
    });
    this.truncateTrunk(snap.length);
    this.dropMtp(snap.mtpLength);
    this.logTruncation(snap.length, snap.mtpLength);
  }

  /**
   * Drops MTP cache entries at positions >= len (speculative chained-draft rows). Logged like a
   * restore, so a snapshot taken while those rows were cached is refused afterwards.
   */
  truncateMtp(len: number): void {
    if (!this.mtp || len >= this.mtpLength) return;
    this.dropMtp(len);
    this.logTruncation(this.length, len);
  }

  private dropMtp(len: number): void {
    if (!this.mtp) return;
    this.mtp.k.truncate(len);
    this.mtp.v.truncate(len);
  }

  private logTruncation(length: number, mtpLength: number): void {
    this.truncations.push({ epoch: this.epoch, length, mtpLength });
    this.epoch++;
  }

  /**
   * Every live value of the state by name (caches cut at their lengths), for exact
   * comparisons between two states.
   */
  live(): Map<string, ArrayLike<number>> {
    const m = new Map<string, ArrayLike<number>>();
    m.set("length", [this.length]);
    m.set("tokens", this.tokens.slice());
    const cache = (name: string, c: KvCache) => {
      const l = c.live();
      m.set(`${name}.codes`, l.codes);
      m.set(`${name}.scales`, l.scales);
      m.set(`${name}.values`, l.values);
    };
    const attention = (p: string, a: AttentionState) => {
      cache(`${p}.k`, a.k);
      cache(`${p}.v`, a.v);
      if (a.ik) cache(`${p}.ik`, a.ik);
    };
    this.deltanet.forEach((s, l) => {
      if (!s) return;
      m.set(`layers.${l}.dn.conv`, s.conv.slice());
      m.set(`layers.${l}.dn.S`, s.S.slice());
    });
    this.attention.forEach((a, l) => a && attention(`layers.${l}.attn`, a));
    this.ple.forEach((s, l) => s && m.set(`layers.${l}.ple.history`, s.history.slice()));
    if (this.mtp) attention("mtp.attn", this.mtp);
    return m;
  }

  private truncateTrunk(len: number): void {
    this.length = len;
    this.tokens.length = len;
    for (const a of this.attention) {
      if (!a) continue;
      a.k.truncate(len);
      a.v.truncate(len);
      a.ik?.truncate(len);
    }
  }
}
