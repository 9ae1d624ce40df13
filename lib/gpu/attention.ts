// Attention mixer dispatch (docs/model.md, Mixer B): RoPE on q and k, the K/V and QSA
// index-key cache appends (q8 or f32), the QSA index scores and top-k selection, and the
// softmax attention over the cache (causal, or the selected positions), split over
// positions for long-context decode, optionally with the sigmoid output gate applied where
// o is written; prompt chunks that read every position go through the tile API instead
// (attn_tiles, from ATTN_TILES_MIN_ROWS rows on a GPU). encodeAttnPrep does q/k norms + RoPE + the K/V appends in one dispatch.
// The projections are the dense kernels'. Order within a step: norms, RoPE, append K/V
// (and ik), then QSA and attention read everything back from the caches, this batch included.
import { ropeInvFreq } from "../model/rope.ts";
import type { Binding, Buffer, Device, Storage } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { envCount } from "./env-switch.ts";
import { SIMD_WIDTH, threadsWithin, tiledMinRows } from "./limits.ts";
import { Params } from "./params.ts";
import { ROPE_MAX_PAIRS, SEQ_MAX_HEAD_DIM } from "./params-sequence.ts";
import { checkRows, checkVector } from "./projections.ts";

const at = (r: RowsRef): Binding => bind(r.buffer, r.offset);

// ---- RoPE ----------------------------------------------------------------------------

const ropeTables = new Map<string, Float32Array>();

/**
 * inv_freq[i] for i < rd/2 by the f32 rule every implementation follows (lib/model/rope.ts),
 * padded to the params table. Cached per (rd, theta); a Float32Array, which packs with one
 * copy (params.ts).
 */
export function ropeFrequencies(rotDim: number, theta: number): Float32Array {
  const key = `${rotDim}:${theta}`;
  let t = ropeTables.get(key);
  if (!t) {
    t = new Float32Array(ROPE_MAX_PAIRS);
    ropeInvFreq(rotDim, theta).forEach((f, i) => (t![i] = f));
    ropeTables.set(key, t);
  }
  return t;
}

export interface RopeArgs {
  rows: number;
  /** Position of row 0. */
  pos0: number;
  headDim: number;
  /** rd = head_dim * partial_rotary_factor (even). */
  rotDim: number;
  theta: number;
  /** q [nb][qHeads][hd] and k [nb][kHeads][hd], rotated in place. */
  q: RowsRef;
  qHeads: number;
  k: RowsRef;
  kHeads: number;
}

function checkRope(what: string, a: { rows: number; pos0: number; headDim: number; rotDim: number }): void {
  if (!Number.isInteger(a.rotDim) || a.rotDim < 2 || a.rotDim % 2 !== 0 || a.rotDim > a.headDim || a.rotDim / 2 > ROPE_MAX_PAIRS)
    throw new Error(`${what}: rotary dim ${a.rotDim} must be even, in 2..min(head_dim ${a.headDim}, ${2 * ROPE_MAX_PAIRS})`);
  if (a.pos0 < 0 || a.pos0 + a.rows > 2 ** 24) throw new RangeError(`${what}: positions ${a.pos0}..${a.pos0 + a.rows - 1} outside 0..2^24`);
}

/** NeoX rotate-half RoPE on the first rd dims of every q and k head, in place. */
export function encodeRope(ctx: EncodeContext, a: RopeArgs): void {
  checkRows(a.rows, "rope");
  checkRope("rope", a);
  const f = ropeFrequencies(a.rotDim, a.theta);
  const total = a.rows * (a.qHeads + a.kHeads) * (a.rotDim / 2);
  const tg = 256;
  dispatch(
    ctx,
    "rope_neox_f32",
    Params.Rope,
    {
      rows: a.rows,
      q_heads: a.qHeads,
      k_heads: a.kHeads,
      head_dim: a.headDim,
      rot_dim: a.rotDim,
      pos0: a.pos0,
      q_stride: a.q.stride,
      k_stride: a.k.stride,
      inv_freq: f,
    },
    [at(a.q), at(a.k)],
    Math.ceil(total / tg),
    tg,
  );
}

