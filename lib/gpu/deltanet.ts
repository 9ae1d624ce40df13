// DeltaNet mixer dispatch (docs/model.md, Mixer A): the causal conv + SiLU over the qkv
// channels with its window, and the gated delta rule recurrence with its state S, both
// over the nb rows of a step, each able to store its state after every row into snapshot
// planes (lib/gpu/snapshots.ts) for a verify batch's rollback. The projections before and
// the output projection after are the dense kernels'. encodeDeltaNetBlock runs conv,
// recurrence and gated RMSNorm as the three kernels, or as two fused dispatches for batches up
// to CHERENKOV_DELTANET_FUSE_ROWS rows (off by default: DELTANET_FUSE_MAX_ROWS says why); in the
// three-kernel form, CHERENKOV_DELTANET_NORM_FUSED=1 runs a decode row's or verify batch's
// recurrence and gated RMSNorm as one dispatch (encodeDeltaNetNormed).
import type { Binding, Buffer } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { SIMD_WIDTH, threadsWithin } from "./limits.ts";
import { Params } from "./params.ts";
import { CONV_MAX_SPAN, SEQ_MAX_HEAD_DIM } from "./params-sequence.ts";
import { checkRows, checkVector } from "./projections.ts";
import { encodeRmsNormGated } from "./norms.ts";
import { encodeRestore, snapshotArgs, type SnapshotPlanes, type SnapshotRequest } from "./snapshots.ts";

const at = (r: RowsRef): Binding => bind(r.buffer, r.offset);

export interface ConvSiluArgs {
  rows: number;
  /** Channels C (2 Hk dk + Hv dv for DeltaNet). */
  channels: number;
  /** Input rows [nb][C]. */
  x: RowsRef;
  /** Weights [C, K], f32. */
  weight: TensorRef;
  /** Live window [K-1][C], oldest first; updated. */
  state: Binding;
  /** Output rows [nb][C]: SiLU(conv). */
  y: RowsRef;
  /** Store the window after each of the first rows. */
  snapshots?: SnapshotRequest;
}

/** [C, K] of conv weights for `channels` channels, checked. */
function checkConv(weight: TensorRef, channels: number, what: string): [number, number] {
  const [C, K] = weight.shape;
  if (weight.shape.length !== 2 || C !== channels)
    throw new Error(`${what}: weight shape [${weight.shape.join(", ")}], expected [${channels}, K]`);
  checkVector(weight, C * K!, what);
  if (K! < 1 || K! - 1 > CONV_MAX_SPAN) throw new Error(`${what}: kernel size ${K} outside 1..${CONV_MAX_SPAN + 1}`);
  return [C, K!];
}

/** Rows a conv_silu_rows_f32 thread walks: max(CONV_BLOCK_ROWS, K - 1) (kernels/conv.metal). */
const CONV_BLOCK_ROWS = 16;

/** Causal depthwise conv + SiLU over nb rows, one thread per channel and block of rows. */
export function encodeConvSilu(ctx: EncodeContext, a: ConvSiluArgs): void {
  checkRows(a.rows, "conv");
  const [C, K] = checkConv(a.weight, a.channels, "conv");
  const snap = snapshotArgs(a.snapshots, (K! - 1) * C, a.rows, a.state, "conv");
  const tg = 256;
  dispatch(
    ctx,
    "conv_silu_rows_f32",
    Params.Conv,
    {
      rows: a.rows,
      channels: C,
      taps: K!,
      snap_rows: snap.snapRows,
      x_stride: a.x.stride,
      y_stride: a.y.stride,
      plane_stride: snap.planeStride,
    },
    [at(a.x), bind(a.weight.buffer, a.weight.offset), a.state, at(a.y), snap.binding],
    [Math.ceil(C / tg), Math.ceil(a.rows / Math.max(CONV_BLOCK_ROWS, K! - 1))],
    tg,
  );
}

export interface DeltaNetShape {
  keyHeads: number;
  keyDim: number;
  valueHeads: number;
  valueDim: number;
}

