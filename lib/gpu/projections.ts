// Dense projections y[r] = W x[r] over a row batch (kernels/matvec.metal) for every storage
// dtype, all reading plain input rows (q4 kernels form the per-32 group sums of x themselves).
// A threadgroup serves all the rows of its range with each weight it reads, so a step reads
// its weights once, not once per row.
import type { DType } from "../model/config.ts";
import type { Binding } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { HC_MAX_STREAMS, MAX_NB, SIMD_WIDTH } from "./limits.ts";
import { envCount, envOnOff } from "./env-switch.ts";
import { encodeGemm, gemmMinRows, usesGemm } from "./gemm.ts";
import { hcFoldBindings, hcFoldParams, type HcFold } from "./hc-fold.ts";
import { Params } from "./params.ts";

/** Output rows per simdgroup, batch rows per pass and simdgroups per threadgroup (kernels/matvec.h). */
export const MATVEC_TILE = { rows: 4, batchRows: 4, simdgroups: 4, splitSimdgroups: 8 } as const;

export interface MatvecOptions {
  /** y += W x instead of y = W x. */
  accumulate?: boolean;
  /** Batch rows per threadgroup (default: all of them, so each weight is read once per step). */
  rowsPerGroup?: number;
  /**
   * Kernel form: "rows" (matvec: each simdgroup its own MV_R output rows) or "split"
   * (matvec_split: a threadgroup's simdgroups share MV_R rows and split the input). Default:
   * split for narrow weights on a GPU (see `prefersSplit`), rows otherwise.
   */
  form?: "rows" | "split";
  /** false: the matvec whatever the row count (benches that measure it); default: usesGemm decides. */
  gemm?: boolean;
  /**
   * Write y into hyper-connection streams instead of storing it (the matvec_hc kernels): the
   * site's write X'_j = post_j y + sum_i comb[i][j] X_i fused into the epilogue. y is then
   * not written. Needs a matvec (not the GEMM: see projectionUsesGemm) and out a multiple of 4.
   */
  hc?: HcWriteTarget;
}

/** The streams a matvec_hc writes into: X [nb][n][d] and the site's coefficient rows (pre | post | comb). */
export interface HcWriteTarget {
  X: RowsRef;
  coeffs: RowsRef;
  streams: number;
  /** The next site's raw products the write also leaves (lib/gpu/hc-fold.ts). */
  fold?: HcFold;
}

/** Whether encodeMatvec with default options sends this projection to the tiled GEMM. */
export function projectionUsesGemm(ctx: EncodeContext, w: TensorRef, nb: number): boolean {
  return usesGemm(w.dtype, nb, gemmMinRows(ctx.device.backend));
}

/**
 * Whether a matvec with `out` output rows should take the split form: on a GPU, when the rows
 * form would start fewer than 64 threadgroups (out < 1024: the hyper-connection, router and
 * DeltaNet b/a projections). On the H200 those were latency-bound in the rows form (a [24, 8192]
 * f32 projection: 149 us rows, 29 us split) while [2048|4096, 2048|4096] q4 projections were no
 * faster split (82/68 us rows, 89/111 us split, in the engine), docs/cuda.md. The CPU backend
 * emulates threads as fibers, where more simdgroups only cost, so it keeps the rows form (its
 * tests run both forms explicitly).
 */
export function prefersSplit(backend: string, out: number, dtype?: string): boolean {
  if (backend === "cpu") return false;
  const groups = Math.ceil(out / (MATVEC_TILE.rows * MATVEC_TILE.simdgroups));
  return groups < SPLIT_BELOW_GROUPS || (dtype === "q4" && groups < Q4_SPLIT_BELOW_GROUPS);
}

/** The threshold above, in rows-form threadgroups; CHERENKOV_MATVEC_SPLIT_BELOW overrides it (measurements on a GPU). */
const SPLIT_BELOW_GROUPS = Number(process.env.CHERENKOV_MATVEC_SPLIT_BELOW ?? 64);

/**
 * A q4 projection whose rows form starts fewer threadgroups than this takes the split form (at
 * every row count the matvec serves, so a verify batch computes what a decode step does),
 * sized by `splitSimdgroups` so that a lane reads about one q4 group: the [2048, 4096] out projections got 128 threadgroups in the rows form,
 * one simdgroup per H200 scheduler (ncu: 11.4 us, 0.47 TB/s, most of it waiting on memory).
 * CHERENKOV_Q4_SPLIT_BELOW overrides it (0: never).
 */