// ---- caches --------------------------------------------------------------------------

/**
 * A per-position cache of `heads` vectors of `dim` values (attention K or V, or the QSA
 * index keys with heads = 1). q8: int8 codes [capacity][heads][dim] at `data` and f32
 * scales [capacity][heads] at `scales`; f32: values [capacity][heads][dim] at `data`.
 */
export interface KvCacheRef {
  readonly kind: "q8" | "f32";
  readonly heads: number;
  readonly dim: number;
  readonly capacity: number;
  readonly data: Binding;
  readonly scales: Binding | null;
}

/** Bytes of a cache's data and scales regions (scales 0 for f32). */
export function kvCacheBytes(kind: "q8" | "f32", heads: number, dim: number, capacity: number): { data: number; scales: number } {
  const n = capacity * heads * dim;
  return kind === "q8" ? { data: n, scales: capacity * heads * 4 } : { data: n * 4, scales: 0 };
}

const offsetOf = (b: Binding) => ("offset" in b ? b.offset : 0);
const bufferOf = (b: Binding): Buffer => ("buffer" in b ? b.buffer : b);

/** A cache in new buffers (the data region and, for q8, the scales), zero-filled; "device" storage only kernels may touch. */
export function allocateKvCache(
  device: Device,
  kind: "q8" | "f32",
  heads: number,
  dim: number,
  capacity: number,
  storage: Storage = "shared",
): KvCacheRef {
  const bytes = kvCacheBytes(kind, heads, dim, capacity);
  return {
    kind,
    heads,
    dim,
    capacity,
    data: device.buffer(bytes.data, storage),
    scales: kind === "q8" ? device.buffer(bytes.scales, storage) : null,
  };
}

function checkCache(c: KvCacheRef, what: string): void {
  if (c.dim > SEQ_MAX_HEAD_DIM || c.dim % 4 !== 0) throw new Error(`${what}: vector dim ${c.dim} must be a multiple of 4 up to ${SEQ_MAX_HEAD_DIM}`);
  if (offsetOf(c.data) % 16 !== 0) throw new Error(`${what}: cache data offset ${offsetOf(c.data)} is not a multiple of 16`);
  if (c.kind === "q8" && !c.scales) throw new Error(`${what}: a q8 cache needs its scales`);
  const need = kvCacheBytes(c.kind, c.heads, c.dim, c.capacity);
  if (offsetOf(c.data) + need.data > bufferOf(c.data).length) throw new Error(`${what}: cache data region exceeds its buffer`);
  if (c.scales && offsetOf(c.scales) + need.scales > bufferOf(c.scales).length) throw new Error(`${what}: cache scales region exceeds its buffer`);
}

export interface KvAppendArgs {
  rows: number;
  pos0: number;
  /** Input rows [nb][heads * dim]. */
  x: RowsRef;
  cache: KvCacheRef;
}

/** Writes rows' vectors at positions pos0.. of the cache (q8: quantized per vector). */
export function encodeKvAppend(ctx: EncodeContext, a: KvAppendArgs): void {
  checkRows(a.rows, "kv append");
  const c = a.cache;
  checkCache(c, "kv append");
  if (a.pos0 < 0 || a.pos0 + a.rows > c.capacity)
    throw new RangeError(`kv append: positions ${a.pos0}..${a.pos0 + a.rows - 1} exceed the cache capacity ${c.capacity}`);
  const values = { rows: a.rows, heads: c.heads, dim: c.dim, pos0: a.pos0, x_stride: a.x.stride };
  if (c.kind === "q8") {
    const nsg = 4;
    dispatch(ctx, "kv_append_q8", Params.KvAppend, values, [at(a.x), c.data, c.scales!], Math.ceil((a.rows * c.heads) / nsg), SIMD_WIDTH * nsg);
  } else {
    const tg = 256;
    dispatch(ctx, "kv_append_f32", Params.KvAppend, values, [at(a.x), c.data], Math.ceil((a.rows * c.heads * c.dim) / tg), tg);
  }
}

// ---- norms + RoPE + K/V appends in one dispatch ----------------------------------------------

/** Simdgroups (vectors) per threadgroup of attn_prep (PREP_SG in kernels/rope.metal). */
const PREP_SG = 4;