export interface DeltaNetArgs extends DeltaNetShape {
  rows: number;
  /** Conv output rows [nb][q Hk*dk | k Hk*dk | v Hv*dv] (not yet L2-normalised). */
  qkv: RowsRef;
  /** Raw beta logits b [nb][Hv] and decay inputs a [nb][Hv]. */
  b: RowsRef;
  a: RowsRef;
  /** A_log and dt_bias [Hv], f32. */
  aLog: TensorRef;
  dtBias: TensorRef;
  /** Live state S [Hv][dk][dv]; updated. */
  state: Binding;
  /** Output o [nb][Hv*dv] (before the gated RMSNorm). */
  o: RowsRef;
  /** Store S after each of the first rows. */
  snapshots?: SnapshotRequest;
  /** Work region of the chunked form (deltanetChunkBytes); without it the row scan runs. */
  work?: WorkRegion;
  /** Forces the chunked form (true; an error where it cannot serve the call) or the row scan (false); default: deltanetTakesChunked. */
  chunked?: boolean;
  /** State columns per simdgroup of the chunked form's scan (benches); default DELTANET_CHUNK_COLS. */
  chunkColumns?: 2 | 4;
}

/** A region of a buffer (bytes from offset). */
export interface WorkRegion {
  buffer: Buffer;
  offset: number;
  bytes: number;
}

/** Floats of the recurrent state S of one DeltaNet layer. */
export const deltanetStateFloats = (s: DeltaNetShape) => s.valueHeads * s.keyDim * s.valueDim;

/**
 * The GPU keeps S as [Hv][dv][dk] (kernels/deltanet.metal: a lane's rows of one column are
 * contiguous), the transpose of each head of the reference's [Hv][dk][dv]. These convert a
 * host copy between the two (tests, tools); the engine itself never needs to.
 */
export function deltanetStateToGpu(S: Float32Array, s: DeltaNetShape): Float32Array {
  return transposeHeads(S, s.valueHeads, s.keyDim, s.valueDim);
}
export function deltanetStateFromGpu(S: Float32Array, s: DeltaNetShape): Float32Array {
  return transposeHeads(S, s.valueHeads, s.valueDim, s.keyDim);
}

/** Each of `heads` [rows][cols] blocks of `x` transposed to [cols][rows]. */
function transposeHeads(x: Float32Array, heads: number, rows: number, cols: number): Float32Array {
  const out = new Float32Array(heads * rows * cols);
  for (let h = 0; h < heads; h++) {
    const base = h * rows * cols;
    for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) out[base + c * rows + r] = x[base + r * cols + c]!;
  }
  return out;
}

/** Simdgroups (state columns) per threadgroup of deltanet_rows_f32 (its thread bound, 128, in kernels/deltanet.metal). */
const DELTANET_SIMDGROUPS = 4;

function checkDeltaNet(a: DeltaNetShape & { rows: number; aLog: TensorRef; dtBias: TensorRef }): void {
  checkRows(a.rows, "deltanet");
  const { keyHeads: Hk, keyDim: dk, valueHeads: Hv } = a;
  if (Hv % Hk !== 0) throw new Error(`deltanet: value heads ${Hv} not a multiple of key heads ${Hk}`);
  if (dk > SEQ_MAX_HEAD_DIM) throw new Error(`deltanet: key dim ${dk} exceeds ${SEQ_MAX_HEAD_DIM}`);
  checkVector(a.aLog, Hv, "deltanet A_log");
  checkVector(a.dtBias, Hv, "deltanet dt_bias");
}

// ---- The chunked form ------------------------------------------------------------------
// A prompt chunk's rows in blocks of DELTANET_CHUNK (kernels/deltanet.metal "The chunked form":
// deltanet_chunk_prep_f32 for every block at once, then deltanet_chunk_scan_f32 over the blocks
// in order) instead of the row scan's one row after another. Same recurrence, f32, other
// rounding (spec/kernels/deltanet-chunk.test.ts bounds it); no snapshot planes, so batches with
// snapshot rows (verify batches) keep the row scan.

