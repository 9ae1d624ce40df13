// Hyper-connections on the GPU (kernels/hc.metal; MODEL.md "Residual"): per site, the raw
// products fn . flat (a matvec over the n*d stream values of each row), then the
// coefficients (pre, post and the Sinkhorn comb), the gated read (fused with the site's
// RMSNorm) and the write that mixes the streams and injects the sub-layer output. With
// n = 1 a site is the plain pre-norm residual: the read is RMSNorm(X), the write X += y.
import type { Binding } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { encodeResidualAdd } from "./elementwise.ts";
import { HC_FOLD_DTYPES, hcFoldBindings, hcFoldCount, hcFoldParams, hcFolds, type HcFold } from "./hc-fold.ts";
import { HC_MAX_STREAMS, SIMD_WIDTH } from "./limits.ts";
import { encodeRmsNorm } from "./norms.ts";
import { Params } from "./params.ts";
import { checkRows, checkVector, encodeMatvec, matrixShape, projectionUsesGemm } from "./projections.ts";

/** Simdgroups of the threadgroup that reads one row (HC_TG_SG in kernels/hc.metal). */
const HC_TG_SG = 8;
/** Flat stream values per partial of the raw products, and simdgroups per hc_mix_partials threadgroup (HC_CHUNK, HC_MIX_SG). */
const HC_CHUNK = 256;
const HC_MIX_SG = 8;
/** The most chunks a row may have (n * d <= 16384 values: the rows the hc kernels are tested to). */
const HC_MAX_CHUNKS = 64;
export { HC_MAX_STREAMS };
const WRITE_THREADS = 64;
/** Simdgroups of an hc_write_fold threadgroup, each on one float4 column (HC_WRITE_FOLD_SG). */
const WRITE_FOLD_SG = 2;

export interface HcConfig {
  streams: number;
  eps: number;
  sinkhorn_iters: number;
}

/** The tensors of a site (`{site}.fn`, `.base`, `.scale`) or of the final read (`hc_head.*`). */
export interface HcSiteRefs {
  fn: TensorRef;
  base: TensorRef;
  scale: TensorRef;
}

/** Mixes per row: 2n + n*n for a site, n for the final read. */
export const hcMixCount = (n: number, head = false) => (head ? n : 2 * n + n * n);

/** Chunks of the n*d flat stream values the raw products are summed over (hc_mix_partials). */
export const hcChunks = (n: number, d: number) => Math.ceil((n * d) / HC_CHUNK);

/** Floats per mix of hc_mix_partials' rows: the chunks rounded up to 4 (the gather reads float4s; hc_chunk_stride). */
const hcChunkStride = (n: number, d: number) => Math.ceil(hcChunks(n, d) / 4) * 4;

/** Floats per row of a site's partials: [mixes + 1][chunk stride] (the last mix is the sum of squares). */
export const hcPartialCount = (n: number, d: number, head = false) => (hcMixCount(n, head) + 1) * hcChunkStride(n, d);

export { hcFoldCount, hcFolds, type HcFold };

/** The fold of `site` (or the final read's head) into `raw`: the next write leaves its partials there. */
export function hcFold(site: HcSiteRefs, raw: RowsRef, cfg: HcConfig, d: number, head = false): HcFold {
  const M = checkSite(site, cfg.streams, d, head);
  if (HC_FOLD_DTYPES[site.fn.dtype] === undefined) throw new Error(`hc fold: fn dtype ${site.fn.dtype} has no kernel (expected bf16, f16 or f32)`);
  if (d % 16 !== 0) throw new Error(`hc fold: hidden size ${d} is not a multiple of 16 (the folded partials are whole float4s a mix)`);
  if (raw.stride < hcFoldCount(cfg.streams, d, head) * 4 || raw.stride % 16 !== 0 || raw.offset % 16 !== 0)
    throw new Error(`hc fold: partials rows of stride ${raw.stride} at offset ${raw.offset}; expected 16-byte aligned rows of ${hcFoldCount(cfg.streams, d, head) * 4} bytes`);
  return { fn: site.fn, raw, mixes: M };
}

const HC_MIX_KERNELS: Record<string, string> = { f32: "hc_mix_partials_f32_f32", bf16: "hc_mix_partials_bf16_f32", f16: "hc_mix_partials_f16_f32" };

/** Scratch of one site's coefficients: raw partials (hcPartialCount floats a row) and coefficients (hcMixCount). */
export interface HcScratch {
  raw: RowsRef;
  coeffs: RowsRef;
}