export interface AttnPrepArgs {
  rows: number;
  /** Position of row 0. */
  pos0: number;
  /** rd = head_dim * partial_rotary_factor (even). */
  rotDim: number;
  theta: number;
  eps: number;
  /** Norm weights scale by (1 + w) (default) or w. */
  centred?: boolean;
  /** q [nb][H][hd] and k [nb][Hkv][hd]: normed per head and rotated in place. */
  q: RowsRef;
  qHeads: number;
  k: RowsRef;
  /** v [nb][Hkv][hd], appended as is. */
  v: RowsRef;
  qNorm: TensorRef;
  kNorm: TensorRef;
  /** The K and V caches (same kind, heads Hkv, dim hd). */
  kCache: KvCacheRef;
  vCache: KvCacheRef;
  /** QSA's index key of each row (attnPrepTakesIk): normed in place by `norm` and appended to `cache`, not rotated. */
  ik?: AttnPrepIk;
}

export interface AttnPrepIk {
  /** [nb][di] raw index keys (normed in place). */
  x: RowsRef;
  norm: TensorRef;
  /** The index-key cache (heads 1, dim di, the K cache's kind). */
  cache: KvCacheRef;
}

/** Whether encodeAttnPrep takes these caches (else: the norm, RoPE and append kernels one by one). */
export const attnPrepFits = (k: KvCacheRef, v: KvCacheRef) => k.kind === v.kind && k.heads === v.heads && k.dim === v.dim;

/** Whether attn_prep can also norm and append QSA's index key into `ik` (one head of at most SEQ_MAX_HEAD_DIM values, the K cache's kind). */
export const attnPrepTakesIk = (k: KvCacheRef, ik: KvCacheRef) => ik.kind === k.kind && ik.heads === 1 && ik.dim <= SEQ_MAX_HEAD_DIM;

/**
 * Per row: q and k per-head RMSNorm, RoPE on both (in place), K and V appended at pos0..:
 * one dispatch with the same bits as encodeRmsNorm x2 + encodeRope + encodeKvAppend x2.
 */
export function encodeAttnPrep(ctx: EncodeContext, a: AttnPrepArgs): void {
  checkRows(a.rows, "attn prep");
  const { kCache: kc, vCache: vc } = a;
  if (!attnPrepFits(kc, vc)) throw new Error("attn prep: K and V caches differ in kind or shape");
  checkCache(kc, "attn prep K");
  checkCache(vc, "attn prep V");
  const hd = kc.dim;
  checkVector(a.qNorm, hd, "attn prep q norm");
  checkVector(a.kNorm, hd, "attn prep k norm");
  checkRope("attn prep", { rows: a.rows, pos0: a.pos0, headDim: hd, rotDim: a.rotDim });
  if (a.pos0 + a.rows > kc.capacity)
    throw new RangeError(`attn prep: positions ${a.pos0}..${a.pos0 + a.rows - 1} exceed the cache capacity ${kc.capacity}`);
  const ik = a.ik;
  if (ik) {
    if (!attnPrepTakesIk(kc, ik.cache)) throw new Error(`attn prep: the index-key cache (${ik.cache.kind}, ${ik.cache.heads} heads of ${ik.cache.dim}) needs the K cache's kind, one head and at most ${SEQ_MAX_HEAD_DIM} values`);
    checkCache(ik.cache, "attn prep ik");
    checkVector(ik.norm, ik.cache.dim, "attn prep ik norm");
    if (a.pos0 + a.rows > ik.cache.capacity)
      throw new RangeError(`attn prep: positions ${a.pos0}..${a.pos0 + a.rows - 1} exceed the index-key cache capacity ${ik.cache.capacity}`);
  }
  const vectors = a.rows * (a.qHeads + 2 * kc.heads + (ik ? 1 : 0));
  dispatch(
    ctx,
    kc.kind === "q8" ? "attn_prep_q8" : "attn_prep_f32",
    Params.AttnPrep,
    {
      rows: a.rows,
      q_heads: a.qHeads,
      kv_heads: kc.heads,
      head_dim: hd,
      rot_dim: a.rotDim,
      pos0: a.pos0,
      centred: a.centred === false ? 0 : 1,
      eps: a.eps,
      q_stride: a.q.stride,
      k_stride: a.k.stride,
      v_stride: a.v.stride,
      ik_stride: ik ? ik.x.stride : 0,
      ik_dim: ik ? ik.cache.dim : 0,
      inv_freq: ropeFrequencies(a.rotDim, a.theta),
    },
    [
      at(a.q), at(a.k), at(a.v), bind(a.qNorm.buffer, a.qNorm.offset), bind(a.kNorm.buffer, a.kNorm.offset), kc.data, kc.scales ?? kc.data, vc.data, vc.scales ?? vc.data,
      // Without an index key its bindings repeat q's (never read).
      ...(ik ? [at(ik.x), bind(ik.norm.buffer, ik.norm.offset), ik.cache.data, ik.cache.scales ?? ik.cache.data] : [at(a.q), at(a.q), at(a.q), at(a.q)]),
    ],
    Math.ceil(vectors / PREP_SG),
    SIMD_WIDTH * PREP_SG,
  );
}

