// A residual site's read handed to the projections that consume it (issue 18, item 2: "read +
// norm fused into what feeds the next GEMV"). At decode the read is its own kernel
// (hc_coeffs_read_norm_f32: ~9 us on the H200, a chain of dependent steps on two threadgroups)
// that every projection after it waits for. matvec_multi_q4_r1_read_f32 instead has every
// threadgroup form the read itself from the streams and the partials the site's folded write
// left (the same code, so the same bits), one of them also the coefficients for the site's
// write: one dispatch and one wait a site fewer. The projections must all fit that one
// dispatch (bf16 ones first, then q4 ones, either part possibly empty; one decode row;
// d <= MV_STAGE_COLS); otherwise the read is encoded on its own first and the projections as
// before. A plain residual (n = 1: no site; the MTP head) has a read too, its RMSNorm
// (rms_norm_f32), which matvec_multi_q4_r1_norm_f32 forms the same way.
// A batch of up to 4 rows run one row a threadgroup (a GPU's verify batch: projections.ts
// defaultRowsPerGroup) takes the one-row kernels with a grid of one row of threadgroups a batch
// row: each row a decode row's read and projections, so a decode row's bits.
// CHERENKOV_HC_READ_FUSED_ROWS > 1 instead stages the batch's rows together in each threadgroup
// (matvec_multi_q4_read_f32 / _norm_f32, in the batch's projection forms; lost on the H200).
import { bind, dispatch, type EncodeContext, type RowsRef } from "./dispatch.ts";
import { encodeRmsNorm } from "./norms.ts";
import { encodeSiteRead, type HcConfig, type HcScratch, type HcSiteRefs, type ReadNorm } from "./hyperconnection.ts";
import { HC_MAX_STREAMS, HC_SMALL_STREAMS, SIMD_WIDTH } from "./limits.ts";
import { Params } from "./params.ts";
import {
  checkVector,
  convBindings,
  defaultRowsPerGroup,
  encodeMatvecs,
  epilogueTakesConv,
  MATVEC_MULTI,
  MATVEC_TILE,
  matrixShape,
  MV_STAGE_COLS,
  prefersSplit,
  projectionUsesGemm,
  splitSimdgroups,
  type Projection,
  type ProjectionConv,
} from "./projections.ts";

/** A residual's read into `xn`: a hyper-connection site's or the plain residual's. */
export type SiteRead = HcSiteRead | PlainRead;

/** A site's read y = RMSNorm(sum_i pre_i X_i) into `xn`, its partials folded into `folded` by the write before. */
export interface HcSiteRead {
  plain?: undefined;
  X: RowsRef;
  site: HcSiteRefs;
  scratch: HcScratch;
  xn: RowsRef;
  cfg: HcConfig;
  d: number;
  norm: ReadNorm;
  folded: RowsRef;
}

/**
 * The plain residual's read (n = 1, no site): y = RMSNorm(X) into `xn`, rms_norm_f32's
 * arithmetic. `anyForm`: its q4 projections may take the fused kernel's rows form where the
 * backend would split them (the MTP head: its rows only propose drafts, so no batch has to
 * repeat its bits; on the H200 the tiny model's attention q/gate/k/v, 640 rows, split).
 */
export interface PlainRead {
  plain: true;
  X: RowsRef;
  xn: RowsRef;
  d: number;
  norm: ReadNorm;
  anyForm: boolean;
}

export function plainRead(X: RowsRef, xn: RowsRef, d: number, norm: ReadNorm, anyForm = false): PlainRead {
  return { plain: true, X, xn, d, norm, anyForm };
}

/** Threads of the fused kernel's threadgroups: the read's HC_TG_SG simdgroups (kernels/hc.metal). */
const READ_SIMDGROUPS = 8;

/**
 * A site's read handed to the projections that take it (encodeSiteProjections), when the write
 * before left its partials (`folded`), or the plain residual's (n = 1: no site); otherwise (no
 * partials) the read is encoded here, now, and undefined comes back.
 */
export function deferSiteRead(
  ctx: EncodeContext,
  X: RowsRef,
  site: HcSiteRefs | null,
  scratch: HcScratch,
  xn: RowsRef,
  nb: number,
  cfg: HcConfig,
  d: number,
  norm: ReadNorm,
  folded: RowsRef | undefined,
): SiteRead | undefined {
  if (site && folded) return { X, site, scratch, xn, cfg, d, norm, folded };
  if (!site && cfg.streams === 1) return plainRead(X, xn, d, norm);
  encodeSiteRead(ctx, X, site, scratch, xn, nb, cfg, d, norm, folded);
  return undefined;
}

