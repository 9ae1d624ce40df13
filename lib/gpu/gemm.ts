// Row-batch projections as tiled matrix products (kernels/gemm.metal): each weight tile is
// unpacked once per GEMM_TILE.rows batch rows and multiplied on the matrix units through the
// tile API (kernels/tile.h): bf16 operands split in hi + lo pairs, three products, f32 sums
// (docs/model.md, rule R7: about 2^-16 of |w x|, close to the f32 matvec). The
// matvec kernels stay the path for few rows (decode, verify batches): which one a projection
// takes is `usesGemm`'s choice, by the row count.
import type { DType } from "../model/config.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { SIMD_WIDTH, tiledMinRows } from "./limits.ts";
import { Params } from "./params.ts";
import { checkRows, matrixShape } from "./projections.ts";

/** Batch rows and output rows of a threadgroup's block, its K step and simdgroups (kernels/gemm.metal). */
export const GEMM_TILE = { rows: 64, cols: 64, k: 32, simdgroups: 4 } as const;

/**
 * Rows from which a q4 projection takes the GEMM instead of the matvec on a GPU, measured on
 * the H200 (`bun spec/bench/kernels.ts --preset 30b-a3b-shape --storage device --nb 8,16,32,64
 * --filter projection`, docs/performance.md): the engine's GEMM (split operands) against the
 * matvec at 8 / 16 / 32 rows took 71 / 68 / 75 us vs 58 / 101 / 193 us for [8192, 2048] and
 * 133 / 135 / 142 us vs 62 / 110 / 212 us for [2048, 4096]: at 16 rows a DeltaNet layer's two
 * saves 8 us, at 8 both lose. Below it, and always at decode (one row), the matvec keeps f32 activations and its decode
 * forms. The CPU backend keeps the matvec at every row count: it emulates a tile product with
 * two lane exchanges (fiber switches), and measured 3-8x slower than its matvec at the small
 * preset's shapes. CHERENKOV_GEMM_MIN_ROWS overrides both (tuning runs; tests that send tiny
 * prompts through the GEMM). Keep it above 1 + MAX_SNAP: a speculative verify batch then runs
 * the same kernels as a decode step, so accepting drafts cannot change a greedy token.
 */
export const GEMM_MIN_ROWS = 16;

const GEMM_KERNELS: Record<DType, string> = {
  f32: "gemm_f32_f32",
  bf16: "gemm_bf16_f32",
  f16: "gemm_f16_f32",
  q4: "gemm_q4_f32",
};

/** The one-product forms (plain bf16 operands, 2^-8 of |w x|): the tile API's own precision. */
const GEMM_PLAIN_KERNELS: Partial<Record<DType, string>> = {
  f32: "gemm_plain_f32_f32",
  q4: "gemm_plain_q4_f32",
};

/**
 * The row threshold in force on `backend`: CHERENKOV_GEMM_MIN_ROWS when set (a positive
 * integer), else GEMM_MIN_ROWS on a GPU and never (Infinity) on the CPU backend.
 */
export function gemmMinRows(backend: string): number {
  return tiledMinRows("CHERENKOV_GEMM_MIN_ROWS", backend, GEMM_MIN_ROWS);
}

/**
 * Whether a projection of `nb` rows over weights of `dtype` takes the GEMM, at a threshold of
 * `minRows` (gemmMinRows). Only q4: f32 weights are the router's and the hyper-connections'
 * (routing decisions and stream mixing stay in f32), and the engine's matrices are q4 otherwise.
 */
export function usesGemm(dtype: DType, nb: number, minRows: number): boolean {
  return dtype === "q4" && nb >= minRows;
}

export interface GemmOptions {
  /** y += W x instead of y = W x. */
  accumulate?: boolean;
  /**
   * "split" (default): operands as bf16 hi + lo pairs, three tile products per step (rule R7).
   * "plain": one bf16 product (f32 and q4 weights only): faster, 2^-8 of |w x|; too coarse for
   * the engine (it moved the tiny goldens' logit margins by 1.6e-2), kept for tests and benches.
   */
  precision?: "split" | "plain";
}