/** Rows of a block of the chunked form (DN_CHUNK in kernels/deltanet.metal). */
export const DELTANET_CHUNK = 32;
/** Floats of the work region per (value head, block) (DN_CHUNK_FLOATS): two C x C matrices and four row vectors. */
const DELTANET_CHUNK_FLOATS = 2 * DELTANET_CHUNK * DELTANET_CHUNK + 4 * DELTANET_CHUNK;
/**
 * State columns per simdgroup of the chunked form's scan: 2 (deltanet_chunk_scan_f32, 96
 * registers a thread on sm_90) or 4 (deltanet_chunk_scan_c4_f32, 168: each k and q row loaded
 * serves four columns, half the warps). Both run the 30b shape's grid in one wave on the H200,
 * where four measured faster (spec/bench/kernels.ts "deltanet chunk", 30b shape: 216 / 789 us
 * at 256 / 1,024 rows against 278 / 847 for two; the row scan 580 / 2,219).
 */
export const DELTANET_CHUNK_COLS: 2 | 4 = 4;
const SCAN_KERNEL = { 2: "deltanet_chunk_scan_f32", 4: "deltanet_chunk_scan_c4_f32" } as const;
/** Largest key dim of the chunked form (DN_CHUNK_PER * 32). */
export const DELTANET_CHUNK_MAX_KEY_DIM = 128;
/**
 * Rows from which a batch without snapshot rows takes the chunked form on a GPU backend (never
 * on the CPU backend, whose results then stay the row scan's). The H200 measurement of
 * spec/bench/kernels.ts's "deltanet chunk" cases decides it.
 */
export const DELTANET_CHUNKED_MIN_ROWS = 64;

/** Bytes of the chunked form's work region for `rows` rows of `valueHeads` heads. */
export const deltanetChunkBytes = (rows: number, valueHeads: number): number =>
  Math.ceil(rows / DELTANET_CHUNK) * valueHeads * DELTANET_CHUNK_FLOATS * 4;

/**
 * The row threshold of the chunked form on `backend`: CHERENKOV_DELTANET_CHUNKED=1 forces it on
 * (every batch without snapshot rows, 1 row included), =0 off; unset, DELTANET_CHUNKED_MIN_ROWS
 * on a GPU and never (Infinity) on the CPU backend.
 */
export function deltanetChunkedMinRows(backend: string): number {
  const value = process.env.CHERENKOV_DELTANET_CHUNKED;
  if (value === undefined || value === "") return backend === "cpu" ? Infinity : DELTANET_CHUNKED_MIN_ROWS;
  if (value === "1") return 1;
  if (value === "0") return Infinity;
  throw new RangeError(`CHERENKOV_DELTANET_CHUNKED=${value}: expected 0 (row scan) or 1 (chunked form)`);
}

/** Why the chunked form cannot serve this call, or null when it can. */
function chunkedRefusal(a: DeltaNetArgs): string | null {
  if (a.snapshots && a.snapshots.rows > 0) return "it writes no snapshot planes";
  if (a.keyDim > DELTANET_CHUNK_MAX_KEY_DIM) return `key dim ${a.keyDim} exceeds ${DELTANET_CHUNK_MAX_KEY_DIM}`;
  if (!a.work) return "no work region";
  const need = deltanetChunkBytes(a.rows, a.valueHeads);
  if (a.work.bytes < need) return `work region of ${a.work.bytes} bytes, ${need} needed`;
  return null;
}

/** Whether encodeDeltaNet takes the chunked form for this call at the row threshold `minRows`. */
export const deltanetTakesChunked = (a: DeltaNetArgs, minRows: number): boolean => a.rows >= minRows && chunkedRefusal(a) === null;

/**
 * The gated delta rule over nb rows: q, k L2-normalised per key head (q scaled by
 * dk^-0.5), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), then per row and
 * value head S = e^g S; delta = beta (v - S^T k); S += k delta^T; o = S^T q. By the row scan,
 * or by the chunked form (see above) from deltanetChunkedMinRows rows.
 */