/**
 * Whether decode projections form their site's read themselves: on by default on the GPU
 * backends, where the read kernel's latency is what it costs; off on the CPU backend, whose
 * threadgroups run one after another and would each repeat the read. CHERENKOV_HC_READ_FUSED
 * = 1 or 0 forces it (tests on the CPU backend, measurements on a GPU).
 */
export function fusesSiteRead(backend: string): boolean {
  const env = process.env.CHERENKOV_HC_READ_FUSED;
  if (env === "1") return true;
  if (env === "0") return false;
  return backend !== "cpu";
}

/** The most rows the fused kernels' rows forms serve (their MV_NR rows a pass). */
export const MAX_FUSED_READ_ROWS = 4;

/**
 * The most rows whose projections form their read themselves (CHERENKOV_HC_READ_FUSED_ROWS,
 * 1..MAX_FUSED_READ_ROWS; default 1: decode rows only). More serves a speculative cycle's
 * verify batch (1 + k rows) with matvec_multi_q4_read_f32: untimed on a GPU, so off until it is.
 */
export function fusedReadRows(): number {
  const env = process.env.CHERENKOV_HC_READ_FUSED_ROWS;
  if (env === undefined || env === "") return 1;
  const rows = Number(env);
  if (!Number.isInteger(rows) || rows < 1 || rows > MAX_FUSED_READ_ROWS) {
    throw new Error(`CHERENKOV_HC_READ_FUSED_ROWS=${env}: expected an integer in 1..${MAX_FUSED_READ_ROWS}`);
  }
  return rows;
}

/** Whether nb > 1 rows each fold their read into their one-row kernel (a GPU's verify rows, one a threadgroup). */
const readsPerRow = (backend: string, nb: number) =>
  nb > 1 && nb <= MAX_FUSED_READ_ROWS && fusedReadRows() === 1 && defaultRowsPerGroup(backend, nb) === 1;

/**
 * Whether a site read of nb rows is formed by the projections that use it (where their shapes
 * fit the fused kernels): decode rows where reads are fused, up to fusedReadRows() rows staged
 * together, or a GPU's verify rows one a threadgroup.
 */
export function foldsSiteRead(backend: string, nb: number): boolean {
  return fusesSiteRead(backend) && (nb <= fusedReadRows() || readsPerRow(backend, nb));
}

/**
 * The projections `items` of the row a site reads (`read`; x = read.xn), one decode row: the
 * read and the projections in one dispatch when they fit it (and the backend fuses), else the
 * site's read then encodeMatvecs. With `conv` (one of `items`), returns whether the conv was
 * done in the projections' epilogue (else the caller runs it on the stored outputs).
 */
export function encodeSiteProjections(
  ctx: EncodeContext,
  items: readonly Projection[],
  read: SiteRead | undefined,
  x: RowsRef,
  nb: number,
  conv?: ProjectionConv,
): boolean {
  // The kernel takes the bf16 weights first (its dense_count), as matvec_multi_q4_r1 does.
  const ordered = [...items.filter((it) => it.w.dtype === "bf16"), ...items.filter((it) => it.w.dtype !== "bf16")];
  const perRow = readsPerRow(ctx.device.backend, nb);
  if (read && foldsSiteRead(ctx.device.backend, nb) && fits(ctx, ordered, read, nb, perRow)) {
    return encodeFused(ctx, ordered, read, nb, perRow, conv);
  }
  if (read) encodeReadApart(ctx, read, nb);
  return encodeMatvecs(ctx, items, x, nb, conv ? { conv } : {});
}

/** The read on its own: the site's read kernel, or the plain residual's rms_norm_f32. */
export function encodeReadApart(ctx: EncodeContext, read: SiteRead, nb: number): void {
  if (read.plain) encodeRmsNorm(ctx, read.X, read.norm.w, read.xn, nb, read.norm.eps, { centred: read.norm.centred ?? true });
  else encodeSiteRead(ctx, read.X, read.site, read.scratch, read.xn, nb, read.cfg, read.d, read.norm, read.folded);
}