const Q4_SPLIT_BELOW_GROUPS = Number(process.env.CHERENKOV_Q4_SPLIT_BELOW ?? 192);

/**
 * Simdgroups of a split-form threadgroup (at most MATVEC_TILE.splitSimdgroups): q4 lanes take
 * one 32-wide group at a time, so in / 1024 simdgroups give each lane about one (a [2048,
 * 4096] out projection: 4); dense lanes take a float4 at a time and keep all of them.
 */
export function splitSimdgroups(dtype: string, inDim: number): number {
  if (dtype !== "q4") return MATVEC_TILE.splitSimdgroups;
  return Math.min(MATVEC_TILE.splitSimdgroups, Math.max(1, Math.ceil(inDim / Q4_SPLIT_COLS)));
}

/** Input columns a q4 split-form simdgroup covers (32 lanes x one 32-wide group); CHERENKOV_Q4_SPLIT_COLS overrides it (tuning runs: 2048 gives each lane two groups and halves the threadgroup). */
const Q4_SPLIT_COLS = Number(process.env.CHERENKOV_Q4_SPLIT_COLS ?? 32 * SIMD_WIDTH);

/**
 * Batch rows per threadgroup when the caller does not choose. A matvec's threadgroups split the
 * output rows only, so a prompt chunk's rows were walked by as few threadgroups as a decode row
 * gets: on the H200 the router ([128, 2048] bf16, 32 threadgroups) took 183 us for 1,024 rows
 * and DeltaNet's b/a projections 166 us. Groups of MATVEC_GROUP_ROWS rows multiply the grid by
 * nb / 32 (each group re-reads the weights, from L2). Each row's sums are the same whatever
 * group serves it, so the results keep their bits. The CPU backend keeps one group (its
 * threadgroups are fibers, and more of them only cost).
 */
const MATVEC_GROUP_ROWS = 32;
/**
 * Batches of up to this many rows (a verify batch: the next token and up to 3 drafts) run one
 * row a threadgroup on a GPU: each row then takes a decode row's kernels (the staged and
 * fused one-row forms, a decode row's bits by construction) and its latency, the weights read
 * once a row (from L2 after the first). On the H200 a 2-draft cycle of the tiny model took
 * 1.34 ms of GPU against 1.51 (medians of 5; MTP 0.91x -> 1.01x plain), 3 drafts 1.57 against
 * 1.72, and the 30b shape's 2-draft cycle 9.34 against 9.88 (docs/performance.md, seventeenth run).
 */
const ONE_ROW_BATCH = 4;
/** The defaults above; CHERENKOV_MATVEC_GROUP_ROWS=N (tuning, read at each call) forces N on every backend. */
export function defaultRowsPerGroup(backend: string, nb: number): number {
  const forced = envCount("CHERENKOV_MATVEC_GROUP_ROWS", "a row count >= 1", (n) => n >= 1);
  if (forced !== undefined) return Math.min(nb, forced);
  if (backend === "cpu") return nb;
  return nb <= ONE_ROW_BATCH ? 1 : Math.min(nb, MATVEC_GROUP_ROWS);
}

/** Throws unless nb is a row count a step may have. */
export function checkRows(nb: number, what: string): void {
  if (!Number.isInteger(nb) || nb < 1 || nb > MAX_NB) throw new RangeError(`${what}: nb ${nb} must be an integer in 1..${MAX_NB}`);
}

/** [out, in] of a matrix weight, checked. */
export function matrixShape(w: TensorRef, what: string): [number, number] {
  if (w.shape.length !== 2) throw new Error(`${what}: weight has shape [${w.shape.join(", ")}], expected [out, in]`);
  return [w.shape[0]!, w.shape[1]!];
}

/** Throws unless an f32 vector weight (norm weights, biases) has `n` elements. */
export function checkVector(w: TensorRef, n: number, what: string): void {
  if (w.dtype !== "f32") throw new Error(`${what}: weight dtype ${w.dtype}, expected f32`);
  const len = w.shape.reduce((a, b) => a * b, 1);
  if (len !== n) throw new Error(`${what}: weight has ${len} values, expected ${n}`);
}

