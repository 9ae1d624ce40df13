// RMSNorm over row batches (kernels/norm.metal): whole rows or heads within a row, with
// the zero-centred weight (1 + w, MODEL.md's default) or the plain one, and DeltaNet's
// gated form o * rsqrt(mean(o^2) + eps) * w * SiLU(z) per head.
import type { Binding } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { Params } from "./params.ts";
import { checkRows, checkVector } from "./projections.ts";
import { SIMD_WIDTH } from "./limits.ts";

/** Vectors (simdgroups) per threadgroup in kernels/norm.metal. */
const NORM_SG = 4;

export interface RmsNormOptions {
  /** Scale by (1 + w) (default, zero-centred) or by w (false: "plain w"). */
  centred?: boolean;
  /** Vectors per row, each of `dim` values, normalised separately with the same weight (default 1). */
  heads?: number;
  /**
   * A bias added to every row before the norm (heads x dim values: y = RMSNorm(x + b)), in
   * the same dispatch (rms_norm_bias_f32; the bits of ew_add_f32 then rms_norm_f32).
   */
  bias?: TensorRef;
}

function encodeNorm(
  ctx: EncodeContext,
  kernel: string,
  x: RowsRef,
  w: TensorRef,
  y: RowsRef,
  z: RowsRef | null,
  nb: number,
  heads: number,
  dim: number,
  eps: number,
  centred: boolean,
): void {
  checkRows(nb, kernel);
  if (!Number.isInteger(heads) || heads < 1 || !Number.isInteger(dim) || dim < 1)
    throw new Error(`${kernel}: heads ${heads} and dim ${dim} must be positive integers`);
  checkVector(w, dim, kernel);
  const buffers: Binding[] = [bind(x.buffer, x.offset), bind(w.buffer, w.offset), bind(y.buffer, y.offset)];
  if (z) buffers.push(bind(z.buffer, z.offset));
  dispatch(
    ctx,
    kernel,
    Params.RmsNorm,
    { rows: nb, heads, dim, centred: centred ? 1 : 0, eps, x_stride: x.stride, y_stride: y.stride, z_stride: z?.stride ?? 0 },
    buffers,
    Math.ceil((nb * heads) / NORM_SG),
    SIMD_WIDTH * NORM_SG,
  );
}

/**
 * y = RMSNorm(x, w) over nb rows; with `heads`, each row is heads vectors of dim = w's
 * length (q_norm, k_norm). y may be x.
 */
export function encodeRmsNorm(ctx: EncodeContext, x: RowsRef, w: TensorRef, y: RowsRef, nb: number, eps: number, opts: RmsNormOptions = {}): void {
  const dim = w.shape.reduce((a, b) => a * b, 1);
  const heads = opts.heads ?? 1;
  if (opts.bias) {
    checkVector(opts.bias, heads * dim, "rms_norm_bias_f32");
    const bias = { buffer: opts.bias.buffer, offset: opts.bias.offset, stride: 0 };
    encodeNorm(ctx, "rms_norm_bias_f32", x, w, y, bias, nb, heads, dim, eps, opts.centred ?? true);
    return;
  }
  encodeNorm(ctx, "rms_norm_f32", x, w, y, null, nb, heads, dim, eps, opts.centred ?? true);
}

/** y = o * rsqrt(mean(o^2) + eps) * w * SiLU(z) per head of dim = w's length (plain w). y may be o. */
export function encodeRmsNormGated(
  ctx: EncodeContext,
  o: RowsRef,
  z: RowsRef,
  w: TensorRef,
  y: RowsRef,
  nb: number,
  heads: number,
  eps: number,
): void {
  const dim = w.shape.reduce((a, b) => a * b, 1);
  encodeNorm(ctx, "rms_norm_gated_f32", o, w, y, z, nb, heads, dim, eps, false);
}