/** How many of `items` (bf16 first: encodeSiteProjections orders them) are bf16. */
const denseCountOf = (items: readonly Projection[]) => items.filter((it) => it.w.dtype === "bf16").length;

/**
 * bf16 weights first, then q4 (either part may be empty: the MoE site's router and shared gate
 * are bf16 alone), all of input width d, at most MATVEC_MULTI; and the forms the fused kernel
 * computes are the ones encodeMatvecs would choose for a decode row here (the q4 ones in the
 * rows form, the bf16 ones in the split form), so that a verify batch, which runs those, keeps
 * a decode step's bits (a plain read with anyForm: any bf16 and q4, in those forms). A batch
 * of nb > 1 rows staged together (the rows forms; not perRow, where each threadgroup stages one
 * row as for a decode row) must be staged whole (nb * d <= MV_STAGE_COLS: not the 30b
 * shape's d = 2048) and computes its q4 tiles in the batch's rows form (matvec_multi_q4_f32),
 * whose bits the split form's also are where that has one simdgroup (d <= 1024); so does a
 * decode row's (the r1 kernel), so a GPU fuses the tiny model's sites too, whose q4 groups split.
 */
function fits(ctx: EncodeContext, items: readonly Projection[], read: SiteRead, nb: number, perRow: boolean): boolean {
  const backend = ctx.device.backend;
  const { d } = read;
  const staged = perRow ? 1 : nb; // rows a threadgroup stages
  if (staged * d > MV_STAGE_COLS || d % 16 !== 0 || (staged > 1 && d % 32 !== 0)) return false;
  if (items.some((it) => projectionUsesGemm(ctx, it.w, nb))) return false;
  if (!read.plain && (read.cfg.streams < 2 || read.cfg.streams > HC_MAX_STREAMS)) return false;
  if (items.length === 0 || items.length > MATVEC_MULTI) return false;
  const dense = denseCountOf(items);
  if (items.slice(dense).some((it) => it.w.dtype !== "q4")) return false;
  if (!items.every((it) => matrixShape(it.w, "site projections")[1] === d)) return false;
  if (read.plain && read.anyForm) return true;
  const outs = (its: readonly Projection[]) => its.reduce((n, it) => n + it.w.shape[0]!, 0);
  const q4Split = dense < items.length && prefersSplit(backend, outs(items.slice(dense)), "q4");
  // A split form of one simdgroup sums a row as the rows form does (spec/kernels/site-read-rows.test.ts).
  if (q4Split && splitSimdgroups("q4", d) !== 1) return false;
  return dense === 0 || prefersSplit(backend, outs(items.slice(0, dense)), "bf16") || process.env.CHERENKOV_HC_READ_FUSED === "1";
}

/**
 * q4 tiles a simdgroup of the fused kernel computes one after another (CHERENKOV_HC_READ_TILES,
 * default 2): each threadgroup forms the read once, so fewer of them, in one wave on the
 * H200 for the 30b shape's projections (3,072 and 2,304 tiles: 192 and 144 threadgroups).
 */
const tilesPerSimdgroup = () => Number(process.env.CHERENKOV_HC_READ_TILES ?? 2);

/**
 * The one-row fused read of an hc site of `streams` streams: up to HC_SMALL_STREAMS the form
 * without the coefficient code wider sites need (on sm_90 66 of the kernel's 178 KB), else the
 * general one.
 */
export function r1ReadKernel(streams: number): string {
  return streams <= HC_SMALL_STREAMS ? "matvec_multi_q4_r1_read_hc4_f32" : "matvec_multi_q4_r1_read_f32";
}

/** The fused kernel: the one-row (r1) form (a row a grid row when perRow), or for a batch staged together the rows form (matvec_multi_q4_read_f32). */
function fusedKernel(read: SiteRead, nb: number, perRow: boolean): string {
  if (nb === 1 || perRow) return read.plain ? "matvec_multi_q4_r1_norm_f32" : r1ReadKernel(read.cfg.streams);
  return read.plain ? "matvec_multi_q4_norm_f32" : "matvec_multi_q4_read_f32";
}