// ---- QSA -----------------------------------------------------------------------------

/** Bytes of the score scratch for nb rows starting at pos0 (one row per batch row). */
export const qsaScoreBytes = (rows: number, pos0: number) => rows * (pos0 + rows) * 4;

export interface QsaArgs {
  rows: number;
  pos0: number;
  topk: number;
  /** iq [nb][Hi * di] and iw [nb][Hi] (f32 projections). */
  iq: RowsRef;
  iw: RowsRef;
  heads: number;
  /** The index-key cache (heads 1, dim di), already holding positions up to pos0 + nb - 1. */
  ik: KvCacheRef;
  /** Score scratch [nb][>= pos0 + nb] floats (qsaScoreBytes). */
  scores: RowsRef;
  /** Selected positions [nb][topk] (i32, ascending) and their count per row [nb]. */
  selected: Binding;
  counts: Binding;
}

/**
 * qsa_scores_*: simdgroups per threadgroup, a block of 32 positions of one row each, the heads
 * split between the simdgroups (QSA_SCORE_SIMDGROUPS in kernels/qsa.metal: the same number).
 */
const QSA_SCORE_SIMDGROUPS = 8;
/**
 * qsa_topk_f32's threads per row: one per position (rounded up to 32), but at least one per
 * histogram bin (256, the bin scan's) and at most a threadgroup's 1024.
 */
const QSA_TOPK_MIN_THREADS = 256;
const QSA_TOPK_MAX_THREADS = 1024;

/** QSA index scores, then the top-k positions of every row (two dispatches). */
export function encodeQsa(ctx: EncodeContext, a: QsaArgs): void {
  checkRows(a.rows, "qsa");
  const ik = a.ik;
  checkCache(ik, "qsa");
  if (ik.heads !== 1) throw new Error(`qsa: the index-key cache has ${ik.heads} heads, expected 1`);
  if (!Number.isInteger(a.topk) || a.topk < 1) throw new Error(`qsa: topk ${a.topk} must be a positive integer`);
  const longest = a.pos0 + a.rows;
  if (longest > ik.capacity) throw new RangeError(`qsa: positions up to ${longest - 1} exceed the cache capacity ${ik.capacity}`);
  if (a.scores.stride < longest * 4) throw new Error(`qsa: score rows of ${a.scores.stride} bytes cannot hold ${longest} positions`);
  if (longest > a.topk) {
    dispatch(
      ctx,
      ik.kind === "q8" ? "qsa_scores_q8" : "qsa_scores_f32",
      Params.QsaScores,
      {
        rows: a.rows,
        heads: a.heads,
        head_dim: ik.dim,
        pos0: a.pos0,
        topk: a.topk,
        norm: Math.sqrt(ik.dim),
        iq_stride: a.iq.stride,
        iw_stride: a.iw.stride,
        score_stride: a.scores.stride,
      },
      [at(a.iq), at(a.iw), ik.data, ik.scales ?? ik.data, at(a.scores)],
      [Math.ceil(longest / SIMD_WIDTH), a.rows],
      [SIMD_WIDTH * QSA_SCORE_SIMDGROUPS, 1],
    );
  }
  const tg = threadsWithin(ctx.device.pipeline("qsa_topk_f32"), Math.min(QSA_TOPK_MAX_THREADS, Math.max(QSA_TOPK_MIN_THREADS, Math.ceil(longest / SIMD_WIDTH) * SIMD_WIDTH)));
  if (tg < QSA_TOPK_MIN_THREADS) throw new Error(`qsa_topk_f32: the pipeline allows ${tg} threads per threadgroup, fewer than its ${QSA_TOPK_MIN_THREADS} histogram bins`);
  dispatch(
    ctx,
    "qsa_topk_f32",
    Params.QsaTopk,
    { rows: a.rows, topk: a.topk, pos0: a.pos0, score_stride: a.scores.stride },
    [at(a.scores), a.selected, a.counts],
    a.rows,
    tg,
  );
}