/** A matvec family's pipeline per weight dtype: `${family}_${dtype}_f32`. */
const byDType = (family: string): Record<DType, string> => ({
  f32: `${family}_f32_f32`,
  bf16: `${family}_bf16_f32`,
  f16: `${family}_f16_f32`,
  q4: `${family}_q4_f32`,
});

const MATVEC_KERNELS = byDType("matvec");
const MATVEC_SPLIT_KERNELS = byDType("matvec_split");
const MATVEC_HC_KERNELS = byDType("matvec_hc");
const MATVEC_SPLIT_HC_KERNELS = byDType("matvec_split_hc");

const oneRowNames = new Map<string, string>();

/**
 * The kernel of a q4 projection whose threadgroups serve one batch row each: the decode form
 * (one row per pass: a quarter of the registers, so more simdgroups per core hide memory
 * latency; kernels/matvec.metal). Other dtypes have the batch form only.
 */
export function oneRowForm(kernel: string, dtype: DType, rowsPerPass: number): string {
  if (dtype !== "q4" || rowsPerPass !== 1) return kernel;
  let r1 = oneRowNames.get(kernel);
  if (r1 === undefined) {
    r1 = kernel.replace(/_q4_f32$/, "_q4_r1_f32");
    oneRowNames.set(kernel, r1);
  }
  return r1;
}

/** Checks a projection's weight, input and row count; returns [out, in]. */
function checkProjection(w: TensorRef, x: RowsRef, nb: number, what: string): [number, number] {
  const [out, inDim] = matrixShape(w, what);
  checkRows(nb, what);
  if (w.dtype === "q4") {
    if (inDim % 32 !== 0) throw new Error(`${what}: a q4 weight [${out}, ${inDim}] needs an input width that is a multiple of 32`);
  } else if (inDim % 4 !== 0) {
    throw new Error(`${what}: input width ${inDim} must be a multiple of 4`);
  }
  // The kernels read x (and f32/f16/bf16 weights) four elements at a time: Metal wants
  // those vector loads aligned.
  if (x.offset % 16 !== 0 || x.stride % 16 !== 0)
    throw new Error(`${what}: input offset ${x.offset} and row stride ${x.stride} must be multiples of 16 bytes`);
  if (w.offset % 16 !== 0) throw new Error(`${what}: weight offset ${w.offset} must be a multiple of 16 bytes`);
  return [out, inDim];
}

/**
 * y[r] = W x[r] for r < nb. The input width must be a multiple of 4 (32 for q4). A q4 weight
 * over enough rows (usesGemm: prefill chunks) goes to the tiled GEMM instead (lib/gpu/gemm.ts),
 * unless the caller picked a matvec form or row split, or gemm: false. With `hc` the matvec
 * writes into the streams instead (never the GEMM).
 */
export function encodeMatvec(
  ctx: EncodeContext,
  w: TensorRef,
  x: RowsRef,
  y: RowsRef,
  nb: number,
  opts: MatvecOptions = {},
): void {
  if (!opts.hc && opts.gemm !== false && opts.form === undefined && opts.rowsPerGroup === undefined && projectionUsesGemm(ctx, w, nb)) {
    encodeGemm(ctx, w, x, y, nb, { accumulate: opts.accumulate });
    return;
  }
  const what = opts.hc ? "matvec_hc" : "matvec";
  const [out, inDim] = checkProjection(w, x, nb, what);
  const rowsPerGroup = Math.min(nb, opts.rowsPerGroup ?? defaultRowsPerGroup(ctx.device.backend, nb));
  if (!Number.isInteger(rowsPerGroup) || rowsPerGroup < 1) throw new Error(`${what}: rowsPerGroup ${rowsPerGroup} must be a positive integer`);
  const T = MATVEC_TILE;
  const split = opts.form === undefined ? prefersSplit(ctx.device.backend, out, w.dtype) : opts.form === "split";
  const grid: [number, number] = [Math.ceil(out / (split ? T.rows : T.rows * T.simdgroups)), Math.ceil(nb / rowsPerGroup)];
  const threads: [number, number] = [SIMD_WIDTH * (split ? splitSimdgroups(w.dtype, inDim) : T.simdgroups), 1];
  if (opts.hc) {
    const hc = checkHcTarget(opts.hc, out, opts);
    dispatch(
      ctx,
      oneRowForm(split ? MATVEC_SPLIT_HC_KERNELS[w.dtype] : MATVEC_HC_KERNELS[w.dtype], w.dtype, rowsPerGroup),
      Params.MatvecHc,
      {
        rows: nb,
        in_dim: inDim,
        out_dim: out,
        rows_per_group: rowsPerGroup,
        streams: hc.streams,
        x_stride: x.stride,
        hc_stride: hc.X.stride,
        c_stride: hc.coeffs.stride,
        ...hcFoldParams(hc.fold),
      },
      [bind(w.buffer, w.offset), bind(x.buffer, x.offset), bind(hc.X.buffer, hc.X.offset), bind(hc.coeffs.buffer, hc.coeffs.offset), ...hcFoldBindings(hc.fold, hc.X)],
      grid,
      threads,
    );
    return;
  }
  dispatch(
    ctx,
    split ? oneRowForm(MATVEC_SPLIT_KERNELS[w.dtype], w.dtype, rowsPerGroup) : rowsFormKernel(w.dtype, inDim, rowsPerGroup),
    Params.Matvec,
    {
      rows: nb,
      in_dim: inDim,
      out_dim: out,
      accumulate: opts.accumulate ? 1 : 0,
      rows_per_group: rowsPerGroup,
      x_stride: x.stride,
      y_stride: y.stride,
    },
    [bind(w.buffer, w.offset), bind(x.buffer, x.offset), bind(y.buffer, y.offset)],
    grid,
    threads,
  );
}

