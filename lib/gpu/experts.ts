// The MoE sub-layer on the GPU (kernels/moe.metal; MODEL.md "MoE"): router logits and
// top-k, the grouping of the step's (row, k) pairs by expert, routed experts read from
// the expert pool through the layer's slot table, the shared expert with its sigmoid gate,
// and the weighted combine. Between the router and the routed experts the engine signals
// the host and waits for the slot table (DESIGN.md "One command buffer per step"); these
// functions only record the dispatches.
import type { DType } from "../model/config.ts";
import type { Binding, Buffer } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { Params, type ParamValues } from "./params.ts";
import { checkRows, defaultRowsPerGroup, encodeMatvec, MATVEC_TILE, matrixShape, oneRowForm } from "./projections.ts";
import { encodeGemmGateUp, GEMM_TILE, gemmMinRows, usesGemm } from "./gemm.ts";
import type { SiteWrite } from "./hyperconnection.ts";
import { hcFoldBindings, hcFoldParams } from "./hc-fold.ts";
import { envOnOff } from "./env-switch.ts";
import { HC_MAX_STREAMS, SIMD_WIDTH } from "./limits.ts";
import { encodeSiteProjections, type SiteRead } from "./site-read.ts";

/** Largest expert count and top-k the router and list kernels hold. */
export const MOE_MAX_EXPERTS = 1024;
export const MOE_MAX_TOPK = 32;
/** Logits a lane of the routed gate/up holds in registers in its two register forms (ROUTER_FAST_SLOTS, ROUTER_WIDE_SLOTS in kernels/moe.metal). */
export const ROUTER_FAST_SLOTS = 4;
export const ROUTER_WIDE_SLOTS = 16;
const ROUTER_SG = 4;
const LIST_THREADS = 256;
const COMBINE_THREADS = 64;

export interface RouterConfig {
  experts: number;
  top_k: number;
  norm_topk_prob: boolean;
}

/** Router outputs: ids [nb][k] (i32) and weights [nb][k] (f32), rows packed. */
export interface Routes {
  ids: Binding;
  weights: Binding;
}

/** The shared expert's gate logit sg = w_sg . x, computed in the router's dispatch (same input). */
export interface SharedGate {
  w: TensorRef;
  sg: RowsRef;
}

/**
 * logits = W_router x, then per row softmax over E and the top-k by logit (ties: lower id),
 * weights p_k or p_k / sum (norm_topk_prob). With `sharedGate`, its logit too.
 */
export function encodeRouter(
  ctx: EncodeContext,
  router: TensorRef,
  x: RowsRef,
  logits: RowsRef,
  routes: Routes,
  nb: number,
  cfg: RouterConfig,
  sharedGate?: SharedGate,
  read?: SiteRead,
): void {
  encodeRouterLogits(ctx, router, x, logits, nb, cfg, sharedGate, read);
  encodeRouterTopK(ctx, logits, routes, nb, cfg);
}

/**
 * logits = W_router x alone (a step whose gate_up routes itself: moe_gate_up_pairs_routed).
 * With `sharedGate`, the shared expert's gate logit of the same rows in the same dispatch
 * (matvec_multi, when the dtypes match: the same bits as a matvec each in that form). With
 * `read`, x is that site read, which the router's dispatch may form itself (site-read.ts).
 */
export function encodeRouterLogits(
  ctx: EncodeContext,
  router: TensorRef,
  x: RowsRef,
  logits: RowsRef,
  nb: number,
  cfg: RouterConfig,
  sharedGate?: SharedGate,
  read?: SiteRead,
): void {
  const [E] = matrixShape(router, "router");
  if (E !== cfg.experts) throw new Error(`router has ${E} rows, config says ${cfg.experts} experts`);
  // (no read: encodeMatvecs, a lone router a matvec of its own)
  encodeSiteProjections(ctx, sharedGate ? [{ w: router, y: logits }, { w: sharedGate.w, y: sharedGate.sg }] : [{ w: router, y: logits }], read, x, nb);
}