// ---- attention -----------------------------------------------------------------------

/** Query heads per threadgroup of attn_rows (one simdgroup each; kernels/attention.metal). */
const ATTN_SIMDGROUPS = 4;
/**
 * Positions per split when one row reads a long cache (decode). A simdgroup walks its split 32
 * positions at a time, serially: on the H200 one split of 256 took most of a 177 us call at
 * context ~270 (two splits, 64 simdgroups on 132 SMs). 64 gives 4x the simdgroups, each a
 * quarter of the walk, for one more small attn_combine_f32 input per 64 positions.
 * CHERENKOV_ATTN_DECODE_SPLIT=N (tuning, read once at startup) sets it.
 */
export const ATTN_DECODE_SPLIT =
  envCount("CHERENKOV_ATTN_DECODE_SPLIT", "a multiple of 32 (a simdgroup walks 32 positions at a time)", (n) => n >= 32 && n % 32 === 0) ?? 64;

/**
 * Batches of up to this many rows split their reads as a decode row does (a verify batch of
 * 1 + 3 drafts, the MTP head's catch-up rows): unsplit, each row's simdgroup walked the whole
 * cache serially, on the H200 24 us for the tiny model's catch-up against 12 + 2 for one row.
 * Larger batches (prompt chunks) have rows enough to fill the GPU.
 */
export const ATTN_SPLIT_ROWS = 4;

export interface AttentionArgs {
  rows: number;
  pos0: number;
  heads: number;
  /** q [nb][H * hd] (after norm and RoPE). */
  q: RowsRef;
  /** The K and V caches (same kind, heads Hkv, dim hd), holding positions up to pos0 + nb - 1. */
  k: KvCacheRef;
  v: KvCacheRef;
  /** QSA selection (from encodeQsa): row t reads list[t][0 .. counts[t]), every position 0 .. pos0 + t when that is at most topk. Absent: causal. */
  selection?: { list: Binding; counts: Binding; topk: number };
  /** Output o [nb][H * hd]. */
  o: RowsRef;
  /** Positions per split (default: ATTN_DECODE_SPLIT up to ATTN_SPLIT_ROWS rows, else no split). */
  splitLen?: number;
  /** Scratch for the splits' partials (attentionPartialBytes), needed when there is more than one split. */
  partials?: Binding;
  /** The output gate [nb][H * hd]: o = attention * sigmoid(gate), bit for bit ew_sigmoid_mul_f32's. */
  gate?: RowsRef;
  /** Forces attn_tiles (true; an error where it cannot serve the call) or attn_rows (false), for benches; default: usesAttnTiles at attnTilesMinRows. */
  tiles?: boolean;
}

/**
 * Rows from which a chunk's causal attention (every position read, one split) takes attn_tiles, the tiled
 * kernel on the matrix units, on a GPU: a placeholder until spec/bench/kernels.ts times both on
 * the H200 ("attention (prefill)"). Above 1 + MAX_SNAP, so a speculative verify batch runs the
 * decode step's attn_rows (accepting drafts cannot change a greedy token). The CPU backend
 * keeps attn_rows at every row count (its tile products are fiber-switching emulation, as
 * lib/gpu/gemm.ts gemmMinRows says); CHERENKOV_ATTN_TILES_MIN_ROWS overrides both (tests send
 * small prompts through the tiles with it).
 */