/**
 * The rows form's kernel: a one-row q4 dispatch whose input fits the staging (MV_STAGE_COLS)
 * takes matvec_q4_staged_r1, its input row read once per threadgroup into threadgroup memory
 * (the same bits as matvec_q4_r1; kernels/matvec.metal says why). CHERENKOV_Q4_STAGE_X=0 keeps
 * matvec_q4_r1 (measurements). Read at each call.
 */
export function rowsFormKernel(dtype: DType, inDim: number, rowsPerGroup: number): string {
  if (dtype === "q4" && rowsPerGroup === 1 && inDim <= MV_STAGE_COLS && envOnOff("CHERENKOV_Q4_STAGE_X", true)) return "matvec_q4_staged_r1_f32";
  return oneRowForm(MATVEC_KERNELS[dtype], dtype, rowsPerGroup);
}

/** A matvec_hc's target, checked against the projection's `out` rows (the hidden size d). */
function checkHcTarget(hc: HcWriteTarget, out: number, opts: MatvecOptions): HcWriteTarget {
  if (opts.accumulate) throw new Error("matvec_hc: accumulate does not apply (the output goes into the streams)");
  if (out % 4 !== 0) throw new Error(`matvec_hc: ${out} output rows; the streams are written in float4 columns (a multiple of 4)`);
  const n = hc.streams;
  if (!Number.isInteger(n) || n < 1 || n > HC_MAX_STREAMS) throw new Error(`matvec_hc: ${n} streams, expected 1..${HC_MAX_STREAMS}`);
  if (hc.X.offset % 16 !== 0 || hc.X.stride % 16 !== 0)
    throw new Error(`matvec_hc: streams rows at offset ${hc.X.offset}, stride ${hc.X.stride}: expected 16-byte aligned rows`);
  return hc;
}

/** Weights one matvec_multi dispatch serves (kernels/matvec.metal). */
export const MATVEC_MULTI = 4;

/** One projection of a shared input: y = W x. */
export interface Projection {
  w: TensorRef;
  y: RowsRef;
}

/**
 * A causal conv + SiLU over one projection's outputs (DeltaNet's qkv, kernels/conv.h), which a
 * decode row's q4 projections may do in their epilogue instead of storing them: its output and
 * window as conv_silu_rows_f32 leaves them for one row (the same bits). `of` is the projection.
 */
export interface ProjectionConv {
  of: Projection;
  weight: TensorRef;
  state: Binding;
  y: RowsRef;
}

/** The most taps the epilogue's conv takes (CONV_REG_TAPS in kernels/conv.h). */
const EPILOGUE_CONV_TAPS = 4;
/** The widest row the staged one-row q4 forms take (MV_STAGE_COLS in kernels/matvec.h): the conv epilogue and the fused site read run there. */
export const MV_STAGE_COLS = 2048;

/** The bindings of matvec_multi_q4_r1's conv epilogue (x repeated where there is none: every declared buffer is bound). */
export function convBindings(conv: ProjectionConv | undefined, x: RowsRef): Binding[] {
  if (!conv) return [bind(x.buffer, x.offset), bind(x.buffer, x.offset), bind(x.buffer, x.offset)];
  return [bind(conv.weight.buffer, conv.weight.offset), conv.state, bind(conv.y.buffer, conv.y.offset)];
}