/** Throws unless the router kernels hold cfg's experts and top_k. */
function checkRouterConfig(cfg: RouterConfig): void {
  if (cfg.experts < 1 || cfg.experts > MOE_MAX_EXPERTS) throw new Error(`router: ${cfg.experts} experts, at most ${MOE_MAX_EXPERTS}`);
  if (cfg.top_k < 1 || cfg.top_k > Math.min(cfg.experts, MOE_MAX_TOPK))
    throw new Error(`router: top_k ${cfg.top_k} must be in 1..${Math.min(cfg.experts, MOE_MAX_TOPK)}`);
}

/** Softmax + top-k of logits already computed. */
export function encodeRouterTopK(ctx: EncodeContext, logits: RowsRef, routes: Routes, nb: number, cfg: RouterConfig): void {
  checkRows(nb, "router_topk");
  checkRouterConfig(cfg);
  dispatch(
    ctx,
    "router_topk_f32",
    Params.Router,
    { rows: nb, experts: cfg.experts, top_k: cfg.top_k, norm_topk: cfg.norm_topk_prob ? 1 : 0, logits_stride: logits.stride },
    [bind(logits.buffer, logits.offset), routes.ids, routes.weights],
    Math.ceil(nb / ROUTER_SG),
    SIMD_WIDTH * ROUTER_SG,
  );
}

/**
 * Pairs grouped by expert: offsets [E + 1] (i32), pairs [nb * k] (i32), and active [E + 1]
 * (i32: the count of experts with pairs, then their ids ascending).
 */
export interface ExpertLists {
  offsets: Binding;
  pairs: Binding;
  active: Binding;
}

/** Groups pair q = r * k + j by expert ids[q] into `lists`. */
export function encodeExpertLists(ctx: EncodeContext, ids: Binding, lists: ExpertLists, nb: number, topK: number, experts: number): void {
  checkRows(nb, "moe_lists");
  if (experts < 1 || experts > MOE_MAX_EXPERTS) throw new Error(`moe_lists: ${experts} experts, at most ${MOE_MAX_EXPERTS}`);
  dispatch(ctx, "moe_lists_i32", Params.MoeLists, { pairs: nb * topK, experts }, [ids, lists.offsets, lists.pairs, lists.active], 1, LIST_THREADS);
}

/** One part of an expert record (lib/model/format.ts ExpertLayout.parts). */
export interface ExpertPartRef {
  name: string;
  dtype: DType;
  shape: readonly number[];
  /** Byte offset inside a record. */
  offset: number;
}

/**
 * The expert pool: slot s holds one expert record, in buffers[floor(s / slotsPerBuffer)] at
 * (s % slotsPerBuffer) * stride; `slotOf` (i32 [E]) maps this layer's experts to slots (-1:
 * not resident). A missing slot makes its pairs' outputs NaN (never a read outside the pool),
 * for the engine's finite check to catch. A pool in several buffers (a device whose largest
 * buffer is smaller than the pool) has per-buffer tables after slotOf (ExpertPool.slotTableStride
 * in residency.ts), and the kernels run once per buffer.
 */
export interface ExpertPool {
  buffers: readonly Buffer[];
  slotsPerBuffer: number;
  slots: number;
  stride: number;
  parts: readonly ExpertPartRef[];
}

function part(pool: ExpertPool, name: string): ExpertPartRef {
  const p = pool.parts.find((x) => x.name === name);
  if (!p) throw new Error(`expert pool: record has no part ${name} (parts: ${pool.parts.map((x) => x.name).join(", ")})`);
  if (p.offset % 16 !== 0) throw new Error(`expert pool: part ${name} at offset ${p.offset}, not 16-byte aligned`);
  return p;
}

/** Scratch of the routed experts for nb rows: h [nb*k][I], o [nb*k][d]. */
export interface RoutedScratch {
  h: RowsRef;
  o: RowsRef;
}