export const ATTN_TILES_MIN_ROWS = 64;
/**
 * attn_tiles' limits (kernels/attention.metal): head_dim a multiple of 16 up to 128, or up to 256
 * with a q8 cache (attn_tiles_wide_q8: two simdgroups per 16 pairs, each on half the dims;
 * an f32 cache's K/V tiles would not fit 32 KiB); (row, head) pairs per threadgroup.
 */
export const ATTN_TILES = { maxHeadDim: 128, maxWideHeadDim: 256, pairs: 64, widePairs: 32, simdgroups: 4 } as const;

/** The attn_tiles row threshold in force on `backend` (CHERENKOV_ATTN_TILES_MIN_ROWS, else ATTN_TILES_MIN_ROWS; never on the CPU). */
export function attnTilesMinRows(backend: string): number {
  return tiledMinRows("CHERENKOV_ATTN_TILES_MIN_ROWS", backend, ATTN_TILES_MIN_ROWS);
}

/**
 * Whether an attention call takes attn_tiles at a threshold of `minRows`: causal rows that read
 * every position, one split, head_dim a multiple of 16 up to ATTN_TILES' limit, q rows 16-byte
 * aligned. A QSA list reads every position when no row has more than
 * topk (qsa_topk_f32 then lists 0 .. pos0 + t: a 2,048-token prompt at the 30b shape's topk
 * 2048), and attn_tiles ignores it; a list that selects stays with attn_rows.
 */
export function usesAttnTiles(
  a: Pick<AttentionArgs, "rows" | "pos0" | "selection" | "q"> & { kind: "q8" | "f32"; headDim: number; splits: number },
  minRows: number,
): boolean {
  return (
    a.rows >= minRows &&
    (!a.selection || a.pos0 + a.rows <= a.selection.topk) &&
    a.splits === 1 &&
    a.headDim % 16 === 0 &&
    a.headDim <= (a.kind === "q8" ? ATTN_TILES.maxWideHeadDim : ATTN_TILES.maxHeadDim) &&
    a.q.offset % 16 === 0 &&
    a.q.stride % 16 === 0
  );
}

/**
 * Lengths past which a decode row's or a verify batch's attention call dispatches other
 * kernels (its command buffer gets another structure, hence another CUDA graph): read past
 * ATTN_DECODE_SPLIT positions, it is split and combined (attn_combine_f32); past a QSA
 * topk, it scores and selects (qsa_scores_*). Engine.warmSteps primes each step past each.
 */
export function attentionBreakpoints(qsaTopk: number | null): number[] {
  return qsaTopk === null ? [ATTN_DECODE_SPLIT] : [ATTN_DECODE_SPLIT, qsaTopk];
}

type SplitInputs = Pick<AttentionArgs, "rows" | "pos0" | "selection" | "splitLen">;

/** The split length and count an attention call uses (from the longest row's read). */
export function attentionSplits(a: SplitInputs): { splitLen: number; splits: number } {
  const longest = a.selection ? Math.min(a.selection.topk, a.pos0 + a.rows) : a.pos0 + a.rows;
  const splitLen = a.splitLen ?? (a.rows <= ATTN_SPLIT_ROWS ? ATTN_DECODE_SPLIT : longest);
  if (!Number.isInteger(splitLen) || splitLen < 1) throw new Error(`attention: split length ${splitLen} must be a positive integer`);
  return { splitLen, splits: Math.ceil(longest / splitLen) };
}

/** Bytes of the partials scratch for a split attention call. */
export const attentionPartialBytes = (rows: number, heads: number, headDim: number, splits: number) => rows * heads * splits * (headDim + 2) * 4;

