// The end of a step (kernels/hc.metal, matvec.metal, output.metal): the final
// hyper-connection read with the final RMSNorm, the logits projection (LM head or the tied
// embedding, any stored dtype) and the greedy argmax per row with its top1 - top2 margin.
import type { Binding } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { encodeHcCoefficients, encodeHcRead, type HcConfig, type HcScratch, type HcSiteRefs } from "./hyperconnection.ts";
import { SIMD_WIDTH } from "./limits.ts";
import { encodeRmsNorm } from "./norms.ts";
import { Params } from "./params.ts";
import { checkRows, encodeProjection, type ProjectionInput } from "./projections.ts";

/**
 * hidden[r] = RMSNorm(sum_i pre_i X[r][i], final_norm) with the head's pre (hc_head.*), or
 * RMSNorm(X[r], final_norm) with n = 1 (head null). The MTP head reads `hidden` too.
 */
export function encodeFinalRead(
  ctx: EncodeContext,
  X: RowsRef,
  head: HcSiteRefs | null,
  scratch: HcScratch,
  hidden: RowsRef,
  nb: number,
  cfg: HcConfig,
  d: number,
  finalNorm: TensorRef,
  eps: number,
): void {
  if (!head) {
    if (cfg.streams !== 1) throw new Error(`hc_head weights are required with ${cfg.streams} streams`);
    encodeRmsNorm(ctx, X, finalNorm, hidden, nb, eps);
    return;
  }
  encodeHcCoefficients(ctx, X, head, scratch, nb, cfg, d, true);
  encodeHcRead(ctx, X, scratch.coeffs, hidden, nb, cfg.streams, d, { w: finalNorm, eps });
}

/** logits[r] = W x[r] for the LM head (or the tied embedding) in any stored dtype. */
export function encodeLogits(ctx: EncodeContext, lmHead: TensorRef, x: ProjectionInput, logits: RowsRef, nb: number): void {
  encodeProjection(ctx, lmHead, x, logits, nb);
}

/** ids[r] = argmax of logits[r] (ties: lowest id), margin[r] = top1 - top2 (0 on a tie). */
export function encodeArgmax(ctx: EncodeContext, logits: RowsRef, ids: Binding, margin: Binding, nb: number, vocab: number): void {
  checkRows(nb, "argmax");
  if (!Number.isInteger(vocab) || vocab < 1) throw new Error(`argmax: vocab ${vocab} must be a positive integer`);
  // A simdgroup per row for small vocabularies, 8 of them for large ones.
  const threads = vocab <= 4096 ? SIMD_WIDTH : 8 * SIMD_WIDTH;
  dispatch(
    ctx,
    "argmax_f32",
    Params.Argmax,
    { rows: nb, cols: vocab, x_stride: logits.stride },
    [bind(logits.buffer, logits.offset), ids, margin],
    nb,
    threads,
  );
}