export function encodeDeltaNet(ctx: EncodeContext, a: DeltaNetArgs): void {
  checkDeltaNet(a);
  const { keyHeads: Hk, keyDim: dk, valueHeads: Hv, valueDim: dv } = a;
  const snap = snapshotArgs(a.snapshots, deltanetStateFloats(a), a.rows, a.state, "deltanet");
  const chunked = a.chunked ?? deltanetTakesChunked(a, deltanetChunkedMinRows(ctx.device.backend));
  if (a.chunked) {
    const why = chunkedRefusal(a);
    if (why) throw new Error(`deltanet: the chunked form cannot serve this call: ${why}`);
  }
  const params = {
    rows: a.rows,
    key_heads: Hk,
    key_dim: dk,
    value_heads: Hv,
    value_dim: dv,
    snap_rows: chunked ? 0 : snap.snapRows,
    q_scale: 1 / Math.sqrt(dk),
    l2_eps: 1e-6,
    qkv_stride: a.qkv.stride,
    b_stride: a.b.stride,
    a_stride: a.a.stride,
    o_stride: a.o.stride,
    plane_stride: snap.planeStride,
  };
  const weights = [bind(a.aLog.buffer, a.aLog.offset), bind(a.dtBias.buffer, a.dtBias.offset)];
  if (chunked) {
    const work = bind(a.work!.buffer, a.work!.offset);
    // Both kernels take any number of simdgroups up to 4 (Metal may allow fewer threads to a
    // register-heavy pipeline: threadsWithin).
    const prepThreads = threadsWithin(ctx.device.pipeline("deltanet_chunk_prep_f32"), SIMD_WIDTH * DELTANET_SIMDGROUPS);
    dispatch(ctx, "deltanet_chunk_prep_f32", Params.DeltaNet, params, [at(a.qkv), at(a.b), at(a.a), ...weights, work], [Math.ceil(a.rows / DELTANET_CHUNK), Hv], [prepThreads, 1]);
    const cols = a.chunkColumns ?? DELTANET_CHUNK_COLS;
    const nsg = threadsWithin(ctx.device.pipeline(SCAN_KERNEL[cols]), SIMD_WIDTH * Math.min(DELTANET_SIMDGROUPS, Math.ceil(dv / cols))) / SIMD_WIDTH;
    dispatch(ctx, SCAN_KERNEL[cols], Params.DeltaNet, params, [at(a.qkv), work, a.state, at(a.o)], [Math.ceil(dv / (nsg * cols)), Hv], [SIMD_WIDTH * nsg, 1]);
    return;
  }
  const nsg = Math.min(DELTANET_SIMDGROUPS, dv);
  dispatch(
    ctx,
    "deltanet_rows_f32",
    Params.DeltaNet,
    params,
    [at(a.qkv), at(a.b), at(a.a), ...weights, a.state, at(a.o), snap.binding],
    [Math.ceil(dv / nsg), Hv],
    [SIMD_WIDTH * nsg, 1],
  );
}

// ---- The recurrence and its gated RMSNorm in one dispatch -------------------------------
// deltanet_rows_norm_f32: one threadgroup per value head runs the row scan's columns
// (deltanet_column) with o staged in threadgroup memory, then rms_norm_gated_f32's norm of each
// row; y, S and the snapshot planes equal deltanet_rows_f32 + rms_norm_gated_f32 bit for bit
// (spec/kernels/deltanet-norm.test.ts). It saves the norm's dispatch (on the H200 ~6.9 us a
// DeltaNet layer of a decode token, pure latency) at the price of one threadgroup per head
// walking its dv columns in turn instead of dv / 4 threadgroups: on by default on the GPU backends.
// A simdgroup walks its columns COLS at a time (deltanet_rows_norm_c2_f32, _c4_f32: the row's
// shared loads and sums once for COLS columns, same bits): CHERENKOV_DELTANET_NORM_COLS.

/** Most rows deltanet_rows_norm_f32 takes (DN_NORM_MAX_ROWS): the decode row and the MTP verify batch. */
export const DELTANET_NORM_MAX_ROWS = 4;
/** Largest value dim (DN_NORM_MAX_DV: the threadgroup memory of the staged o) and key dim (32 DN_NORM_PER) of deltanet_rows_norm_f32. */
export const DELTANET_NORM_MAX_VALUE_DIM = 128;
export const DELTANET_NORM_MAX_KEY_DIM = 128;
/** Threads a threadgroup of deltanet_rows_norm_f32 asks (its bound in kernels/deltanet.metal): 16 simdgroups. */
const DELTANET_NORM_THREADS = 512;