/** softmax(q k^T / sqrt(hd)) v per row and head over the cache (GQA: head h reads kv head h Hkv / H). */
export function encodeAttention(ctx: EncodeContext, a: AttentionArgs): void {
  checkRows(a.rows, "attention");
  const { k, v } = a;
  checkCache(k, "attention K");
  checkCache(v, "attention V");
  if (k.kind !== v.kind || k.heads !== v.heads || k.dim !== v.dim) throw new Error("attention: K and V caches differ in kind or shape");
  const hd = k.dim;
  const Hkv = k.heads;
  // The kernel's lanes own four consecutive dims of V (kernels/attention.metal).
  if (hd % 4 !== 0 || hd > 256) throw new Error(`attention: head_dim ${hd} must be a multiple of 4 and at most 256`);
  if (a.heads % Hkv !== 0) throw new Error(`attention: ${a.heads} heads not a multiple of ${Hkv} kv heads`);
  if (a.pos0 + a.rows > k.capacity) throw new RangeError(`attention: positions up to ${a.pos0 + a.rows - 1} exceed the cache capacity ${k.capacity}`);
  const { splitLen, splits } = attentionSplits(a);
  if (splits > 1) {
    const need = attentionPartialBytes(a.rows, a.heads, hd, splits);
    if (!a.partials || offsetOf(a.partials) + need > bufferOf(a.partials).length)
      throw new Error(`attention: ${splits} splits need a partials scratch of ${need} bytes (attentionPartialBytes)`);
  }
  const sel = a.selection;
  const gateBinding = a.gate ? at(a.gate) : at(a.o);
  const common = {
    rows: a.rows,
    heads: a.heads,
    kv_heads: Hkv,
    head_dim: hd,
    pos0: a.pos0,
    scale: 1 / Math.sqrt(hd),
    q_stride: a.q.stride,
    o_stride: a.o.stride,
    gate_stride: a.gate?.stride ?? 0,
    gated: a.gate ? 1 : 0,
  };
  const tiles = usesAttnTiles({ ...a, kind: k.kind, headDim: hd, splits }, a.tiles === undefined ? attnTilesMinRows(ctx.device.backend) : 1);
  if (a.tiles === true && !tiles)
    throw new Error(`attention: attn_tiles cannot serve this call (a QSA list that selects, ${splits} splits, head_dim ${hd}, or q rows not 16-byte aligned)`);
  if (tiles && a.tiles !== false) {
    const wide = hd > ATTN_TILES.maxHeadDim;
    dispatch(
      ctx,
      wide ? "attn_tiles_wide_q8" : k.kind === "q8" ? "attn_tiles_q8" : "attn_tiles_f32",
      Params.Attention,
      { ...common, use_list: 0, list_stride: 0, split_len: splitLen, splits: 1 },
      [at(a.q), k.data, k.scales ?? k.data, v.data, v.scales ?? v.data, at(a.o), gateBinding],
      [Hkv, Math.ceil((a.rows * (a.heads / Hkv)) / (wide ? ATTN_TILES.widePairs : ATTN_TILES.pairs))],
      [SIMD_WIDTH * ATTN_TILES.simdgroups, 1],
    );
    return;
  }
  const nsg = Math.min(ATTN_SIMDGROUPS, a.heads);
  dispatch(
    ctx,
    k.kind === "q8" ? "attn_rows_q8" : "attn_rows_f32",
    Params.Attention,
    { ...common, use_list: sel ? 1 : 0, list_stride: sel ? sel.topk : 0, split_len: splitLen, splits },
    [
      at(a.q),
      k.data,
      k.scales ?? k.data,
      v.data,
      v.scales ?? v.data,
      sel ? sel.list : k.data,
      sel ? sel.counts : k.data,
      at(a.o),
      a.partials ?? at(a.o),
      gateBinding,
    ],
    [Math.ceil(a.heads / nsg), a.rows, splits],
    [SIMD_WIDTH * nsg, 1, 1],
  );
  if (splits > 1) {
    const total = a.rows * a.heads * hd;
    const tg = 256;
    dispatch(
      ctx,
      "attn_combine_f32",
      Params.AttentionCombine,
      { rows: a.rows, heads: a.heads, head_dim: hd, splits, o_stride: a.o.stride, gate_stride: a.gate?.stride ?? 0, gated: a.gate ? 1 : 0 },
      [a.partials!, at(a.o), a.gate ? at(a.gate) : at(a.o)],
      Math.ceil(total / tg),
      tg,
    );
  }
}
