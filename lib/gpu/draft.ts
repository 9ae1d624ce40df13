// MTP draft-head execution (the seed's "mtp": folded and chained inputs), encoded before the
// verify step in the speculative cycle's command buffer (engine.ts). First the catch-up rows,
// MTP entry p = (trunk hidden p, token p + 1) for every trunk row the head has not seen (read
// by position from the sequence's hidden and token buffers), in chunks of the scratch's rows;
// the argmax of the last one is draft 1. Then each chained row feeds (its predecessor's
// output, the previous draft) back in, draft ids staying on the GPU; last, the drafts are
// copied into the token buffer, where the verify step reads them.
// Every MTP row is an attention + MoE layer (expert layer num_layers): a handshake unless the
// layer is held resident.
import { encodeAttentionMixer } from "./mixers.ts";
import { encodeGreedy } from "./decode.ts";
import type { Binding } from "../shim.ts";
import { bind, dispatch, live, shiftedLive, type EncodeContext, type RowsRef } from "./dispatch.ts";
import type { SitePlan } from "./handshake.ts";
import type { EngineGpu } from "./load.ts";
import { encodeMoeCompute, encodeMoeRoute, type MoeSiteArgs } from "./moe-site.ts";
import { encodeMtpInput } from "./mtp.ts";
import { encodeMatvec } from "./projections.ts";
import { Params } from "./params.ts";
import { rowAt } from "./scratch.ts";
import { plainRead } from "./site-read.ts";
import type { SequenceState } from "./state.ts";
import type { StepVars } from "./tape.ts";

/** A draft step's shape (its recording's key): catch-up rows and chained drafts. */
export interface DraftShape {
  /** Trunk rows the MTP head catches up on (MTP positions vars.pos0 .. vars.pos0 + rows - 1). */
  rows: number;
  /** Drafts to propose (>= 1). */
  drafts: number;
}

/** Where an MTP row block reads its input: by position (catch-up rows), or a fixed region (chained rows). */
type MtpInput = { byPosition: true } | { byPosition: false; hidden: RowsRef; ids: Binding };

/**
 * Runs MTP rows (hidden rows, token ids) at MTP positions vars.pos0.., appending to the MTP
 * cache. With `draftTo`, the last row's output RMSNorm(x, mtp.norm) lands in its row of
 * scratch.mtp.out and its argmax there (or vars.draw's draw over it). Inside shiftedLive:
 * every position comes from vars (recorded-step.ts).
 */
function encodeMtpRows(
  ctx: EncodeContext,
  gpu: EngineGpu,
  seq: SequenceState,
  plan: SitePlan,
  nb: number,
  vars: StepVars,
  input: MtpInput,
  draftTo: { id: RowsRef; margin: RowsRef; j: number } | null,
): void {
  const c = gpu.config;
  const w = gpu.refs.mtp!;
  const s = gpu.scratch;
  const d = c.hidden_size;
  const eps = c.rms_norm_eps;
  const norms = { embedNorm: w.embedNorm, hiddenNorm: w.hiddenNorm };
  if (input.byPosition) {
    // Entry p pairs trunk hidden p with token p + 1.
    live(ctx, vars, (ctx, { pos0 }) =>
      encodeMtpInput(ctx, gpu.refs.embed, bind(seq.tokens, (pos0 + 1) * 4), { buffer: seq.hidden!, offset: pos0 * d * 4, stride: d * 4 }, norms, s.mtp.fuse, nb, eps),
    );
  } else encodeMtpInput(ctx, gpu.refs.embed, input.ids, input.hidden, norms, s.mtp.fuse, nb, eps);
  encodeMatvec(ctx, w.fc, s.mtp.fuse, s.mtp.X, nb);

  // Attention with a plain residual (n = 1). Its norm is formed by the q/gate/k/v projections'
  // dispatch where they take it (one row: site-read.ts), else rms_norm_f32 before them; in
  // any form they like (the head's rows only propose: no batch must repeat their bits).
  const read = plainRead(s.mtp.X, s.xn, d, { w: w.mixerNorm, eps }, true);
  const at = w.attention;
  // Its o projection adds its output to the residual (X += y, fused into the matvec).
  const write = { X: s.mtp.X, coeffs: null, streams: 1, d };
  encodeAttentionMixer(ctx, { config: c, w: at, state: { ...seq.mtp!, ik: null }, scratch: s, nb, pos0: vars.pos0, x: s.xn, read, y: s.y, write });

  // Only the last catch-up row's output feeds a draft: the rows before it are run for their
  // K/V (appended above). Its MoE and norm run for it alone (a single row's path, and its
  // experts only); an earlier chunk of a long catch-up stops here.
  if (!draftTo) return;
  const last = nb - 1;
  const X = rowAt(s.mtp.X, last);
  const site: MoeSiteArgs = {
    config: c,
    X,
    site: null,
    hc: { ...gpu.hc, streams: 1 },
    norm: w.moeNorm,
    moe: w.moe,
    scratch: s,
    nb: 1,
    expertDType: gpu.expertDType,
  };
  const route = plan.open(gpu, c.num_layers, 1);
  encodeMoeRoute(ctx, site, gpu.kernelPool, route);
  plan.encode(ctx, { layer: c.num_layers, rows: 1, predicts: null, trunkLayer: null });
  encodeMoeCompute(ctx, site, gpu.kernelPool, route);

  // The output norm, formed by the LM head's dispatch where it takes it (encodeGreedy), also
  // stored to its row of mtp.out (a chained row's input).
  const out = rowAt(s.mtp.out, last);
  encodeGreedy(ctx, gpu, out, 1, draftTo.id, draftTo.margin, plainRead(X, out, d, { w: w.norm, eps }, true));
  // Sampling: the draft is drawn from the logits row just computed, over the argmax.
  const j = draftTo.j;
  live(ctx, vars, (ctx, v) => v.draw?.(ctx, j));
}

