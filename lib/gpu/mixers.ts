// The two mixers of a layer (MODEL.md "Mixer A/B") as dispatch sequences over a step's rows:
// gated DeltaNet (projections, conv + SiLU, the recurrence, gated RMSNorm, out) and gated
// attention (projections, per-head norms + RoPE + K/V appends in one dispatch, QSA,
// attention with the sigmoid gate applied as it writes o, out). Input: the site's
// normalised read; output: y [nb][d], or with `write` the site's write of y done by the
// output projection itself (y then unwritten).
import type { ModelConfig } from "../model/config.ts";
import { attnPrepFits, attnPrepTakesIk, encodeAttention, encodeAttnPrep, encodeKvAppend, encodeQsa, encodeRope } from "./attention.ts";
import { deltanetFuses, encodeDeltaNetBlock } from "./deltanet.ts";
import { bind, live, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { encodeRmsNorm } from "./norms.ts";
import { encodeProjectionWrite, type SiteWrite } from "./hyperconnection.ts";
import { encodeMatvec, encodeMatvecs } from "./projections.ts";
import { encodeSiteProjections, type SiteRead } from "./site-read.ts";
import type { AttentionRefs, DeltaNetRefs } from "./refs.ts";
import type { Scratch } from "./scratch.ts";
import type { AttentionLayerState, DeltaNetLayerState } from "./state.ts";
import type { SnapshotPlanes } from "./snapshots.ts";


export interface DeltaNetMixerArgs {
  config: ModelConfig;
  w: DeltaNetRefs;
  state: DeltaNetLayerState;
  scratch: Scratch;
  nb: number;
  x: RowsRef;
  y: RowsRef;
  /** The site read that x is (into x), encoded with the input projections (site-read.ts); undefined: x is already there. */
  read?: SiteRead;
  /** The site's write of y, done by the out projection (encodeProjectionWrite). */
  write?: SiteWrite;
  /** Verify batches: store S and the conv window after each of the first `rows` rows. */
  snapshots?: { S: SnapshotPlanes; conv: SnapshotPlanes; rows: number };
}

export function encodeDeltaNetMixer(ctx: EncodeContext, a: DeltaNetMixerArgs): void {
  const { config: c, w, nb } = a;
  const dn = c.deltanet;
  const s = a.scratch.dn;
  const qkv = { w: w.qkv, y: s.qkv };
  // A decode row's qkv projection may run the conv in its epilogue (kernels/conv.h): not with
  // snapshot rows (verify batches) or the fused DeltaNet kernels, which form the conv themselves.
  const conv = nb === 1 && !a.snapshots && !deltanetFuses(nb, dn.key_dim) ? { of: qkv, weight: w.conv, state: a.state.conv, y: s.conv } : undefined;
  const convDone = encodeSiteProjections(ctx, [qkv, { w: w.z, y: s.z }, { w: w.b, y: s.b }, { w: w.a, y: s.a }], a.read, a.x, nb, conv);
  encodeDeltaNetBlock(ctx, {
    convDone,
    rows: nb,
    keyHeads: dn.key_heads,
    keyDim: dn.key_dim,
    valueHeads: dn.value_heads,
    valueDim: dn.value_dim,
    x: s.qkv,
    convWeight: w.conv,
    convState: a.state.conv,
    convOut: s.conv,
    b: s.b,
    a: s.a,
    aLog: w.aLog,
    dtBias: w.dtBias,
    state: a.state.S,
    z: s.z,
    normWeight: w.norm,
    eps: c.rms_norm_eps,
    o: s.o,
    snapshots: a.snapshots,
    work: s.work,
  });
  encodeOut(ctx, w.out, s.o, a, nb);
}

export interface AttentionMixerArgs {
  config: ModelConfig;
  w: AttentionRefs;
  state: AttentionLayerState;
  scratch: Scratch;
  nb: number;
  /** Position of row 0. */
  pos0: number;
  x: RowsRef;
  y: RowsRef;
  /** The site read that x is (into x), encoded with the input projections (site-read.ts); undefined: x is already there. */
  read?: SiteRead;
  /** The site's write of y, done by the o projection (encodeProjectionWrite). */
  write?: SiteWrite;
}

export function encodeAttentionMixer(ctx: EncodeContext, a: AttentionMixerArgs): void {
  const { config: c, w, nb } = a;
  const at = c.attention;
  const s = a.scratch.attn;
  const eps = c.rms_norm_eps;
  encodeSiteProjections(ctx, [{ w: w.q, y: s.q }, { w: w.gate, y: s.gate }, { w: w.k, y: s.k }, { w: w.v, y: s.v }], a.read, a.x, nb);
  // q/k norms, RoPE and the K/V appends: one dispatch (attn_prep) where the caches allow it.
  const fused = attnPrepFits(a.state.k, a.state.v);
  if (!fused) {
    encodeRmsNorm(ctx, s.q, w.qNorm, s.q, nb, eps, { heads: at.heads });
    encodeRmsNorm(ctx, s.k, w.kNorm, s.k, nb, eps, { heads: at.kv_heads });
  }
  const rotDim = Math.round(at.head_dim * at.partial_rotary_factor);
  const qsa = w.qsa && at.qsa;
  // QSA's index projections do not depend on the position: outside live(), a replay does
  // not encode them again (they read x only, so they may go ahead of the appends).
  // The index key's norm and append ride in attn_prep where its cache allows it (then it is
  // normed in place in ikRaw); else its own norm here and append below.
  const prepIk = fused && w.qsa && a.state.ik && attnPrepTakesIk(a.state.k, a.state.ik) ? { x: s.ikRaw, norm: w.qsa.ikNorm, cache: a.state.ik } : undefined;
  if (w.qsa && at.qsa && a.state.ik) {
    encodeMatvecs(ctx, [{ w: w.qsa.iq, y: s.iq }, { w: w.qsa.ik, y: s.ikRaw }, { w: w.qsa.iw, y: s.iw }], a.x, nb);
    if (!prepIk) encodeRmsNorm(ctx, s.ikRaw, w.qsa.ikNorm, s.ik, nb, eps);
  }
  // Everything that depends on the position (RoPE, the cache appends, QSA's scores, the
  // attention's length and splits) takes it from live()'s vars: recorded-step.ts.
  live(ctx, a, (ctx, { pos0 }) => {
    if (fused) {
      const { k, v } = a.state;
      encodeAttnPrep(ctx, { rows: nb, pos0, rotDim, theta: at.rope_theta, eps, q: s.q, qHeads: at.heads, k: s.k, v: s.v, qNorm: w.qNorm, kNorm: w.kNorm, kCache: k, vCache: v, ik: prepIk });
    } else {
      encodeRope(ctx, { rows: nb, pos0, headDim: at.head_dim, rotDim, theta: at.rope_theta, q: s.q, qHeads: at.heads, k: s.k, kHeads: at.kv_heads });
      encodeKvAppend(ctx, { rows: nb, pos0, x: s.k, cache: a.state.k });
      encodeKvAppend(ctx, { rows: nb, pos0, x: s.v, cache: a.state.v });
    }
    let selection: { list: ReturnType<typeof bind>; counts: ReturnType<typeof bind>; topk: number } | undefined;
    if (w.qsa && at.qsa && a.state.ik) {
      const q = at.qsa;
      if (!prepIk) encodeKvAppend(ctx, { rows: nb, pos0, x: s.ik, cache: a.state.ik });
      const scoreStride = Math.ceil(((pos0 + nb) * 4) / 16) * 16;
      if (scoreStride * nb > s.scores.bytes) throw new RangeError(`qsa: ${nb} rows at position ${pos0} need ${scoreStride * nb} bytes of score scratch, ${s.scores.bytes} allocated`);
      const list = bind(s.selected.buffer, s.selected.offset);
      const counts = bind(s.counts.buffer, s.counts.offset);
      encodeQsa(ctx, {
        rows: nb,
        pos0,
        topk: q.topk,
        heads: q.heads,
        iq: s.iq,
        iw: s.iw,
        ik: a.state.ik,
        scores: { buffer: s.scores.buffer, offset: s.scores.offset, stride: scoreStride },
        selected: list,
        counts,
      });
      selection = { list, counts, topk: q.topk };
    } else if (qsa) {
      throw new Error("attention: QSA weights without an index-key cache");
    }
    encodeAttention(ctx, {
      rows: nb,
      pos0,
      heads: at.heads,
      q: s.q,
      k: a.state.k,
      v: a.state.v,
      selection,
      o: s.o,
      partials: bind(s.partials.buffer, s.partials.offset),
      gate: s.gate, // o = attention * sigmoid(gate) as o is written
    });
  });
  encodeOut(ctx, w.o, s.o, a, nb);
}

/** A mixer's output projection: into y, or with the mixer's `write` into the streams. */
function encodeOut(ctx: EncodeContext, w: TensorRef, o: RowsRef, a: { y: RowsRef; write?: SiteWrite }, nb: number): void {
  if (a.write) encodeProjectionWrite(ctx, w, o, a.y, nb, a.write);
  else encodeMatvec(ctx, w, o, a.y, nb);
}