/**
 * Whether the three-kernel form runs a batch of up to DELTANET_NORM_MAX_ROWS rows' recurrence
 * and gated norm as one dispatch: CHERENKOV_DELTANET_NORM_FUSED=1 on, =0 off; unset, on for the
 * GPU backends (on the H200 the 30b decode step went from 408 to 372 commands and 4.73 to 4.58
 * ms, docs/performance.md "twelfth run") and off on the CPU backend, whose threadgroups run in
 * turn, so a head's one threadgroup gains nothing from the norm's saved launch. Read at each
 * call, so tests can force both forms.
 */
export function deltanetNormFused(backend: string): boolean {
  const env = process.env.CHERENKOV_DELTANET_NORM_FUSED;
  if (env === "1") return true;
  if (env === "0") return false;
  if (env === undefined || env === "") return backend !== "cpu";
  throw new RangeError(`CHERENKOV_DELTANET_NORM_FUSED=${env}: expected 0 (two dispatches) or 1 (one)`);
}

/** Columns a simdgroup of deltanet_rows_norm_f32 takes at once, and the kernel of each (kernels/deltanet.metal). */
export type DeltaNetNormCols = 1 | 2 | 4;
export const DELTANET_NORM_KERNEL: Record<DeltaNetNormCols, string> = {
  1: "deltanet_rows_norm_f32",
  2: "deltanet_rows_norm_c2_f32",
  4: "deltanet_rows_norm_c4_f32",
};

/**
 * CHERENKOV_DELTANET_NORM_COLS: 1, 2 or 4 forces the columns a simdgroup of the fused kernel
 * walks at once; unset, undefined (deltanetNormColsFor chooses). Read at each call.
 */
export function deltanetNormCols(): DeltaNetNormCols | undefined {
  const env = process.env.CHERENKOV_DELTANET_NORM_COLS;
  if (env === undefined || env === "") return undefined;
  if (env === "1" || env === "2" || env === "4") return Number(env) as DeltaNetNormCols;
  throw new RangeError(`CHERENKOV_DELTANET_NORM_COLS=${env}: expected 1, 2 or 4 (state columns a simdgroup walks at once)`);
}

/**
 * The default columns at once: the largest of 4 and 2 that divides the columns each of
 * `simdgroups` simdgroups walks (dv / simdgroups, when whole), else 1; encodeDeltaNetNormed
 * asks with the simdgroups of its 512-thread bound (a lower pipeline limit, e.g. 256 threads,
 * only doubles each one's columns). Every COLS fits sm_90's 128 registers a thread at 512
 * threads without spills (111 at 4); at the 30b shape (dv 128, 16 simdgroups: 8 columns each)
 * that is 4, two passes over the rows instead of eight. On the H200: 4 beat 2 and 1 (docs/performance.md "twelfth run").
 */
export function deltanetNormColsFor(dv: number, simdgroups: number): DeltaNetNormCols {
  if (dv % simdgroups !== 0) return 1;
  const each = dv / simdgroups;
  return each % 4 === 0 ? 4 : each % 2 === 0 ? 2 : 1;
}

/** The gated RMSNorm that follows the recurrence: gate rows z [nb][Hv*dv], the plain weight [dv], eps. */
export interface DeltaNetNorm {
  z: RowsRef;
  weight: TensorRef;
  eps: number;
}

/**
 * encodeDeltaNet's row scan, then y = o * rsqrt(mean(o^2) + eps) * w * SiLU(z) per (row, value
 * head) written over a.o (encodeRmsNormGated in place), in one dispatch: Hv threadgroups.
 */
