// Sequence state on the device (DESIGN.md "Sequence state"): per DeltaNet layer the
// recurrent state S and the conv window, per attention layer the K/V caches and the QSA
// index keys, per PLE layer the conv history, the tokens by position (the n-gram hash and
// the embedding read them), the trunk's final hidden rows by position (the MTP head's
// input), and the MTP layer's K/V. Caches only grow; a verify batch's rollback copies the
// snapshot planes of its last accepted row over the fixed-size state (S, windows, PLE
// history) and cuts the lengths back. Commit is the lengths moving forward.
// The fixed-size state lies in one buffer (fixedLayout), and each snapshot plane is a copy
// of that layout: a rollback is one copy of plane r over the whole of it, one dispatch.
import { dims, type ModelConfig } from "../model/config.ts";
import type { Buffer, Device, Storage } from "../shim.ts";
import { allocateKvCache, kvCacheBytes, type KvCacheRef } from "./attention.ts";
import { deltanetStateFloats } from "./deltanet.ts";
import { MAX_SNAP } from "./limits.ts";
import { pleHistoryFloats } from "./ple.ts";
import { bind, type EncodeContext as EncodeContext } from "./dispatch.ts";
import { encodeRestore, planesLayout, planesWithin, SNAPSHOT_PLANES, type SnapshotPlanes } from "./snapshots.ts";

/** The sequence would grow past the capacity it was allocated with. */
export class ContextFullError extends RangeError {
  override name = "ContextFullError";
  /** The tokens the generation produced before the context filled (none when the prompt did not fit). */
  tokens: number[] = [];
  /** Their text. */
  text = "";
}

/** A piece of the fixed-size state: `floats` values at `offset` of the sequence's `fixed` buffer (a binding). */
export interface StatePiece {
  readonly buffer: Buffer;
  readonly offset: number;
  readonly floats: number;
}

export interface DeltaNetLayerState {
  S: StatePiece;
  conv: StatePiece;
}

export interface AttentionLayerState {
  k: KvCacheRef;
  v: KvCacheRef;
  ik: KvCacheRef | null;
}

/** Sizes of the fixed-size state pieces of a config. */
export function stateShapes(c: ModelConfig) {
  const D = dims(c);
  const dn = c.deltanet;
  return {
    S: deltanetStateFloats({ keyHeads: dn.key_heads, keyDim: dn.key_dim, valueHeads: dn.value_heads, valueDim: dn.value_dim }),
    conv: (dn.conv_kernel - 1) * D.dnConvChannels,
    ple: c.ple ? pleHistoryFloats(D.d, c.ple.conv_kernel, D.pleDilation) : 0,
  };
}

/**
 * Byte offsets of the fixed-size state's pieces in one buffer (and in each snapshot plane):
 * per DeltaNet layer S and its conv window, per PLE layer the history, each from a 256-byte
 * boundary (planesLayout's stride); `bytes` in all, a multiple of 256.
 */
export function fixedLayout(c: ModelConfig): { bytes: number; deltanet: ({ S: number; conv: number } | null)[]; ple: (number | null)[] } {
  const s = stateShapes(c);
  let bytes = 0;
  const take = (floats: number) => {
    const at = bytes;
    bytes += planesLayout(floats).stride;
    return at;
  };
  const deltanet = c.layer_types.map((t) => (t === "deltanet" ? { S: take(s.S), conv: take(Math.max(1, s.conv)) } : null));
  const ple = c.layer_types.map((_, l) => (c.ple?.layers.includes(l) ? take(s.ple) : null));
  return { bytes: Math.max(bytes, 256), deltanet, ple };
}

/** Positions the MTP cache and token buffer hold beyond maxContext (a verify batch's drafts, chained draft rows). */
const SPARE = MAX_SNAP + 2;

/** Bytes one sequence's state takes (for the budget's fixed buffers). */
export function sequenceStateBytes(c: ModelConfig, maxContext: number): number {
  const at = c.attention;
  const kv = (heads: number, dim: number, cap: number) => {
    const b = kvCacheBytes(at.kv_cache, heads, dim, cap);
    return b.data + b.scales;
  };
  let bytes = (maxContext + SPARE) * 4 + fixedLayout(c).bytes;
  for (const type of c.layer_types) if (type !== "deltanet") bytes += 2 * kv(at.kv_heads, at.head_dim, maxContext) + (at.qsa ? kv(1, at.qsa.head_dim, maxContext) : 0);
  if (c.mtp) bytes += (maxContext + SPARE) * c.hidden_size * 4 + 2 * kv(at.kv_heads, at.head_dim, maxContext + SPARE);
  return bytes;
}

/** A byte range of one of a sequence's buffers. */
interface StateRegion {
  buffer: Buffer;
  offset: number;
  bytes: number;
}

/**
 * A host copy of a sequence's used state (prefix checkpoints): the regions' bytes in the order
 * SequenceState.regions lists them for these lengths. No weights, slots or event counters.
 */
export interface StateImage {
  readonly config: ModelConfig;
  readonly length: number;
  readonly mtpLength: number;
  readonly parts: readonly Uint8Array[];
  readonly bytes: number;
}