/** Whether a decode row's staged q4 projection of width inDim can take `conv` in its epilogue. */
export function epilogueTakesConv(conv: ProjectionConv, inDim: number): boolean {
  const [C, K] = conv.weight.shape as [number, number];
  return conv.of.w.dtype === "q4" && conv.weight.dtype === "f32" && K <= EPILOGUE_CONV_TAPS && C === conv.of.w.shape[0] && inDim <= MV_STAGE_COLS;
}

/**
 * Several projections of one input: those of the same dtype and input width go in one
 * matvec_multi dispatch (up to MATVEC_MULTI each), the rest as single matvecs. The same
 * results as a matvec each in the same form: narrow groups (few rows together) take the split
 * form on a GPU, as a lone narrow projection does; `form` forces one. Rows enough for the
 * GEMM (usesGemm) send each q4 projection to it instead. A decode row's bf16 and q4 groups may
 * share one dispatch (mixedDecodeGroup); `mixed` forces (true) or forbids (false) it.
 */
export function encodeMatvecs(
  ctx: EncodeContext,
  items: readonly Projection[],
  x: RowsRef,
  nb: number,
  opts: { form?: "rows" | "split"; rowsPerGroup?: number; mixed?: boolean; conv?: ProjectionConv } = {},
): boolean {
  // Whether opts.conv was done by a projection's epilogue (else its outputs were stored).
  let convDone = false;
  const minRows = gemmMinRows(ctx.device.backend);
  const groups = new Map<string, Projection[]>();
  for (const it of items) {
    // Rows enough for the GEMM send a q4 projection there on its own, whatever its company
    // (DeltaNet's q4 qkv and z beside its bf16 b and a: the four in one matvec_multi took
    // 7.7 ms for a 1,024-row chunk on the H200).
    if (usesGemm(it.w.dtype, nb, minRows)) {
      encodeMatvec(ctx, it.w, x, it.y, nb);
      continue;
    }
    const [, inDim] = matrixShape(it.w, "matvecs");
    const key = `${it.w.dtype}/${inDim}`;
    const g = groups.get(key);
    if (g) g.push(it);
    else groups.set(key, [it]);
  }
  const mixed = mixedDecodeGroup(ctx, groups, nb, opts);
  if (mixed) {
    convDone = encodeMatvecMulti(ctx, [...mixed.dense, ...mixed.q4], x, nb, "rows", 1, mixed.dense.length, opts.conv);
    groups.delete(mixed.denseKey);
    groups.delete(mixed.q4Key);
  }
  for (const g of groups.values()) {
    for (let i = 0; i < g.length; i += MATVEC_MULTI) {
      const chunk = g.slice(i, i + MATVEC_MULTI);
      if (chunk.length === 1) encodeMatvec(ctx, chunk[0]!.w, x, chunk[0]!.y, nb, opts);
      // (encoded whatever convDone already is: `||=` would skip the dispatch)
      else if (encodeMatvecMulti(ctx, chunk, x, nb, opts.form, opts.rowsPerGroup, 0, opts.conv)) convDone = true;
    }
  }
  return convDone;
}

/**
 * bf16 and q4 projections of one input that a decode step (one row a threadgroup, the rows
 * form) sends through one matvec_multi_q4_r1 dispatch, the bf16 ones first (its
 * dense_count): DeltaNet's b and a beside its qkv and z, one dispatch a layer fewer. Only
 * where the bf16 ones take the split form (a GPU): the dispatch computes them in that form,
 * so a verify batch, which runs them as matvec_multi_split, gets the same bits and accepting
 * drafts cannot change a greedy token. Undefined when the step does not qualify.
 */