export function encodeDeltaNetNormed(ctx: EncodeContext, a: DeltaNetArgs, norm: DeltaNetNorm): void {
  checkDeltaNet(a);
  const { keyHeads: Hk, keyDim: dk, valueHeads: Hv, valueDim: dv } = a;
  const what = "deltanet (norm fused, deltanet_rows_norm_f32)";
  if (a.rows > DELTANET_NORM_MAX_ROWS) throw new Error(`${what}: ${a.rows} rows exceed ${DELTANET_NORM_MAX_ROWS}`);
  if (dv > DELTANET_NORM_MAX_VALUE_DIM) throw new Error(`${what}: value dim ${dv} exceeds ${DELTANET_NORM_MAX_VALUE_DIM} (its threadgroup memory holds ${DELTANET_NORM_MAX_ROWS} rows of at most ${DELTANET_NORM_MAX_VALUE_DIM})`);
  if (dk > DELTANET_NORM_MAX_KEY_DIM) throw new Error(`${what}: key dim ${dk} exceeds ${DELTANET_NORM_MAX_KEY_DIM}`);
  checkVector(norm.weight, dv, "deltanet norm");
  const snap = snapshotArgs(a.snapshots, deltanetStateFloats(a), a.rows, a.state, "deltanet");
  // Any number of simdgroups serves (each takes column groups sg, sg + simdgroups, ..): a
  // pipeline limit below 512 threads only lengthens their walk. No more simdgroups than groups.
  const cols = deltanetNormCols() ?? deltanetNormColsFor(dv, Math.min(DELTANET_NORM_THREADS / SIMD_WIDTH, dv));
  const kernel = DELTANET_NORM_KERNEL[cols];
  const threads = threadsWithin(ctx.device.pipeline(kernel), Math.min(DELTANET_NORM_THREADS, SIMD_WIDTH * Math.ceil(dv / cols)));
  dispatch(
    ctx,
    kernel,
    Params.DeltaNetNorm,
    {
      rows: a.rows,
      key_heads: Hk,
      key_dim: dk,
      value_heads: Hv,
      value_dim: dv,
      snap_rows: snap.snapRows,
      q_scale: 1 / Math.sqrt(dk),
      l2_eps: 1e-6,
      eps: norm.eps,
      qkv_stride: a.qkv.stride,
      b_stride: a.b.stride,
      a_stride: a.a.stride,
      o_stride: a.o.stride,
      z_stride: norm.z.stride,
      plane_stride: snap.planeStride,
    },
    [
      at(a.qkv),
      at(a.b),
      at(a.a),
      bind(a.aLog.buffer, a.aLog.offset),
      bind(a.dtBias.buffer, a.dtBias.offset),
      a.state,
      bind(norm.weight.buffer, norm.weight.offset),
      at(norm.z),
      at(a.o),
      snap.binding,
    ],
    Hv,
    threads,
  );
}

export interface DeltaNetBlockArgs extends DeltaNetShape {
  rows: number;
  /** Projection rows [nb][C] (q | k | v before the conv), C = 2 Hk dk + Hv dv. */
  x: RowsRef;
  /** Conv weights [C, K] and the live window [K-1][C]; the window is updated. */
  convWeight: TensorRef;
  convState: Binding;
  /** Conv output rows [nb][C]: written only by the three-kernel form. */
  convOut: RowsRef;
  b: RowsRef;
  a: RowsRef;
  aLog: TensorRef;
  dtBias: TensorRef;
  /** Live state S; updated. */
  state: Binding;
  /** Gate rows z [nb][Hv*dv], the norm weight [dv] (plain w) and its eps. */
  z: RowsRef;
  normWeight: TensorRef;
  eps: number;
  /** Output [nb][Hv*dv]: the recurrence's o, normalised and gated in place. */
  o: RowsRef;
  /** Verify batches: store S and the conv window after each of the first `rows` rows. */
  snapshots?: { S: SnapshotPlanes; conv: SnapshotPlanes; rows: number };
  /** The chunked form's work region (DeltaNetArgs.work). */
  work?: WorkRegion;
  /** Forces the recurrence's form (DeltaNetArgs.chunked). */
  chunked?: boolean;
  /**
   * The conv + SiLU was done by the qkv projection's epilogue (a decode row: convOut and the
   * window are in place, x unwritten); the three-kernel form then starts at the recurrence.
   */
  convDone?: boolean;
  /** Forces the recurrence and its gated norm into one dispatch or two (tests); default deltanetNormFused(backend). */
  normFused?: boolean;
}