/**
 * Rows up to which a step's routed experts run per routed pair (moe_gate_up_pairs, then
 * moe_down_combine): a decode row, and a verify batch of up to 3 drafts, whose rows then get a
 * decode row's bits (one row's pairs are computed the same way whatever the batch) in 2
 * dispatches instead of the lists, the expert-major kernels and the combine. Past it a batch
 * reads each active expert once for all its rows (moe_gate_up / moe_down over the pair lists).
 */
export const PAIR_ROWS = 4;

/**
 * Whether a layer's routed experts can end in moe_down_combine (the down projections and the
 * combine in one dispatch): up to PAIR_ROWS rows over q4 records in a one-buffer pool. The
 * caller then skips encodeMoeCombine; the results are the same bits.
 */
export function fusesDownCombine(pool: ExpertPool, nb: number): boolean {
  return nb <= PAIR_ROWS && pool.buffers.length === 1 && pool.parts.every((p) => p.dtype === "q4");
}

/**
 * Simdgroups of a moe_down_combine threadgroup (at most MOE_DC_SG), each taking the row's
 * experts in turn and asking L2 for its next one's rows first. 4: a decode step's d / 4
 * threadgroups (512 at the 30b shape, 128 registers a thread on sm_90) fit one wave of the
 * H200 (4 a core), where 8 took two. The kernel gives the same bits for any count.
 * CHERENKOV_MOE_DC_SG overrides it (measurements).
 */
const DOWN_COMBINE_SIMDGROUPS = (() => {
  const n = Number(process.env.CHERENKOV_MOE_DC_SG ?? 4);
  if (!Number.isInteger(n) || n < 1 || n > 8) throw new Error(`CHERENKOV_MOE_DC_SG=${process.env.CHERENKOV_MOE_DC_SG}: expected an integer from 1 to 8 (moe_down_combine's simdgroups)`);
  return n;
})();
/**
 * Whether a decode step's gate and up (moe_gate_up_pairs, _routed) ask L2 for their experts'
 * down rows, each threadgroup a share, so moe_down_combine reads them from L2 instead of
 * memory (a prefetch on CUDA; nothing on Metal and the CPU backend, which have no such
 * instruction): CHERENKOV_MOE_PREFETCH_DOWN=1 on, =0 or unset off. On the H200 it took
 * bench:kernels' routed experts from 31.8 to 25.9 us but gave a 30b decode step nothing
 * (4.59-4.64 ms on, 4.56-4.59 off: docs/performance.md "twelfth run"), so it is off.
 * Read at each call.
 */
export function prefetchesDown(): boolean {
  return envOnOff("CHERENKOV_MOE_PREFETCH_DOWN");
}

/**
 * Whether a decode step's gate and up (moe_gate_up_pairs, _routed) ask L2 for their own rows
 * (each simdgroup its MV_R rows of gate and of up) as soon as they know the expert's slot:
 * nvcc issues many of the kernel's weight loads one at a time between its arithmetic (the
 * H200's SASS), and each then waits on memory; after the prefetch they wait on L2. A
 * prefetch on CUDA, nothing on Metal and the CPU backend. On by default: on the H200 a 30b
 * decode step took 4.36 / 4.41 / 4.39 ms with it against 4.45-4.52 without, alternated in two
 * calls (docs/performance.md "fifteenth run"). CHERENKOV_MOE_PREFETCH_TILE=0 off, =1 or unset
 * on. Read at each call.
 */
export function prefetchesTile(): boolean {
  return envOnOff("CHERENKOV_MOE_PREFETCH_TILE", true);
}

/**
 * The routed gate/up kernel for a layer of `experts` (kernels/moe.metal: one kernel per router
 * form, so the forms a model never takes add no code to the one it runs): a lane's logits in
 * registers up to 128 experts (ROUTER_FAST_SLOTS) or 512 (ROUTER_WIDE_SLOTS), else re-read.
 */