/** The norm a site applies to its read: RMSNorm(x, w), zero-centred unless `centred` is false. */
export interface ReadNorm {
  w: TensorRef;
  eps: number;
  centred?: boolean;
}

function checkStreams(n: number, what: string): void {
  if (!Number.isInteger(n) || n < 1 || n > HC_MAX_STREAMS) throw new Error(`${what}: ${n} streams, expected 1..${HC_MAX_STREAMS}`);
}

/** The hc kernels move whole float4 columns of the streams (rows and streams 16-byte aligned). */
function checkFloat4Columns(d: number, what: string): void {
  if (d % 4 !== 0) throw new Error(`${what}: hidden size ${d} is not a multiple of 4 (the hc kernels read and write float4 columns)`);
}

/** Checks a site's (or the head's) tensors against n and d; returns the mix count. */
function checkSite(site: HcSiteRefs, n: number, d: number, head: boolean): number {
  const M = hcMixCount(n, head);
  const [out, inDim] = matrixShape(site.fn, "hc fn");
  if (out !== M || inDim !== n * d) throw new Error(`hc fn has shape [${out}, ${inDim}], expected [${M}, ${n * d}]`);
  if (site.fn.dtype === "q4") throw new Error("hc fn: q4 is not a storage dtype of hc tensors (expected bf16, f16 or f32)");
  checkVector(site.base, M, "hc base");
  checkVector(site.scale, head ? 1 : 3, "hc scale");
  return M;
}

/**
 * What both coefficient kernels start with: the checks, the raw products fn . flat (a matvec;
 * none when `folded` holds them, left by the write before: HcFold), then their common params
 * and bindings (X, raw, scale, base, coeffs).
 */
function encodeRawProducts(ctx: EncodeContext, what: string, X: RowsRef, site: HcSiteRefs, scratch: HcScratch, nb: number, cfg: HcConfig, d: number, head: boolean, folded?: RowsRef) {
  checkStreams(cfg.streams, what);
  checkRows(nb, what);
  const M = checkSite(site, cfg.streams, d, head);
  const n = cfg.streams;
  checkFloat4Columns(d, what);
  if (X.stride % 16 !== 0 || X.offset % 16 !== 0) throw new Error(`${what}: streams rows at offset ${X.offset}, stride ${X.stride}: expected 16-byte aligned rows`);
  const chunks = hcChunks(n, d);
  if (chunks > HC_MAX_CHUNKS) throw new Error(`${what}: ${n} streams of ${d} values: the hc kernels hold at most ${HC_MAX_CHUNKS * HC_CHUNK} per row`);
  const kernel = HC_MIX_KERNELS[site.fn.dtype];
  if (!kernel) throw new Error(`${what}: hc fn dtype ${site.fn.dtype} has no kernel (expected bf16, f16 or f32)`);
  let raw = scratch.raw;
  let perMix = hcChunkStride(n, d);
  if (raw.stride % 16 !== 0 || raw.offset % 16 !== 0 || (folded && (folded.stride % 16 !== 0 || folded.offset % 16 !== 0)))
    throw new Error(`${what}: partials rows must be 16-byte aligned (the gather reads float4s)`);
  if (folded) {
    if (d % 16 !== 0) throw new Error(`${what}: hidden size ${d} cannot have folded partials (a multiple of 16: whole float4s a mix)`);
    raw = folded;
    perMix = d / 4;
  } else {
    dispatch(
      ctx,
      kernel,
      Params.HcMix,
      { rows: nb, streams: n, cols: d, mixes: M, chunks, x_stride: X.stride, p_stride: raw.stride },
      [bind(X.buffer, X.offset), bind(site.fn.buffer, site.fn.offset), bind(raw.buffer, raw.offset)],
      [Math.ceil(((M + 1) * perMix) / HC_MIX_SG), nb],
      SIMD_WIDTH * HC_MIX_SG,
    );
  }
  return {
    values: {
      chunks: perMix,
      rows: nb,
      streams: cfg.streams,
      cols: d,
      head: head ? 1 : 0,
      iters: cfg.sinkhorn_iters,
      eps: cfg.eps,
      x_stride: X.stride,
      raw_stride: raw.stride,
      c_stride: scratch.coeffs.stride,
    },
    buffers: [
      bind(X.buffer, X.offset),
      bind(raw.buffer, raw.offset),
      bind(site.scale.buffer, site.scale.offset),
      bind(site.base.buffer, site.base.offset),
      bind(scratch.coeffs.buffer, scratch.coeffs.offset),
    ],
  };
}

/**
 * Coefficients of nb rows of X [nb][n][d]: raw = fn . flat, then per row
 * pre (and for a site post and comb) into scratch.coeffs.
 */