/** One sequence's device state. */
export class SequenceState {
  /** Trunk positions processed. */
  length = 0;
  /** MTP positions processed (entry p pairs trunk hidden p with token p + 1). */
  mtpLength = 0;
  readonly tokens: Buffer;
  /** The fixed-size state (fixedLayout): the pieces below lie in it. */
  readonly fixed: Buffer;
  readonly deltanet: (DeltaNetLayerState | null)[];
  readonly attention: (AttentionLayerState | null)[];
  readonly ple: (StatePiece | null)[];
  /** Final hidden rows by trunk position [capacity][d] (models with MTP only). */
  readonly hidden: Buffer | null;
  readonly mtp: { k: KvCacheRef; v: KvCacheRef } | null;
  #buffers: Buffer[] = [];
  #disposed = false;
  /** Whether dispose() ran (or the engine forgot it: a step prepared for it is never used). */
  get disposed(): boolean {
    return this.#disposed || this.forgotten;
  }
  /** Set by the engine when its sequence is disposed (its state goes at the next turn of the lock). */
  forgotten = false;

  constructor(
    readonly device: Device,
    readonly config: ModelConfig,
    /** Trunk positions the caches hold. */
    readonly capacity: number,
  ) {
    const c = config;
    const s = stateShapes(c);
    const at = c.attention;
    // Only kernels touch the state between steps: device storage (GPU memory on cuda). The host
    // reaches it through reset, capture and restore, which upload or download.
    const buf = (bytes: number, storage: Storage = "device") => {
      const b = device.buffer(bytes, storage);
      this.#buffers.push(b);
      return b;
    };
    const cache = (heads: number, dim: number, cap: number) => {
      const kv = allocateKvCache(device, at.kv_cache, heads, dim, cap, "device");
      this.#buffers.push(kv.data as Buffer);
      if (kv.scales) this.#buffers.push(kv.scales as Buffer);
      return kv;
    };
    this.tokens = buf((capacity + SPARE) * 4, "shared"); // written by the host before each step (a cycle's drafts: by the GPU)
    const layout = fixedLayout(c);
    const fixed = (this.fixed = buf(layout.bytes));
    const piece = (offset: number, floats: number): StatePiece => ({ buffer: fixed, offset, floats });
    this.deltanet = layout.deltanet.map((o) => (o ? { S: piece(o.S, s.S), conv: piece(o.conv, Math.max(1, s.conv)) } : null));
    this.attention = c.layer_types.map((t) =>
      t === "attention"
        ? { k: cache(at.kv_heads, at.head_dim, capacity), v: cache(at.kv_heads, at.head_dim, capacity), ik: at.qsa ? cache(1, at.qsa.head_dim, capacity) : null }
        : null,
    );
    this.ple = layout.ple.map((o) => (o === null ? null : piece(o, s.ple)));
    this.hidden = c.mtp ? buf((capacity + SPARE) * c.hidden_size * 4) : null;
    this.mtp = c.mtp ? { k: cache(at.kv_heads, at.head_dim, capacity + SPARE), v: cache(at.kv_heads, at.head_dim, capacity + SPARE) } : null;
  }

  /** Throws a ContextFullError unless `rows` more positions fit. */
  checkRoom(rows: number): void {
    if (this.length + rows > this.capacity)
      throw new ContextFullError(
        `context full: the sequence holds ${this.length} tokens and ${rows} more would exceed maxContext ${this.capacity} ` +
          "(raise it with Model.load(dir, { engine: { maxContext } }))",
      );
  }

  /** Writes tokens at positions `pos`.. of the token buffer. */
  writeTokens(pos: number, tokens: readonly number[]): void {
    if (pos + tokens.length > this.capacity + SPARE) throw new ContextFullError(`token positions ${pos}..${pos + tokens.length - 1} exceed the buffer`);
    this.tokens.i32.set(tokens, pos);
  }

  /** Forgets every row: lengths to 0, fixed-size state to zero (caches are overwritten as they regrow). */
  reset(): void {
    this.length = 0;
    this.mtpLength = 0;
    this.fixed.f32.fill(0);
    this.fixed.upload();
  }

  /** A piece's values, downloaded (tests). */
  readPiece(p: StatePiece): Float32Array {
    this.fixed.download(p.offset, p.floats * 4);
    return this.fixed.f32.slice(p.offset / 4, p.offset / 4 + p.floats);
  }