export function routedGateUpKernel(experts: number): string {
  if (experts <= SIMD_WIDTH * ROUTER_FAST_SLOTS) return "moe_gate_up_pairs_routed_q4_f32";
  if (experts <= SIMD_WIDTH * ROUTER_WIDE_SLOTS) return "moe_gate_up_pairs_routed_wide_q4_f32";
  return "moe_gate_up_pairs_routed_any_q4_f32";
}

/** The list-based expert kernels' params prefetch nothing. */
const NO_PREFETCH = { w2_offset: 0, prefetch_w2: 0, prefetch_tile: 0 } as const;

/** The largest top_k moe_down_combine holds in threadgroup memory (MOE_MAX_TOP_K). */
const DOWN_COMBINE_MAX_TOP_K = 64;

/** What moe_down_combine needs besides the pool: the routing and where the layer's output goes. */
export interface DownCombine {
  ids: Binding;
  weights: Binding;
  y: RowsRef;
  shared?: { s: RowsRef; sg: RowsRef };
  /** The site's write of the output, done by the kernel (moe_down_combine_hc); y is then unwritten. */
  into?: SiteWrite;
  /**
   * The router's logits, when the gate and up route the rows themselves
   * (moe_gate_up_pairs_routed: softmax + top-k per threadgroup, one of which writes ids and
   * weights): no router_topk before them.
   */
  route?: { logits: RowsRef; norm_topk_prob: boolean };
}

/**
 * Routed experts of one layer: for every pair q = r * k + j (expert e = ids[q]),
 * h[q] = SiLU(gate_e x[r]) * up_e x[r], then o[q] = down_e h[q]. With one row (a decode
 * step: one pair per expert) q4 records take the kernels' one-row forms.
 */