export function encodeHcCoefficients(
  ctx: EncodeContext,
  X: RowsRef,
  site: HcSiteRefs,
  scratch: HcScratch,
  nb: number,
  cfg: HcConfig,
  d: number,
  head = false,
  folded?: RowsRef,
): void {
  const a = encodeRawProducts(ctx, "hc_coeffs", X, site, scratch, nb, cfg, d, head, folded);
  dispatch(ctx, "hc_coeffs_f32", Params.HcCoeffs, a.values, a.buffers, nb, SIMD_WIDTH * HC_TG_SG);
}

/**
 * The coefficients of encodeHcCoefficients (left in scratch.coeffs for the site's write) and
 * the normalised read y = RMSNorm(sum_i pre_i X_i, norm) in one kernel after the fn matvec
 * (or, with `folded`, from the partials the last write left there).
 */
export function encodeHcCoefficientsRead(
  ctx: EncodeContext,
  X: RowsRef,
  site: HcSiteRefs,
  scratch: HcScratch,
  y: RowsRef,
  nb: number,
  cfg: HcConfig,
  d: number,
  norm: ReadNorm,
  head = false,
  folded?: RowsRef,
): void {
  checkVector(norm.w, d, "hc read norm");
  const a = encodeRawProducts(ctx, "hc_coeffs_read_norm", X, site, scratch, nb, cfg, d, head, folded);
  dispatch(
    ctx,
    "hc_coeffs_read_norm_f32",
    Params.HcCoeffsRead,
    { ...a.values, centred: (norm.centred ?? true) ? 1 : 0, norm_eps: norm.eps, y_stride: y.stride },
    [...a.buffers, bind(y.buffer, y.offset), bind(norm.w.buffer, norm.w.offset)],
    // Two threadgroups a row: the coefficients, and beside them the read (kernels/hc.metal).
    [2, nb],
    SIMD_WIDTH * HC_TG_SG,
  );
}

/** y[r] = sum_i pre_i X[r][i] (pre = the first n coefficients), then RMSNorm when `norm` is given. */
export function encodeHcRead(
  ctx: EncodeContext,
  X: RowsRef,
  coeffs: RowsRef,
  y: RowsRef,
  nb: number,
  n: number,
  d: number,
  norm?: ReadNorm,
): void {
  checkStreams(n, "hc_read");
  checkRows(nb, "hc_read");
  checkFloat4Columns(d, "hc_read");
  if (norm) checkVector(norm.w, d, "hc_read norm");
  const buffers: Binding[] = [bind(X.buffer, X.offset), bind(coeffs.buffer, coeffs.offset), bind(y.buffer, y.offset)];
  if (norm) buffers.push(bind(norm.w.buffer, norm.w.offset));
  dispatch(
    ctx,
    norm ? "hc_read_norm_f32" : "hc_read_f32",
    Params.HcRead,
    {
      rows: nb,
      streams: n,
      cols: d,
      centred: (norm?.centred ?? true) ? 1 : 0,
      eps: norm?.eps ?? 0,
      x_stride: X.stride,
      c_stride: coeffs.stride,
      y_stride: y.stride,
    },
    buffers,
    nb,
    SIMD_WIDTH * HC_TG_SG,
  );
}

/** X'[r][j] = post_j y[r] + sum_i comb[i][j] X[r][i], in place on X (with `fold`, also the next site's partials). */
export function encodeHcWrite(ctx: EncodeContext, X: RowsRef, coeffs: RowsRef, y: RowsRef, nb: number, n: number, d: number, fold?: HcFold): void {
  checkStreams(n, "hc_write");
  checkRows(nb, "hc_write");
  checkFloat4Columns(d, "hc_write");
  if (fold) {
    dispatch(
      ctx,
      "hc_write_fold_f32",
      Params.HcWriteFold,
      { rows: nb, streams: n, cols: d, x_stride: X.stride, c_stride: coeffs.stride, y_stride: y.stride, ...hcFoldParams(fold) },
      [bind(X.buffer, X.offset), bind(coeffs.buffer, coeffs.offset), bind(y.buffer, y.offset), ...hcFoldBindings(fold, X)],
      [Math.ceil(d / 4 / WRITE_FOLD_SG), nb],
      [SIMD_WIDTH * WRITE_FOLD_SG, 1],
    );
    return;
  }
  dispatch(
    ctx,
    "hc_write_f32",
    Params.HcWrite,
    { rows: nb, streams: n, cols: d, x_stride: X.stride, c_stride: coeffs.stride, y_stride: y.stride },
    [bind(X.buffer, X.offset), bind(coeffs.buffer, coeffs.offset), bind(y.buffer, y.offset)],
    [Math.ceil(d / 4 / WRITE_THREADS), nb],
    [WRITE_THREADS, 1],
  );
}

