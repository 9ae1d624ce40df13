// MTP draft-head execution (the seed's "mtp": folded and chained inputs). One command buffer:
// first the catch-up rows, MTP entry p = (trunk hidden p, token p + 1) for every trunk row the
// head has not seen (read by position from the sequence's hidden and token buffers), in
// chunks of the scratch's rows; the argmax of the last one is draft 1. Then each chained row
// feeds (its predecessor's output, the previous draft) back in, draft ids staying on the GPU.
// Every MTP row is an attention + MoE layer (expert layer num_layers) with its own handshake.
import { encodeAttentionMixer } from "./mixers.ts";
import { encodeGreedy } from "./decode.ts";
import type { Binding } from "../shim.ts";
import { bind, type EncodeContext, type RowsRef } from "./dispatch.ts";
import type { SitePlan } from "./handshake.ts";
import type { EngineGpu } from "./load.ts";
import { encodeMoeCompute, encodeMoeRoute, type MoeSiteArgs } from "./moe-site.ts";
import { encodeMtpInput } from "./mtp.ts";
import { encodeRmsNorm } from "./norms.ts";
import { encodeMatvec } from "./projections.ts";
import { rowAt } from "./scratch.ts";
import type { SequenceState } from "./state.ts";

export interface DraftPlan {
  /** Drafts to propose (>= 1). */
  drafts: number;
}

/**
 * Runs MTP rows (hidden rows, token ids) at MTP positions mtpPos.., appending to the MTP cache;
 * the output RMSNorm(x, mtp.norm) of every row lands in scratch.mtp.out. With `draftTo`, the
 * last row's argmax is written there.
 */
function encodeMtpRows(
  ctx: EncodeContext,
  gpu: EngineGpu,
  seq: SequenceState,
  plan: SitePlan,
  nb: number,
  mtpPos: number,
  hidden: RowsRef,
  ids: Binding,
  draftTo: { id: RowsRef; margin: RowsRef; draw?: (ctx: EncodeContext) => void } | null,
): void {
  const c = gpu.config;
  const w = gpu.refs.mtp!;
  const s = gpu.scratch;
  const d = c.hidden_size;
  const eps = c.rms_norm_eps;
  encodeMtpInput(ctx, gpu.refs.embed, ids, hidden, { embedNorm: w.embedNorm, hiddenNorm: w.hiddenNorm }, s.mtp.fuse, nb, eps);
  encodeMatvec(ctx, w.fc, s.mtp.fuse, s.mtp.X, nb);

  // Attention with a plain residual (n = 1).
  encodeRmsNorm(ctx, s.mtp.X, w.mixerNorm, s.xn, nb, eps);
  const at = w.attention;
  // Its o projection adds its output to the residual (X += y, fused into the matvec).
  const write = { X: s.mtp.X, coeffs: null, streams: 1, d };
  encodeAttentionMixer(ctx, { config: c, w: at, state: { ...seq.mtp!, ik: null }, scratch: s, nb, pos0: mtpPos, x: s.xn, y: s.y, write });

  const site: MoeSiteArgs = {
    config: c,
    X: s.mtp.X,
    site: null,
    hc: { ...gpu.hc, streams: 1 },
    norm: w.moeNorm,
    moe: w.moe,
    scratch: s,
    nb,
    expertDType: gpu.expertDType,
  };
  const route = plan.open(gpu, c.num_layers, nb);
  encodeMoeRoute(ctx, site, gpu.kernelPool, route);
  plan.encode(ctx, { layer: c.num_layers, rows: nb, predicts: null, trunkLayer: null });
  encodeMoeCompute(ctx, site, gpu.kernelPool, route);

  encodeRmsNorm(ctx, s.mtp.X, w.norm, s.mtp.out, nb, eps);
  if (draftTo) {
    encodeGreedy(ctx, gpu, rowAt(s.mtp.out, nb - 1), 1, draftTo.id, draftTo.margin);
    // Sampling: the draft is drawn from the logits row just computed, over the argmax.
    draftTo.draw?.(ctx);
  }
}

/**
 * Records the catch-up of trunk rows mtpLength..length-1 and `drafts` chained drafts into
 * scratch.mtp.drafts. The token at position `length` (the newest, not yet run) must be in the
 * token buffer. Afterwards the caller sets mtpLength = length (chained rows are dropped).
 * `draw(ctx, j)`, when given, replaces draft j's argmax with a draw from its logits row.
 */
export function encodeDrafts(
  ctx: EncodeContext,
  gpu: EngineGpu,
  seq: SequenceState,
  plan: SitePlan,
  drafts: number,
  draw?: (ctx: EncodeContext, j: number) => void,
): void {
  const c = gpu.config;
  if (!gpu.refs.mtp || !seq.mtp || !seq.hidden) throw new Error("this model has no MTP head (config.mtp is null)");
  const s = gpu.scratch;
  const d = c.hidden_size;
  const from = seq.mtpLength;
  const to = seq.length;
  if (to <= from) throw new Error(`drafts: no trunk rows to draft from (trunk length ${to}, MTP length ${from})`);
  if (drafts < 1) throw new RangeError(`drafts: ${drafts} must be >= 1`);
  const draftRef = (j: number): { id: RowsRef; margin: RowsRef; draw?: (ctx: EncodeContext) => void } => ({
    id: { buffer: s.mtp.drafts.buffer, offset: s.mtp.drafts.offset + 4 * j, stride: 4 },
    margin: { buffer: s.mtp.draftMargins.buffer, offset: s.mtp.draftMargins.offset + 4 * j, stride: 4 },
    ...(draw ? { draw: (c: EncodeContext) => draw(c, j) } : {}),
  });
  for (let p = from; p < to; p += s.rows) {
    const nb = Math.min(s.rows, to - p);
    const hidden: RowsRef = { buffer: seq.hidden, offset: p * d * 4, stride: d * 4 };
    encodeMtpRows(ctx, gpu, seq, plan, nb, p, hidden, bind(seq.tokens, (p + 1) * 4), p + nb === to ? draftRef(0) : null);
  }
  for (let j = 1; j < drafts; j++) {
    // The previous MTP row's output is row 0 (chained rows are single rows) or the catch-up's last row.
    const prevRow = j === 1 ? ((to - from - 1) % s.rows) : 0;
    const prev = draftRef(j - 1);
    encodeMtpRows(ctx, gpu, seq, plan, 1, to + j - 1, rowAt(s.mtp.out, prevRow), bind(prev.id.buffer, prev.id.offset), draftRef(j));
  }
}
