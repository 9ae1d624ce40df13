// The PLE injection of a layer (MODEL.md "N-gram memory") as one dispatch sequence: gather
// the n-gram rows, k = RMSNorm(W_k e + b_k), q = RMSNorm(mean of the streams), the gate,
// then the dilated conv whose output is added to every stream of X. The bias add is the norm's
// (rms_norm_bias_f32), the mean an existing kernel with a zero row stride (1/n is the same for
// every row); with n a power of two the mean is exact, as the reference's sum-then-divide is.
import type { ModelConfig } from "../model/config.ts";
import type { Binding, Buffer } from "../shim.ts";
import { bind, live, type EncodeContext, type RowsRef } from "./dispatch.ts";
import { encodeHcRead } from "./hyperconnection.ts";
import { encodeRmsNorm } from "./norms.ts";
import { encodePleConv, encodePleGate, encodePleGather } from "./ple.ts";
import { encodeMatvec } from "./projections.ts";
import type { PleRefs } from "./refs.ts";
import type { Scratch } from "./scratch.ts";
import type { SnapshotPlanes } from "./snapshots.ts";

export interface PleLayerArgs {
  config: ModelConfig;
  w: PleRefs;
  /** The layer's live conv history. */
  history: Binding;
  scratch: Scratch;
  nb: number;
  pos0: number;
  /** The sequence's tokens by position (i32), this step's included. */
  tokens: Buffer;
  /** Residual streams [nb][n][d], updated. */
  X: RowsRef;
  snapshots?: { planes: SnapshotPlanes; rows: number };
}

export function encodePleLayer(ctx: EncodeContext, a: PleLayerArgs): void {
  const { config: c, w, nb } = a;
  const p = c.ple!;
  const d = c.hidden_size;
  const n = c.hc.streams;
  const eps = c.rms_norm_eps;
  const s = a.scratch.ple;
  const maxOrder = Math.max(...p.orders);
  live(ctx, a, (ctx, { pos0 }) => {
    const history = Math.min(pos0, maxOrder - 1);
    encodePleGather(ctx, {
      rows: nb,
      pos0,
      ple: p,
      tokens: bind(a.tokens, (pos0 - history) * 4),
      history,
      tables: w.tables,
      e: s.e,
      rowIds: bind(s.rowIds.buffer, s.rowIds.offset),
    });
  });
  encodeMatvec(ctx, w.k, s.e, s.kRaw, nb);
  encodeRmsNorm(ctx, s.kRaw, w.kNorm, s.k, nb, eps, { bias: w.kBias });
  if (n === 1) encodeRmsNorm(ctx, a.X, w.qNorm, s.q, nb, eps);
  else encodeHcRead(ctx, a.X, a.scratch.meanCoeffs, s.q, nb, n, d, { w: w.qNorm, eps });
  encodeMatvec(ctx, w.v, s.e, s.vIn, nb);
  encodePleGate(ctx, { rows: nb, dim: d, eps, k: s.k, q: s.q, vIn: s.vIn, vBias: w.vBias, convNorm: w.convNorm, v: s.v, u: s.u });
  encodePleConv(ctx, {
    rows: nb,
    dim: d,
    dilation: maxOrder,
    weight: w.conv,
    u: s.u,
    v: s.v,
    history: a.history,
    x: a.X,
    streams: n,
    streamStride: d * 4,
    snapshots: a.snapshots,
  });
}