export function encodeRoutedExperts(
  ctx: EncodeContext,
  pool: ExpertPool,
  slotOf: Binding,
  lists: ExpertLists | null,
  x: RowsRef,
  scratch: RoutedScratch,
  nb: number,
  topK: number,
  experts: number,
  combine?: DownCombine,
): void {
  checkRows(nb, "moe_experts");
  const gate = part(pool, "gate");
  const up = part(pool, "up");
  const down = part(pool, "down");
  const [I, d] = gate.shape as [number, number];
  if (up.shape[0] !== I || up.shape[1] !== d || down.shape[0] !== d || down.shape[1] !== I)
    throw new Error(`expert parts: gate [${gate.shape}], up [${up.shape}], down [${down.shape}] do not fit together`);
  if (gate.dtype !== up.dtype || gate.dtype !== down.dtype)
    throw new Error(`expert parts: mixed dtypes ${gate.dtype}/${up.dtype}/${down.dtype} (one kernel reads all three)`);
  const dtype = gate.dtype;
  if (dtype === "q4" && (d % 32 !== 0 || I % 32 !== 0)) throw new Error(`expert parts: q4 needs widths that are multiples of 32 (d ${d}, I ${I})`);
  const T = MATVEC_TILE;
  // A decode step that ends in moe_down_combine: gate and up per routed pair straight from
  // the router's ids (no pair lists), then the fused down + combine.
  if (combine) {
    if (!fusesDownCombine(pool, nb)) throw new Error(`moe_down_combine: needs at most ${PAIR_ROWS} rows, q4 records and a one-buffer pool (fusesDownCombine)`);
    const values = {
      rows: nb, top_k: topK, experts, slots: pool.slots, record_stride: pool.stride, in_dim: d, out_dim: I, w0_offset: gate.offset, w1_offset: up.offset,
      x_stride: x.stride, y_stride: scratch.h.stride, w2_offset: down.offset, prefetch_w2: prefetchesDown() ? 1 : 0,
      prefetch_tile: prefetchesTile() ? 1 : 0,
    };
    const io = [slotOf, pool.buffers[0]!, bind(x.buffer, x.offset), bind(scratch.h.buffer, scratch.h.offset)];
    const grid: [number, number] = [Math.ceil(I / (T.rows * T.simdgroups)), nb * topK];
    const route = combine.route;
    if (route) {
      checkRouterConfig({ experts, top_k: topK, norm_topk_prob: route.norm_topk_prob });
      dispatch(
        ctx,
        routedGateUpKernel(experts),
        Params.MoeRoutedGateUp,
        { ...values, norm_topk: route.norm_topk_prob ? 1 : 0, logits_stride: route.logits.stride },
        [bind(route.logits.buffer, route.logits.offset), combine.ids, combine.weights, ...io],
        grid,
        SIMD_WIDTH * T.simdgroups,
      );
    } else {
      dispatch(ctx, "moe_gate_up_pairs_q4_f32", Params.MoeExperts, values, [combine.ids, ...io], grid, SIMD_WIDTH * T.simdgroups);
    }
    encodeDownCombine(ctx, pool, slotOf, scratch, nb, topK, experts, I, d, down.offset, combine);
    return;
  }
  if (!lists) throw new Error("moe_experts: the pair lists are required unless the step ends in moe_down_combine");
  // A decode step routes one row: every active expert has exactly one pair.
  const pairsPerPass = nb === 1 ? 1 : MATVEC_TILE.batchRows;
  // One threadgroup row per expert that can be active: at most E, at most one per pair.
  const expertRows = Math.min(experts, nb * topK);
  // Per pool buffer: its pool, slot table, active list and slot count. One buffer: the
  // layer's table and the GPU-built active list, as the kernels were written for.
  const table = "offset" in slotOf ? slotOf : { buffer: slotOf, offset: 0 };
  const parts = pool.buffers.length === 1
    ? [{ pool: pool.buffers[0]!, slotOf, active: lists.active, slots: pool.slots }]
    : pool.buffers.map((buffer, b) => {
        const base = table.offset + 4 * (experts + 1 + b * (2 * experts + 1));
        const slots = Math.min(pool.slotsPerBuffer, pool.slots - b * pool.slotsPerBuffer);
        return { pool: buffer, slotOf: bind(table.buffer, base), active: bind(table.buffer, base + 4 * experts), slots };
      });
  // Prefill-sized batches take the grouped GEMM (kernels/gemm.metal: the same params,
  // bindings and results, through the tile API): GEMM_TILE.cols outputs per threadgroup for
  // down, half as many of gate and of up for gate_up. The fused decode form keeps the matvec.
  const gemm = !combine && usesGemm(dtype, nb, gemmMinRows(ctx.device.backend));
  const run = (kernel: string, values: Omit<ParamValues<typeof Params.MoeExperts>, "rows" | "top_k" | "experts" | "slots" | "record_stride">, x: RowsRef, y: RowsRef, outDim: number, perGroup: number) => {
    for (const p of parts)
      dispatch(
        ctx,
        kernel,
        Params.MoeExperts,
        { rows: nb, top_k: topK, experts, slots: p.slots, record_stride: pool.stride, ...values },
        [lists.offsets, lists.pairs, p.active, p.slotOf, p.pool, bind(x.buffer, x.offset), bind(y.buffer, y.offset)],
        [Math.ceil(outDim / perGroup), expertRows],
        SIMD_WIDTH * (gemm ? GEMM_TILE.simdgroups : T.simdgroups),
      );
  };
  run(
    gemm ? `moe_gemm_gate_up_${dtype}_f32` : oneRowForm(`moe_gate_up_${dtype}_f32`, dtype, pairsPerPass),
    { in_dim: d, out_dim: I, w0_offset: gate.offset, w1_offset: up.offset, x_stride: x.stride, y_stride: scratch.h.stride, ...NO_PREFETCH },
    x,
    scratch.h,
    I,
    gemm ? GEMM_TILE.cols / 2 : T.rows * T.simdgroups,
  );
  run(
    gemm ? `moe_gemm_down_${dtype}_f32` : oneRowForm(`moe_down_${dtype}_f32`, dtype, pairsPerPass),
    { in_dim: I, out_dim: d, w0_offset: down.offset, w1_offset: 0, x_stride: scratch.h.stride, y_stride: scratch.o.stride, ...NO_PREFETCH },
    scratch.h,
    scratch.o,
    d,
    gemm ? GEMM_TILE.cols : T.rows * T.simdgroups,
  );
}