function encodeFused(ctx: EncodeContext, items: readonly Projection[], read: SiteRead, nb: number, perRow: boolean, conv?: ProjectionConv): boolean {
  const { d, norm } = read;
  const denseCount = denseCountOf(items);
  const outs = items.map((it) => matrixShape(it.w, "site projections")[0]);
  const pad = <T>(a: T[]): T[] => [...a, ...Array<T>(MATVEC_MULTI - a.length).fill(a[a.length - 1]!)];
  const R = MATVEC_TILE.rows;
  const denseTiles = outs.slice(0, denseCount).reduce((n, o) => n + Math.ceil(o / R), 0);
  const q4Tiles = outs.slice(denseCount).reduce((n, o) => n + Math.ceil(o / R), 0);
  // A threadgroup per bf16 tile (the split form's shape), READ_SIMDGROUPS q4 tiles a
  // threadgroup, then a site's coefficients' threadgroup (a plain read has none).
  const per = tilesPerSimdgroup();
  if (!Number.isInteger(per) || per < 1) throw new Error(`CHERENKOV_HC_READ_TILES=${per}: expected a positive integer`);
  const coeffTg = denseTiles + Math.ceil(q4Tiles / (READ_SIMDGROUPS * per));
  checkVector(norm.w, d, "site read norm");
  const aligned = (r: RowsRef) => r.offset % 16 === 0 && (nb === 1 || r.stride % 16 === 0);
  if ((!read.plain && !aligned(read.folded)) || !aligned(read.X) || !aligned(read.xn)) throw new Error("site read: streams, partials and read rows must be 16-byte aligned");
  // (a batch's conv runs after its projections: it needs the rows in order in one thread)
  const convIndex = nb === 1 && conv && epilogueTakesConv(conv, d) ? items.indexOf(conv.of) : -1;
  // A plain read has no site: its slots are bound to what the kernel reads or writes anyway
  // (X as the partials, the norm weights as scale and base, xn as the coefficients), untouched.
  const cfg = read.plain ? { streams: 1, sinkhorn_iters: 0, eps: 0 } : read.cfg;
  const siteBindings = read.plain
    ? [bind(read.X.buffer, read.X.offset), bind(norm.w.buffer, norm.w.offset), bind(norm.w.buffer, norm.w.offset), bind(read.xn.buffer, read.xn.offset)]
    : [
        bind(read.folded.buffer, read.folded.offset),
        bind(read.site.scale.buffer, read.site.scale.offset),
        bind(read.site.base.buffer, read.site.base.offset),
        bind(read.scratch.coeffs.buffer, read.scratch.coeffs.offset),
      ];
  dispatch(
    ctx,
    fusedKernel(read, nb, perRow),
    Params.MatvecMultiRead,
    {
      in_dim: d,
      count: items.length,
      dense_count: denseCount,
      coeff_tg: coeffTg,
      out_dim: pad(outs),
      y_stride: pad(items.map((it) => it.y.stride)),
      streams: cfg.streams,
      iters: cfg.sinkhorn_iters,
      eps: cfg.eps,
      centred: (norm.centred ?? true) ? 1 : 0,
      norm_eps: norm.eps,
      chunks: read.plain ? 0 : d / 4,
      tiles_per_sg: per,
      conv_index: convIndex,
      conv_taps: convIndex >= 0 ? conv!.weight.shape[1]! : 0,
      rows: nb,
      x_stride: read.X.stride,
      raw_stride: read.plain ? 0 : read.folded.stride,
      c_stride: read.plain ? 0 : read.scratch.coeffs.stride,
      xn_stride: read.xn.stride,
    },
    [
      ...pad(items.map((it) => bind(it.w.buffer, it.w.offset))),
      bind(read.X.buffer, read.X.offset),
      ...pad(items.map((it) => bind(it.y.buffer, it.y.offset))),
      ...siteBindings,
      bind(norm.w.buffer, norm.w.offset),
      bind(read.xn.buffer, read.xn.offset),
      // (the rows forms have no conv epilogue; the r1 form's, for a batch row a grid row, unused)
      ...(nb === 1 || perRow ? convBindings(convIndex >= 0 ? conv : undefined, read.xn) : []),
    ],
    // A site's coefficients: a threadgroup a row after the projections' (a plain read: none);
    // one row of threadgroups a batch row when perRow.
    perRow ? [read.plain ? coeffTg : coeffTg + 1, nb] : [read.plain ? coeffTg : coeffTg + nb, 1],
    [SIMD_WIDTH * READ_SIMDGROUPS, 1],
  );
  return convIndex >= 0;
}