/**
 * Rows up to which encodeDeltaNetBlock takes the two fused kernels; 0 by default: off. There
 * every simdgroup forms the conv of its key head's q and k again (Hv/Hk * dv times each channel
 * per row). On the H200 (30b shape, decode, pool 100%) that cost more than the dispatch it
 * saves: 137.2 tok/s fused at up to 16 rows against 155.9 with the three kernels (GPU 7.12 vs
 * 6.28 ms a token, docs/performance.md "sixth run"). CHERENKOV_DELTANET_FUSE_ROWS=N turns it
 * on up to N rows (where a dispatch costs more, e.g. to measure on Apple GPUs).
 */
export const DELTANET_FUSE_MAX_ROWS = parseFuseRows(process.env.CHERENKOV_DELTANET_FUSE_ROWS, 0);

/** The value of CHERENKOV_DELTANET_FUSE_ROWS, checked (`fallback` when unset). */
export function parseFuseRows(value: string | undefined, fallback: number): number {
  if (value === undefined || value === "") return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new Error(`CHERENKOV_DELTANET_FUSE_ROWS: "${value}" is not a row count (an integer >= 0)`);
  return n;
}

/** Largest key dim deltanet_conv_rows_f32 takes (DN_CONV_MAX_PER_LANE * 32 in kernels/deltanet.metal). */
export const DELTANET_CONV_MAX_KEY_DIM = 128;

/** Whether encodeDeltaNetBlock fuses a batch of `rows` rows with this key dim. */
export const deltanetFuses = (rows: number, keyDim: number, maxRows = DELTANET_FUSE_MAX_ROWS) =>
  rows <= maxRows && keyDim <= DELTANET_CONV_MAX_KEY_DIM;

/**
 * The DeltaNet mixer between its projections and its output projection: causal conv + SiLU,
 * the gated delta rule, gated RMSNorm. Fused (deltanetFuses): deltanet_conv_rows_f32 forms the
 * conv where the recurrence reads it, then rms_norm_gated_conv_window_f32 normalises o and
 * advances the window; both bit-identical to the three kernels. `fuse` forces a form (tests).
 */