/** The fused down projections + combine of a decode step (moe_down_combine) into combine.y, or written into combine.into. */
function encodeDownCombine(
  ctx: EncodeContext,
  pool: ExpertPool,
  slotOf: Binding,
  scratch: RoutedScratch,
  nb: number,
  topK: number,
  experts: number,
  I: number,
  d: number,
  downOffset: number,
  combine: DownCombine,
): void {
  if (topK > DOWN_COMBINE_MAX_TOP_K) throw new Error(`moe_down_combine: top_k ${topK} exceeds ${DOWN_COMBINE_MAX_TOP_K}`);
  const T = MATVEC_TILE;
  const { y, shared, into } = combine;
  const common = {
    rows: nb,
    top_k: topK,
    in_dim: I,
    out_dim: d,
    experts,
    slots: pool.slots,
    record_stride: pool.stride,
    w_offset: downOffset,
    h_stride: scratch.h.stride,
    s_stride: shared?.s.stride ?? 0,
    sg_stride: shared?.sg.stride ?? 0,
  };
  const inputs: Binding[] = [combine.ids, combine.weights, slotOf, pool.buffers[0]!, bind(scratch.h.buffer, scratch.h.offset)];
  const sharedInputs: Binding[] = shared ? [bind(shared.s.buffer, shared.s.offset), bind(shared.sg.buffer, shared.sg.offset)] : [];
  const grid: [number, number] = [Math.ceil(d / T.rows), nb];
  if (into) {
    checkDownCombineTarget(into, d);
    // A plain residual (no coefficients) binds X in the unused coefficients' place.
    const coeffs = into.coeffs ?? into.X;
    dispatch(
      ctx,
      shared ? "moe_down_combine_shared_hc_q4_f32" : "moe_down_combine_hc_q4_f32",
      Params.MoeDownCombineHc,
      { ...common, streams: into.streams, residual: into.coeffs ? 0 : 1, hc_stride: into.X.stride, c_stride: coeffs.stride, ...hcFoldParams(into.fold) },
      [...inputs, bind(into.X.buffer, into.X.offset), ...sharedInputs, bind(coeffs.buffer, coeffs.offset), ...hcFoldBindings(into.fold, into.X)],
      grid,
      SIMD_WIDTH * DOWN_COMBINE_SIMDGROUPS,
    );
    return;
  }
  dispatch(
    ctx,
    shared ? "moe_down_combine_shared_q4_f32" : "moe_down_combine_q4_f32",
    Params.MoeDownCombine,
    { ...common, y_stride: y.stride },
    [...inputs, bind(y.buffer, y.offset), ...sharedInputs],
    grid,
    SIMD_WIDTH * DOWN_COMBINE_SIMDGROUPS,
  );
}

/** moe_down_combine_hc writes whole float4 columns of 16-byte aligned stream rows. */
function checkDownCombineTarget(into: SiteWrite, d: number): void {
  if (into.d !== d) throw new Error(`moe_down_combine_hc: the experts' output has ${d} values, the streams' hidden size is ${into.d}`);
  if (d % 4 !== 0) throw new Error(`moe_down_combine_hc: hidden size ${d} is not a multiple of 4 (the streams are written in float4 columns)`);
  const n = into.streams;
  if (!Number.isInteger(n) || n < 1 || n > HC_MAX_STREAMS) throw new Error(`moe_down_combine_hc: ${n} streams, expected 1..${HC_MAX_STREAMS}`);
  if (!into.coeffs && n !== 1) throw new Error(`moe_down_combine_hc: a plain residual write has one stream, not ${n}`);
  if (into.X.offset % 16 !== 0 || into.X.stride % 16 !== 0)
    throw new Error(`moe_down_combine_hc: streams rows at offset ${into.X.offset}, stride ${into.X.stride}: expected 16-byte aligned rows`);
}