/** The MTP rows of trunk rows vars.pos0 .. + rows - 1 in chunks of the scratch's rows; the last one drafts to `draftTo` when given. */
function encodeCatchUpRows(
  ctx: EncodeContext,
  gpu: EngineGpu,
  seq: SequenceState,
  plan: SitePlan,
  vars: StepVars,
  rows: number,
  draftTo: { id: RowsRef; margin: RowsRef; j: number } | null,
): void {
  const chunk = gpu.scratch.rows;
  for (let o = 0; o < rows; o += chunk) {
    const nb = Math.min(chunk, rows - o);
    const last = o + nb === rows;
    shiftedLive(ctx, o, () => encodeMtpRows(ctx, gpu, seq, plan, nb, { ...vars, pos0: vars.pos0 + o }, { byPosition: true }, last ? draftTo : null));
  }
}

/**
 * Encodes the MTP head's catch-up of trunk rows vars.pos0 .. vars.pos0 + rows - 1 alone, without
 * drafting (their K/V appended to the MTP cache): a speculative cycle after many plain steps
 * runs the long part of its catch-up this way first, so the cycle itself keeps a recorded shape
 * (engine.ts catchUpMtp). Each entry reads its token (trunk row + 1) from the token buffer.
 */
export function encodeMtpCatchUp(ctx: EncodeContext, gpu: EngineGpu, seq: SequenceState, plan: SitePlan, vars: StepVars, rows: number): void {
  if (!gpu.refs.mtp || !seq.mtp || !seq.hidden) throw new Error("this model has no MTP head (config.mtp is null)");
  if (!Number.isInteger(rows) || rows < 1) throw new Error(`MTP catch-up: ${rows} rows at MTP position ${vars.pos0}`);
  encodeCatchUpRows(ctx, gpu, seq, plan, vars, rows, null);
}

/**
 * Encodes the catch-up of trunk rows vars.pos0 .. vars.pos0 + shape.rows - 1 (the MTP head's
 * length .. the trunk's) and `shape.drafts` chained drafts into scratch.mtp.drafts, then copies
 * the drafts into the token buffer after the newest token (positions vars.pos0 + rows + 1 ..),
 * where a verify step encoded after it in the same command buffer reads them. The token at
 * position vars.pos0 + rows (the newest, not yet run) must be in the token buffer. Afterwards
 * the caller sets mtpLength to the trunk length (chained rows are dropped). `vars.draw(ctx, j)`,
 * when given, replaces draft j's argmax with a draw from its logits row. Every position comes
 * from vars (live): a step of one shape is recorded once and replayed (engine.ts).
 */
export function encodeDrafts(ctx: EncodeContext, gpu: EngineGpu, seq: SequenceState, plan: SitePlan, vars: StepVars, shape: DraftShape): void {
  if (!gpu.refs.mtp || !seq.mtp || !seq.hidden) throw new Error("this model has no MTP head (config.mtp is null)");
  const s = gpu.scratch;
  const { rows, drafts } = shape;
  if (!Number.isInteger(rows) || rows < 1) throw new Error(`drafts: no trunk rows to draft from (${rows} catch-up rows at MTP position ${vars.pos0})`);
  if (!Number.isInteger(drafts) || drafts < 1) throw new RangeError(`drafts: ${drafts} must be >= 1`);
  const draftRef = (j: number) => ({
    id: { buffer: s.mtp.drafts.buffer, offset: s.mtp.drafts.offset + 4 * j, stride: 4 },
    margin: { buffer: s.mtp.draftMargins.buffer, offset: s.mtp.draftMargins.offset + 4 * j, stride: 4 },
    j,
  });
  const at = (delta: number): StepVars => ({ ...vars, pos0: vars.pos0 + delta });
  encodeCatchUpRows(ctx, gpu, seq, plan, vars, rows, draftRef(0));
  for (let j = 1; j < drafts; j++) {
    // The previous MTP row's output is row 0 (chained rows are single rows) or the catch-up's last row.
    const prevRow = j === 1 ? (rows - 1) % s.rows : 0;
    const prev = draftRef(j - 1);
    const input: MtpInput = { byPosition: false, hidden: rowAt(s.mtp.out, prevRow), ids: bind(prev.id.buffer, prev.id.offset) };
    shiftedLive(ctx, rows + j - 1, () => encodeMtpRows(ctx, gpu, seq, plan, 1, at(rows + j - 1), input, draftRef(j)));
  }
  live(ctx, vars, (ctx, { pos0 }) => encodeCopyWords(ctx, bind(s.mtp.drafts.buffer, s.mtp.drafts.offset), bind(seq.tokens, (pos0 + rows + 1) * 4), drafts));
}

/**
 * Copies n 32-bit words (the draft ids into the token buffer) with the snapshot-restore
 * kernel: a plain load and store per element, no arithmetic, so integer bit patterns pass
 * through its float type unchanged.
 */
function encodeCopyWords(ctx: EncodeContext, src: Binding, dst: Binding, n: number): void {
  dispatch(ctx, "snapshot_restore_f32", Params.SnapshotRestore, { n0: n, n1: 0 }, [src, dst, src, dst], Math.ceil(n / 32), 32);
}