function mixedDecodeGroup(
  ctx: EncodeContext,
  groups: Map<string, Projection[]>,
  nb: number,
  opts: { form?: "rows" | "split"; rowsPerGroup?: number; mixed?: boolean },
): { dense: Projection[]; q4: Projection[]; denseKey: string; q4Key: string } | undefined {
  if (opts.mixed === false || (opts.mixed === undefined && opts.form !== undefined)) return undefined;
  if (Math.min(nb, opts.rowsPerGroup ?? defaultRowsPerGroup(ctx.device.backend, nb)) !== 1) return undefined;
  for (const [q4Key, q4] of groups) {
    if (!q4Key.startsWith("q4/")) continue;
    const denseKey = `bf16/${q4Key.slice(3)}`;
    const dense = groups.get(denseKey);
    if (!dense || dense.length + q4.length > MATVEC_MULTI) continue;
    const outs = (items: Projection[]) => items.reduce((n, it) => n + it.w.shape[0]!, 0);
    if (opts.mixed !== true && (prefersSplit(ctx.device.backend, outs(q4), "q4") || !prefersSplit(ctx.device.backend, outs(dense), "bf16"))) continue;
    return { dense, q4, denseKey, q4Key };
  }
  return undefined;
}

/** Returns whether `conv` (when its projection is among `items`) was done in the epilogue. */
function encodeMatvecMulti(
  ctx: EncodeContext,
  items: readonly Projection[],
  x: RowsRef,
  nb: number,
  form?: "rows" | "split",
  rowsPerGroup?: number,
  denseCount = 0,
  conv?: ProjectionConv,
): boolean {
  const w0 = items[denseCount]!.w;
  const inDim = checkProjection(w0, x, nb, "matvec_multi")[1];
  const outs = items.map((it) => checkProjection(it.w, x, nb, "matvec_multi")[0]);
  const pad = <T>(a: T[]): T[] => [...a, ...Array<T>(MATVEC_MULTI - a.length).fill(a[a.length - 1]!)];
  const T = MATVEC_TILE;
  const tiles = outs.reduce((n, o) => n + Math.ceil(o / T.rows), 0);
  // Narrow weights together (DeltaNet's b and a) take the split form, as a lone one would.
  const split = form === undefined ? prefersSplit(ctx.device.backend, outs.reduce((a, b) => a + b, 0), w0.dtype) : form === "split";
  const groupRows = Math.min(nb, rowsPerGroup ?? defaultRowsPerGroup(ctx.device.backend, nb));
  if (!Number.isInteger(groupRows) || groupRows < 1) throw new Error(`matvec_multi: rowsPerGroup ${rowsPerGroup} must be a positive integer`);
  // With bf16 weights first (denseCount), matvec_multi_q4_r1 gives each of their tiles a
  // threadgroup in matvec_multi_split's shape (MATVEC_TILE.splitSimdgroups simdgroups: its bits)
  // and its q4 tiles that many to a threadgroup.
  const denseTiles = outs.slice(0, denseCount).reduce((n, o) => n + Math.ceil(o / T.rows), 0);
  const simdgroups = denseCount > 0 ? T.splitSimdgroups : split ? splitSimdgroups(w0.dtype, inDim) : T.simdgroups;
  const rowTiles = denseCount > 0 ? denseTiles + Math.ceil((tiles - denseTiles) / simdgroups) : split ? tiles : Math.ceil(tiles / T.simdgroups);
  const grid: [number, number] = [rowTiles, Math.ceil(nb / groupRows)];
  const kernel = split ? `matvec_multi_split_${w0.dtype}_f32` : oneRowForm(`matvec_multi_${w0.dtype}_f32`, w0.dtype, groupRows);
  // The decode form (matvec_multi_q4_r1) may put a projection's outputs through the conv.
  const decode = kernel === "matvec_multi_q4_r1_f32";
  const convIndex = decode && conv && nb === 1 && epilogueTakesConv(conv, inDim) ? items.indexOf(conv.of) : -1;
  dispatch(
    ctx,
    kernel,
    Params.MatvecMulti,
    {
      rows: nb,
      in_dim: inDim,
      count: items.length,
      rows_per_group: groupRows,
      dense_count: denseCount,
      conv_index: convIndex,
      conv_taps: convIndex >= 0 ? conv!.weight.shape[1]! : 0,
      out_dim: pad(outs),
      x_stride: x.stride,
      y_stride: pad(items.map((it) => it.y.stride)),
    },
    [
      ...pad(items.map((it) => bind(it.w.buffer, it.w.offset))),
      bind(x.buffer, x.offset),
      ...pad(items.map((it) => bind(it.y.buffer, it.y.offset))),
      ...(decode ? convBindings(convIndex >= 0 ? conv : undefined, x) : []),
    ],
    grid,
    [SIMD_WIDTH * simdgroups, 1],
  );
  return convIndex >= 0;
}