/**
 * A residual site's read: xn = RMSNorm(sum_i pre_i X_i, norm) with the site's coefficients
 * left in scratch for the write; with n = 1 (site null) xn = RMSNorm(X, norm).
 */
export function encodeSiteRead(
  ctx: EncodeContext,
  X: RowsRef,
  site: HcSiteRefs | null,
  scratch: HcScratch,
  xn: RowsRef,
  nb: number,
  cfg: HcConfig,
  d: number,
  norm: ReadNorm,
  folded?: RowsRef,
): void {
  if (!site) {
    if (cfg.streams !== 1) throw new Error(`hc site weights are required with ${cfg.streams} streams`);
    encodeRmsNorm(ctx, X, norm.w, xn, nb, norm.eps, { centred: norm.centred ?? true });
    return;
  }
  encodeHcCoefficientsRead(ctx, X, site, scratch, xn, nb, cfg, d, norm, false, folded);
}

/**
 * A site's write as a target for the kernel that produces the sub-layer output y: the streams
 * X and the read's coefficients (the hc write), or with coeffs null the plain residual X += y
 * (n = 1, no site). A producer given one does the write itself (fused into its epilogue where
 * a kernel form exists) and leaves y unwritten.
 */
export interface SiteWrite {
  X: RowsRef;
  coeffs: RowsRef | null;
  streams: number;
  d: number;
  /** The next site whose raw products the write leaves (HcFold); its read then passes `folded`. */
  fold?: HcFold;
}

/**
 * The write of a site (null: the plain residual, n = 1) whose read left its coefficients in
 * scratch; with `fold` it also leaves the next site's raw products (hcFold).
 */
export function siteWrite(X: RowsRef, site: HcSiteRefs | null, scratch: HcScratch, cfg: HcConfig, d: number, fold?: HcFold): SiteWrite {
  if (!site) {
    if (cfg.streams !== 1) throw new Error(`hc site weights are required with ${cfg.streams} streams`);
    if (fold) throw new Error("hc fold: a plain residual (n = 1) has no site to fold");
    return { X, coeffs: null, streams: 1, d };
  }
  return { X, coeffs: scratch.coeffs, streams: cfg.streams, d, fold };
}

/** The write of y into its target as a dispatch of its own: hc_write, or X += y. */
export function encodeWriteOf(ctx: EncodeContext, write: SiteWrite, y: RowsRef, nb: number): void {
  if (!write.coeffs) encodeResidualAdd(ctx, write.X, y, nb, write.d);
  else encodeHcWrite(ctx, write.X, write.coeffs, y, nb, write.streams, write.d, write.fold);
}

/**
 * The projection y = W x[r] and the site's write of y, fused where a kernel does both: the
 * matvec_hc forms (the hc write in the epilogue), or for n = 1 the matvec (or GEMM)
 * accumulating into X. Prefill-sized batches the GEMM takes (n > 1) go to y, then hc_write.
 * The same bits either way; y is scratch for the unfused path.
 */
export function encodeProjectionWrite(ctx: EncodeContext, w: TensorRef, x: RowsRef, y: RowsRef, nb: number, write: SiteWrite): void {
  const [out] = matrixShape(w, "projection into the streams");
  if (out !== write.d) throw new Error(`projection into the streams: the weight has ${out} output rows, the streams' hidden size is ${write.d}`);
  if (!write.coeffs) {
    encodeMatvec(ctx, w, x, write.X, nb, { accumulate: true });
  } else if (projectionUsesGemm(ctx, w, nb)) {
    encodeMatvec(ctx, w, x, y, nb);
    encodeWriteOf(ctx, write, y, nb);
  } else {
    checkStreams(write.streams, "matvec_hc");
    checkFloat4Columns(write.d, "matvec_hc");
    encodeMatvec(ctx, w, x, y, nb, { hc: { X: write.X, coeffs: write.coeffs, streams: write.streams, fold: write.fold } });
  }
}

/** A residual site's write of the sub-layer output y: hc_write with the read's coefficients, or X += y (n = 1). */
export function encodeSiteWrite(
  ctx: EncodeContext,
  X: RowsRef,
  site: HcSiteRefs | null,
  scratch: HcScratch,
  y: RowsRef,
  nb: number,
  cfg: HcConfig,
  d: number,
): void {
  encodeWriteOf(ctx, siteWrite(X, site, scratch, cfg, d), y, nb);
}