/** Checks a GEMM's weight, input and row count; returns [out, in]. Any input width but q4's (32 per group). */
function checkGemm(w: TensorRef, x: RowsRef, nb: number): [number, number] {
  const [out, inDim] = matrixShape(w, "gemm");
  checkRows(nb, "gemm");
  if (w.dtype === "q4" && inDim % 32 !== 0) throw new Error(`gemm: a q4 weight [${out}, ${inDim}] needs an input width that is a multiple of 32`);
  // Whole 16-column spans of x load as float4 (Metal wants those aligned); q4 reads 8-byte nibble runs.
  if (x.offset % 16 !== 0 || x.stride % 16 !== 0)
    throw new Error(`gemm: input offset ${x.offset} and row stride ${x.stride} must be multiples of 16 bytes`);
  if (w.offset % 16 !== 0) throw new Error(`gemm: weight offset ${w.offset} must be a multiple of 16 bytes`);
  return [out, inDim];
}

/** y[r] = W x[r] for r < nb through the tile API, any weight dtype (q4: input width a multiple of 32). */
export function encodeGemm(ctx: EncodeContext, w: TensorRef, x: RowsRef, y: RowsRef, nb: number, opts: GemmOptions = {}): void {
  const [out, inDim] = checkGemm(w, x, nb);
  const plain = opts.precision === "plain";
  const kernel = plain ? GEMM_PLAIN_KERNELS[w.dtype] : GEMM_KERNELS[w.dtype];
  if (!kernel) throw new Error(`gemm: no plain-precision kernel for ${w.dtype} weights (f32 and q4 have one)`);
  dispatch(
    ctx,
    kernel,
    Params.Gemm,
    { rows: nb, in_dim: inDim, out_dim: out, accumulate: opts.accumulate ? 1 : 0, x_stride: x.stride, y_stride: y.stride },
    [bind(w.buffer, w.offset), bind(x.buffer, x.offset), bind(y.buffer, y.offset)],
    [Math.ceil(out / GEMM_TILE.cols), Math.ceil(nb / GEMM_TILE.rows)],
    [SIMD_WIDTH * GEMM_TILE.simdgroups, 1],
  );
}

/**
 * y[r] = SiLU(W_gate x[r]) * (W_up x[r]) for r < nb through the tile API (the shared expert's
 * input half, as ffn_gate_up): q4 weights of one shape [out, in], split operands.
 */
export function encodeGemmGateUp(ctx: EncodeContext, gate: TensorRef, up: TensorRef, x: RowsRef, y: RowsRef, nb: number): void {
  const [out, inDim] = checkGemm(gate, x, nb);
  const [upOut, upIn] = matrixShape(up, "gemm_gate_up");
  if (gate.dtype !== "q4" || up.dtype !== "q4") throw new Error(`gemm_gate_up: q4 weights only (gate ${gate.dtype}, up ${up.dtype})`);
  if (upOut !== out || upIn !== inDim) throw new Error(`gemm_gate_up: gate [${out}, ${inDim}] and up [${upOut}, ${upIn}] differ`);
  if (up.offset % 16 !== 0) throw new Error(`gemm_gate_up: weight offset ${up.offset} must be a multiple of 16 bytes`);
  dispatch(
    ctx,
    "gemm_gate_up_q4_f32",
    Params.Gemm,
    { rows: nb, in_dim: inDim, out_dim: out, accumulate: 0, x_stride: x.stride, y_stride: y.stride },
    [bind(gate.buffer, gate.offset), bind(up.buffer, up.offset), bind(x.buffer, x.offset), bind(y.buffer, y.offset)],
    [Math.ceil(out / (GEMM_TILE.cols / 2)), Math.ceil(nb / GEMM_TILE.rows)],
    [SIMD_WIDTH * GEMM_TILE.simdgroups, 1],
  );
}
