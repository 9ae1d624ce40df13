// Embedding gather (kernels/embed.metal): each row's token row of the table, in any stored
// dtype, written into all n residual streams of X [nb][n][d] (n = 1: the plain residual).
import type { Binding } from "../shim.ts";
import { dispatch, type EncodeContext, type RowsRef, type TensorRef, bind } from "./dispatch.ts";
import { Params } from "./params.ts";
import { checkRows, matrixShape } from "./projections.ts";

const THREADS = 64;

/**
 * X[r][i] = table[ids[r]] for r < nb and every stream i < streams (streams d floats apart
 * inside a row of X). An id outside the vocabulary writes NaN.
 */
export function encodeEmbed(ctx: EncodeContext, table: TensorRef, ids: Binding, X: RowsRef, nb: number, streams = 1): void {
  const [vocab, d] = matrixShape(table, "embed");
  checkRows(nb, "embed");
  if (!Number.isInteger(streams) || streams < 1) throw new Error(`embed: streams ${streams} must be a positive integer`);
  if (X.stride < streams * d * 4) throw new Error(`embed: row stride ${X.stride} is below ${streams} streams of ${d} floats`);
  dispatch(
    ctx,
    `embed_${table.dtype}_f32`,
    Params.Embed,
    { rows: nb, cols: d, streams, vocab, y_stride: X.stride, stream_stride: d * 4 },
    [ids, bind(table.buffer, table.offset), bind(X.buffer, X.offset)],
    [Math.ceil(d / THREADS), nb],
    [THREADS, 1],
  );
}
