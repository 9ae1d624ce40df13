// Elementwise ops over row batches (kernels/elementwise.metal): residual adds, the gated
// MLP's SiLU(a) * b, the attention gate a * sigmoid(b), and a + scale * b. y may be a.
import { bind, dispatch, type EncodeContext, type RowsRef } from "./dispatch.ts";
import { Params } from "./params.ts";
import { checkRows } from "./projections.ts";

export type ElementwiseOp = "add" | "silu_mul" | "sigmoid_mul" | "scale_add";

const THREADS = 64;

/** y[r][c] = op(a[r][c], b[r][c]) for r < nb, c < cols (`scale` only for scale_add). */
export function encodeElementwise(
  ctx: EncodeContext,
  op: ElementwiseOp,
  a: RowsRef,
  b: RowsRef,
  y: RowsRef,
  nb: number,
  cols: number,
  scale = 1,
  threads = THREADS,
): void {
  checkRows(nb, `ew_${op}`);
  if (!Number.isInteger(cols) || cols < 1) throw new Error(`ew_${op}: cols ${cols} must be a positive integer`);
  dispatch(
    ctx,
    `ew_${op}_f32`,
    Params.Elementwise,
    { rows: nb, cols, scale, a_stride: a.stride, b_stride: b.stride, y_stride: y.stride },
    [bind(a.buffer, a.offset), bind(b.buffer, b.offset), bind(y.buffer, y.offset)],
    [Math.ceil(cols / threads), nb],
    [threads, 1],
  );
}

/** x += y: the plain (n = 1) residual write. */
export function encodeResidualAdd(ctx: EncodeContext, x: RowsRef, y: RowsRef, nb: number, cols: number): void {
  encodeElementwise(ctx, "add", x, y, x, nb, cols);
}