/** The shared expert's tensors (`moe.shared_*`). */
export interface SharedExpertRefs {
  gate: TensorRef;
  up: TensorRef;
  down: TensorRef;
  /** [1, d]: its gate logit. */
  expertGate: TensorRef;
}

/** Scratch of the shared expert: h [nb][SI], s [nb][d], sg [nb][1]. */
export interface SharedScratch {
  h: RowsRef;
  s: RowsRef;
  sg: RowsRef;
}

/**
 * s[r] = down(SiLU(gate x[r]) * up x[r]) and sg[r] = w_sg . x[r] (the combine applies the
 * sigmoid); `gate: false` leaves sg to the router's dispatch (encodeRouter's sharedGate).
 */
export function encodeSharedExpert(ctx: EncodeContext, w: SharedExpertRefs, x: RowsRef, scratch: SharedScratch, nb: number, opts: { gate?: boolean } = {}): void {
  checkRows(nb, "shared expert");
  const [SI, d] = matrixShape(w.gate, "shared_gate");
  if (w.gate.dtype !== w.up.dtype) throw new Error(`shared expert: gate ${w.gate.dtype} and up ${w.up.dtype} differ`);
  const T = MATVEC_TILE;
  if (usesGemm(w.gate.dtype, nb, gemmMinRows(ctx.device.backend))) {
    encodeGemmGateUp(ctx, w.gate, w.up, x, scratch.h, nb);
  } else {
    // Rows a threadgroup as the projections take them: a GPU's verify batch one row a
    // threadgroup (on the H200 the tiny model's 3-row batch took 9.3 us where a decode row
    // takes 5.4), the same sums a row either way.
    const rowsPerGroup = defaultRowsPerGroup(ctx.device.backend, nb);
    dispatch(
      ctx,
      `ffn_gate_up_${w.gate.dtype}_f32`,
      Params.Matvec,
      { rows: nb, in_dim: d, out_dim: SI, accumulate: 0, rows_per_group: rowsPerGroup, x_stride: x.stride, y_stride: scratch.h.stride },
      [bind(w.gate.buffer, w.gate.offset), bind(w.up.buffer, w.up.offset), bind(x.buffer, x.offset), bind(scratch.h.buffer, scratch.h.offset)],
      [Math.ceil(SI / (T.rows * T.simdgroups)), Math.ceil(nb / rowsPerGroup)],
      SIMD_WIDTH * T.simdgroups,
    );
  }
  encodeMatvec(ctx, w.down, scratch.h, scratch.s, nb);
  if (opts.gate !== false) encodeMatvec(ctx, w.expertGate, x, scratch.sg, nb);
}

/** y[r] = sum_j w[r][j] o[r * k + j] (+ sigmoid(sg[r]) s[r] when `shared` is given). */
export function encodeMoeCombine(
  ctx: EncodeContext,
  weights: Binding,
  o: RowsRef,
  y: RowsRef,
  nb: number,
  topK: number,
  d: number,
  shared?: { s: RowsRef; sg: RowsRef },
): void {
  checkRows(nb, "moe_combine");
  const buffers: Binding[] = [weights, bind(o.buffer, o.offset), bind(y.buffer, y.offset)];
  if (shared) buffers.push(bind(shared.s.buffer, shared.s.offset), bind(shared.sg.buffer, shared.sg.offset));
  dispatch(
    ctx,
    shared ? "moe_combine_shared_f32" : "moe_combine_f32",
    Params.MoeCombine,
    {
      rows: nb,
      top_k: topK,
      cols: d,
      o_stride: o.stride,
      s_stride: shared?.s.stride ?? 0,
      sg_stride: shared?.sg.stride ?? 0,
      y_stride: y.stride,
    },
    buffers,
    [Math.ceil(d / COMBINE_THREADS), nb],
    [COMBINE_THREADS, 1],
  );
}