  /**
   * The regions that hold a sequence of `length` trunk rows and `mtpLength` MTP rows: tokens,
   * fixed-size state (DeltaNet S and conv windows, PLE histories), KV and QSA index keys up to
   * the length, the hidden rows the MTP head has not consumed, and the MTP cache.
   */
  private regions(length: number, mtpLength: number): StateRegion[] {
    const out: StateRegion[] = [];
    // An empty sequence is a fresh state (its zeroing after a reset may still be queued).
    if (length === 0) return out;
    const whole = (b: Buffer) => out.push({ buffer: b, offset: 0, bytes: b.length });
    const binding = (b: KvCacheRef["data"]) => ("buffer" in b ? { buffer: b.buffer, offset: b.offset } : { buffer: b, offset: 0 });
    const cache = (kv: KvCacheRef, rows: number) => {
      const used = kvCacheBytes(kv.kind, kv.heads, kv.dim, rows);
      out.push({ ...binding(kv.data), bytes: used.data });
      if (kv.scales) out.push({ ...binding(kv.scales), bytes: used.scales });
    };
    out.push({ buffer: this.tokens, offset: 0, bytes: length * 4 });
    whole(this.fixed);
    for (const a of this.attention) {
      if (!a) continue;
      cache(a.k, length);
      cache(a.v, length);
      if (a.ik) cache(a.ik, length);
    }
    if (this.hidden && this.mtp) {
      const row = this.config.hidden_size * 4;
      out.push({ buffer: this.hidden, offset: mtpLength * row, bytes: (length - mtpLength) * row });
      cache(this.mtp.k, mtpLength);
      cache(this.mtp.v, mtpLength);
    }
    return out;
  }

  /** A host copy of the used state (no step of this sequence may be in flight). */
  capture(): StateImage {
    if (this.#disposed) throw new Error("capture: the sequence state is released");
    const parts = this.regions(this.length, this.mtpLength).map((r) => {
      r.buffer.download(r.offset, r.bytes);
      return r.buffer.bytes.slice(r.offset, r.offset + r.bytes);
    });
    return { config: this.config, length: this.length, mtpLength: this.mtpLength, parts, bytes: parts.reduce((a, p) => a + p.length, 0) };
  }

  /** Writes an image captured from a sequence of the same config back (this sequence's rows are replaced). */
  restoreImage(image: StateImage): void {
    if (image.config !== this.config) throw new Error("restore: the state image belongs to another model");
    if (image.length > this.capacity) throw new ContextFullError(`restore: the image holds ${image.length} tokens, more than maxContext ${this.capacity}`);
    const regions = this.regions(image.length, image.mtpLength);
    if (regions.length !== image.parts.length) throw new Error(`restore: the image has ${image.parts.length} parts, this state ${regions.length}`);
    regions.forEach((r, i) => {
      const part = image.parts[i]!;
      if (part.length !== r.bytes) throw new Error(`restore: part ${i} has ${part.length} bytes, expected ${r.bytes}`);
      r.buffer.bytes.set(part, r.offset);
      r.buffer.upload(r.offset, r.bytes);
    });
    this.length = image.length;
    this.mtpLength = image.mtpLength;
  }

  /** Bytes of device memory this sequence holds. */
  get bytes(): number {
    return this.#buffers.reduce((a, b) => a + b.length, 0);
  }

  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const b of this.#buffers) b.release();
    this.#buffers = [];
  }
}

/**
 * The rollback planes of a verify batch, shared by every sequence of an engine: SNAPSHOT_PLANES
 * copies of the fixed-size state's layout (fixedLayout) in one buffer, plane r = the state
 * after row r; per DeltaNet layer its S and conv window planes, per PLE layer its history's,
 * lie in them. A rollback may wait until the sequence's next step, but runs before any other
 * step (the next verify overwrites the planes): engine.ts, pending rollbacks.
 */
export class SnapshotSet {
  readonly deltanet: ({ S: SnapshotPlanes; conv: SnapshotPlanes } | null)[];
  readonly ple: (SnapshotPlanes | null)[];
  /** Every piece at once: a plane is the whole layout. */
  private readonly whole: SnapshotPlanes;

  constructor(device: Device, config: ModelConfig) {
    const s = stateShapes(config);
    const layout = fixedLayout(config);
    const buffer = device.buffer(SnapshotSet.bytes(config), "device");
    const at = (offset: number, floats: number) => planesWithin(buffer, offset, floats, layout.bytes);
    this.deltanet = layout.deltanet.map((o) => (o ? { S: at(o.S, s.S), conv: at(o.conv, Math.max(1, s.conv)) } : null));
    this.ple = layout.ple.map((o) => (o === null ? null : at(o, s.ple)));
    this.whole = at(0, layout.bytes / 4);
  }

  /** Frees the planes' buffer. */
  release(): void {
    this.whole.buffer.release();
  }

  /** Bytes the planes take for a config. */
  static bytes(config: ModelConfig): number {
    return SNAPSHOT_PLANES * fixedLayout(config).bytes;
  }

  /**
   * Restores `seq`'s fixed-size state (DeltaNet S and conv windows, PLE histories) to right
   * after row `row` of the last verify batch (its planes are the last ones written): one copy
   * of the plane over the whole layout (the alignment gaps and the pieces of layers a step
   * does not run carry nothing read). The caller cuts the lengths (caches roll back by
   * length). Binds only fixed regions: a speculative cycle records it (engine.ts).
   */
  encodeRestore(ctx: EncodeContext, seq: SequenceState, row: number): void {
    if (!Number.isInteger(row) || row < 0 || row >= SNAPSHOT_PLANES) throw new RangeError(`rollback: row ${row} outside 0..${SNAPSHOT_PLANES - 1}`);
    encodeRestore(ctx, { planes: this.whole, plane: row, live: bind(seq.fixed) });
  }
}
