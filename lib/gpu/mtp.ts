// The MTP head's input fusion (kernels/output.metal; MODEL.md "MTP draft head"):
// y[r] = [RMSNorm(embed[tok[r]], mtp.embed_norm) | RMSNorm(hidden[r], mtp.hidden_norm)],
// embedding first, [nb][2d]; mtp.fc . y then follows as a projection.
import type { Binding } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { SIMD_WIDTH } from "./limits.ts";
import { Params } from "./params.ts";
import { checkRows, checkVector, matrixShape } from "./projections.ts";

export interface MtpNorms {
  embedNorm: TensorRef;
  hiddenNorm: TensorRef;
}

/** Writes the fused MTP input of nb rows (tokens ids[r], trunk hidden h[r]) into y. */
export function encodeMtpInput(
  ctx: EncodeContext,
  embed: TensorRef,
  ids: Binding,
  hidden: RowsRef,
  norms: MtpNorms,
  y: RowsRef,
  nb: number,
  eps: number,
): void {
  const [vocab, d] = matrixShape(embed, "mtp embed");
  checkRows(nb, "mtp_fuse");
  checkVector(norms.embedNorm, d, "mtp.embed_norm");
  checkVector(norms.hiddenNorm, d, "mtp.hidden_norm");
  if (y.stride < 2 * d * 4) throw new Error(`mtp_fuse: output stride ${y.stride} is below 2d floats`);
  dispatch(
    ctx,
    `mtp_fuse_${embed.dtype}_f32`,
    Params.MtpFuse,
    { rows: nb, cols: d, vocab, eps, h_stride: hidden.stride, y_stride: y.stride },
    [ids, bind(embed.buffer, embed.offset), bind(hidden.buffer, hidden.offset), bind(norms.embedNorm.buffer, norms.embedNorm.offset), bind(norms.hiddenNorm.buffer, norms.hiddenNorm.offset), bind(y.buffer, y.offset)],
    nb,
    2 * SIMD_WIDTH,
  );
}