export function encodeDeltaNetBlock(ctx: EncodeContext, a: DeltaNetBlockArgs, fuse = deltanetFuses(a.rows, a.keyDim)): void {
  const [C, K] = a.convWeight.shape;
  const convSnap = a.snapshots && K! > 1 ? { planes: a.snapshots.conv, rows: a.snapshots.rows } : undefined;
  const sSnap = a.snapshots ? { planes: a.snapshots.S, rows: a.snapshots.rows } : undefined;
  const shape = { keyHeads: a.keyHeads, keyDim: a.keyDim, valueHeads: a.valueHeads, valueDim: a.valueDim };
  if (a.convDone && (fuse || a.rows !== 1 || a.snapshots)) throw new Error("deltanet: a conv done in the projection is for a decode row of the three-kernel form");
  if (!fuse) {
    if (!a.convDone) encodeConvSilu(ctx, { rows: a.rows, channels: C!, x: a.x, weight: a.convWeight, state: a.convState, y: a.convOut, snapshots: convSnap });
    const dn: DeltaNetArgs = { ...shape, rows: a.rows, qkv: a.convOut, b: a.b, a: a.a, aLog: a.aLog, dtBias: a.dtBias, state: a.state, o: a.o, snapshots: sSnap, work: a.work, chunked: a.chunked };
    if (takesNormFused(ctx, a, dn)) {
      encodeDeltaNetNormed(ctx, dn, { z: a.z, weight: a.normWeight, eps: a.eps });
      return;
    }
    encodeDeltaNet(ctx, dn);
    encodeRmsNormGated(ctx, a.o, a.z, a.normWeight, a.o, a.rows, a.valueHeads, a.eps);
    return;
  }
  const { keyHeads: Hk, keyDim: dk, valueHeads: Hv, valueDim: dv } = a;
  checkConv(a.convWeight, 2 * Hk * dk + Hv * dv, "deltanet conv");
  checkDeltaNet(a);
  if (dk > DELTANET_CONV_MAX_KEY_DIM) throw new Error(`deltanet (fused): key dim ${dk} exceeds ${DELTANET_CONV_MAX_KEY_DIM}`);
  checkVector(a.normWeight, dv, "deltanet norm");
  const snapS = snapshotArgs(sSnap, deltanetStateFloats(a), a.rows, a.state, "deltanet");
  const snapConv = snapshotArgs(convSnap, (K! - 1) * C!, a.rows, a.convState, "conv");
  const nsg = Math.min(DELTANET_SIMDGROUPS, dv);
  dispatch(
    ctx,
    "deltanet_conv_rows_f32",
    Params.DeltaNetConv,
    {
      rows: a.rows,
      key_heads: Hk,
      key_dim: dk,
      value_heads: Hv,
      value_dim: dv,
      snap_rows: snapS.snapRows,
      q_scale: 1 / Math.sqrt(dk),
      l2_eps: 1e-6,
      taps: K!,
      qkv_stride: a.x.stride,
      b_stride: a.b.stride,
      a_stride: a.a.stride,
      o_stride: a.o.stride,
      plane_stride: snapS.planeStride,
    },
    [at(a.x), bind(a.convWeight.buffer, a.convWeight.offset), a.convState, at(a.b), at(a.a), bind(a.aLog.buffer, a.aLog.offset), bind(a.dtBias.buffer, a.dtBias.offset), a.state, at(a.o), snapS.binding],
    [Math.ceil(dv / nsg), Hv],
    [SIMD_WIDTH * nsg, 1],
  );
  const tg = SIMD_WIDTH * TAIL_SIMDGROUPS;
  dispatch(
    ctx,
    "rms_norm_gated_conv_window_f32",
    Params.DeltaNetTail,
    {
      rows: a.rows,
      heads: Hv,
      dim: dv,
      channels: C!,
      taps: K!,
      snap_rows: snapConv.snapRows,
      eps: a.eps,
      o_stride: a.o.stride,
      y_stride: a.o.stride,
      z_stride: a.z.stride,
      x_stride: a.x.stride,
      plane_stride: snapConv.planeStride,
    },
    [at(a.o), bind(a.normWeight.buffer, a.normWeight.offset), at(a.o), at(a.z), at(a.x), a.convState, snapConv.binding],
    Math.max(Math.ceil((a.rows * Hv) / TAIL_SIMDGROUPS), Math.ceil(C! / tg)),
    tg,
  );
}

/**
 * Whether the three-kernel form's recurrence and norm run as deltanet_rows_norm_f32: the option
 * on (a.normFused, else deltanetNormFused(backend)), up to DELTANET_NORM_MAX_ROWS rows, heads the
 * kernel holds (key and value dims up to DELTANET_NORM_MAX_KEY_DIM / _VALUE_DIM: wider ones keep
 * the two kernels, as the default must run every model), and the row scan chosen (prompt
 * chunks, and batches the chunked form takes, keep their kernels).
 */
function takesNormFused(ctx: EncodeContext, a: DeltaNetBlockArgs, dn: DeltaNetArgs): boolean {
  if (!(a.normFused ?? deltanetNormFused(ctx.device.backend)) || a.rows > DELTANET_NORM_MAX_ROWS) return false;
  if (a.keyDim > DELTANET_NORM_MAX_KEY_DIM || a.valueDim > DELTANET_NORM_MAX_VALUE_DIM) return false;
  return !(dn.chunked ?? deltanetTakesChunked(dn, deltanetChunkedMinRows(ctx.device.backend)));
}

/** Simdgroups per threadgroup of rms_norm_gated_conv_window_f32 (NORM_SG in kernels/norm.h). */
const TAIL_SIMDGROUPS = 4;

/** Rolls a DeltaNet layer (S and its conv window) back to the planes of row `plane`. */
export function encodeDeltaNetRestore(
  ctx: EncodeContext,
  plane: number,
  s: { planes: SnapshotPlanes; live: Binding },
  conv: { planes: SnapshotPlanes; live: Binding },
): void {
  encodeRestore(ctx, { planes: s.planes, plane, live: s.live }, { planes: conv.planes, plane, live: conv.live });
}
