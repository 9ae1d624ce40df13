// Trunk row-batch execution (the seed's "decode"): one command buffer records a step of nb
// rows at positions pos0.. (a prefill chunk, a decode row, or a verify batch): the
// embedding, then per layer the PLE injection, the mixer between its hyper-connection read
// and write, and the MoE site with the host handshake between its router and its experts,
// then the final read and the logits and greedy argmax of the rows the step asks for (a
// prompt chunk: its last row or none; a verify batch: every row).
import { encodeEmbed } from "./embed.ts";
import { bind, live, type EncodeContext, type RowsRef } from "./dispatch.ts";
import type { RowRange } from "../api/backend.ts";
import type { SitePlan } from "./handshake.ts";
import { hcFold, hcFolds, siteWrite, type HcSiteRefs } from "./hyperconnection.ts";
import { deferSiteRead, encodeReadApart, encodeSiteProjections, type PlainRead } from "./site-read.ts";
import type { EngineGpu } from "./load.ts";
import { encodeAttentionMixer, encodeDeltaNetMixer } from "./mixers.ts";
import { encodeLookaheadRoute, encodeMoeCompute, encodeMoeRoute, type MoeSiteArgs } from "./moe-site.ts";
import { encodePleLayer } from "./ple-layer.ts";
import type { LayerRefs } from "./refs.ts";
import { LOGIT_ROWS, rowAt } from "./scratch.ts";
import type { SequenceState } from "./state.ts";
import { encodeArgmax, encodeFinalRead, encodeLogits } from "./sampling.ts";

export interface TrunkStep {
  nb: number;
  // Position-dependent dispatches take pos0 from the step passed to live() (recorded-step.ts).
  /** Position of row 0 (the sequence's length before the step); tokens are already in the token buffer. */
  pos0: number;
  /** A verify batch: snapshot the per-row state for rollback. */
  verify: boolean;
  /** Rows (of the step) whose logits and argmax to compute: ids and margins land in scratch.head from row 0. */
  logits: RowRange;
}

/** The MoE site arguments of trunk layer `w`. */
export function trunkMoeSite(gpu: EngineGpu, w: LayerRefs, nb: number): MoeSiteArgs {
  return {
    config: gpu.config,
    X: gpu.scratch.X,
    site: w.hcMoe,
    hc: gpu.hc,
    norm: w.moeNorm,
    moe: w.moe,
    scratch: gpu.scratch,
    nb,
    expertDType: gpu.expertDType,
  };
}

/**
 * Records a trunk step; its handshakes go into `plan`. The next ids and margins of rows
 * logits.from.. land in scratch.head.next/margins rows 0..logits.count - 1.
 */
export function encodeTrunkStep(ctx: EncodeContext, gpu: EngineGpu, seq: SequenceState, step: TrunkStep, plan: SitePlan): void {
  const c = gpu.config;
  const s = gpu.scratch;
  const { nb, pos0 } = step;
  const d = c.hidden_size;
  const eps = c.rms_norm_eps;
  const snaps = step.verify ? gpu.snapshots : null;
  if (step.verify && !snaps) throw new Error("verify step: this engine has no rollback planes (the model has no MTP head)");
  if (nb > s.rows) throw new RangeError(`step of ${nb} rows: the scratch holds ${s.rows}`);
  const logits = step.logits;
  if (!Number.isInteger(logits.from) || !Number.isInteger(logits.count) || logits.from < 0 || logits.count < 0 || logits.from + logits.count > nb)
    throw new RangeError(`step of ${nb} rows: logits for rows ${logits.from}..${logits.from + logits.count - 1} are outside it`);

  // With the whole model resident no trunk read can miss: the lookahead's routes would only
  // cost dispatches (four a layer) and host work.
  const lookahead = gpu.lookahead && !gpu.pool.fullyResident(gpu.layersRun);
  // Each write into the streams folds the next site's raw products where it can (hc-fold.ts):
  // every site but the first and those after a PLE injection, and the final read; not in a
  // step large enough for the GEMM.
  const fold = hcFolds(gpu.hc, d, nb, gpu.device.backend);
  const foldInto = (site: HcSiteRefs | null, head = false) => (fold && site ? hcFold(site, s.hcFold, gpu.hc, d, head) : undefined);
  let folded: RowsRef | undefined;
  live(ctx, step, (ctx, { pos0 }) => encodeEmbed(ctx, gpu.refs.embed, bind(seq.tokens, pos0 * 4), s.X, nb, c.hc.streams));
  for (let l = 0; l < gpu.layersRun; l++) {
    const w = gpu.refs.layers[l]!;
    if (w.ple) {
      const planes = snaps?.ple[l];
      encodePleLayer(ctx, {
        config: c,
        w: w.ple,
        history: seq.ple[l]!,
        scratch: s,
        nb,
        pos0,
        tokens: seq.tokens,
        X: s.X,
        snapshots: planes ? { planes, rows: nb } : undefined,
      });
      folded = undefined;  // the injection wrote the streams
    }
    // The mixer's input projections encode the read (site-read.ts: fused into them where they
    // can take it, which needs the partials a folded write left).
    const read = deferSiteRead(ctx, s.X, w.hcMixer, s.hc, s.xn, nb, gpu.hc, d, { w: w.mixerNorm, eps }, folded);
    const x = s.xn;
    // The mixer's output projection does the site's write (fused where it can).
    const write = siteWrite(s.X, w.hcMixer, s.hc, gpu.hc, d, foldInto(w.hcMoe));
    switch (w.type) {
      case "deltanet": {
        const planes = snaps?.deltanet[l];
        encodeDeltaNetMixer(ctx, {
          config: c,
          w: w.deltanet!,
          state: seq.deltanet[l]!,
          scratch: s,
          nb,
          x,
          read,
          y: s.y,
          write,
          snapshots: planes ? { S: planes.S, conv: planes.conv, rows: nb } : undefined,
        });
        break;
      }
      case "attention":
        encodeAttentionMixer(ctx, { config: c, w: w.attention!, state: seq.attention[l]!, scratch: s, nb, pos0, x, read, y: s.y, write });
        break;
    }

    const next = gpu.refs.layers[l + 1];
    const site = {
      ...trunkMoeSite(gpu, w, nb),
      folded: write.fold?.raw,
      fold: l + 1 < gpu.layersRun ? (next!.ple ? undefined : foldInto(next!.hcMixer)) : foldInto(gpu.refs.hcHead, true),
    };
    folded = site.fold?.raw;
    const route = plan.open(gpu, l, nb);
    encodeMoeRoute(ctx, site, gpu.kernelPool, route);
    let predicts: number | null = null;
    // A resident site has no host step to prefetch at; a resident next layer cannot miss.
    if (lookahead && !route.resident && l + 1 < gpu.layersRun && !plan.wouldBeResident(gpu, l + 1)) {
      encodeLookaheadRoute(ctx, trunkMoeSite(gpu, gpu.refs.layers[l + 1]!, nb));
      predicts = l + 1;
    }
    plan.encode(ctx, { layer: l, rows: nb, predicts, trunkLayer: l });
    encodeMoeCompute(ctx, site, gpu.kernelPool, route);
  }

  // Every final hidden row goes where the MTP head will read it (by position); without an MTP
  // head only the rows with logits are read, into scratch. (Position-dependent: live.)
  const headFolded = folded;
  live(ctx, step, (ctx, { pos0 }) => {
    let hidden: RowsRef;
    if (seq.hidden) {
      const all: RowsRef = { buffer: seq.hidden, offset: pos0 * d * 4, stride: d * 4 };
      encodeFinalRead(ctx, s.X, gpu.refs.hcHead, s.hc, all, nb, gpu.hc, d, gpu.refs.finalNorm, eps, headFolded);
      hidden = rowAt(all, logits.from);
    } else {
      hidden = s.head.hidden;
      if (logits.count > 0)
        encodeFinalRead(ctx, rowAt(s.X, logits.from), gpu.refs.hcHead, s.hc, hidden, logits.count, gpu.hc, d, gpu.refs.finalNorm, eps, headFolded && rowAt(headFolded, logits.from));
    }
    if (logits.count > 0) encodeGreedy(ctx, gpu, hidden, logits.count, s.head.next, s.head.margins);
  });
}

/**
 * Logits and argmax of nb hidden rows, LOGIT_ROWS rows at a time (the logits scratch holds
 * that many): ids[r] and margins[r] for r < nb (packed i32 / f32 regions). With `read` (one
 * row; read.xn is `hidden`), the hidden row is that plain residual's norm, which a q4 LM head's
 * dispatch forms itself where it can (site-read.ts: sixteen q4 tiles a threadgroup, each
 * threadgroup forming the norm of d columns); otherwise rms_norm_f32 first.
 */
export function encodeGreedy(ctx: EncodeContext, gpu: EngineGpu, hidden: RowsRef, nb: number, ids: RowsRef, margins: RowsRef, read?: PlainRead): void {
  const s = gpu.scratch;
  const lm = gpu.refs.lmHead;
  const vocab = gpu.config.vocab_size;
  if (read && (nb !== 1 || read.xn.buffer !== hidden.buffer || read.xn.offset !== hidden.offset)) throw new Error(`greedy: a read serves one row, into the hidden row (${nb} rows)`);
  for (let r0 = 0; r0 < nb; r0 += LOGIT_ROWS) {
    const rows = Math.min(LOGIT_ROWS, nb - r0);
    if (read && lm.dtype === "q4") encodeSiteProjections(ctx, [{ w: lm, y: s.head.logits }], read, hidden, 1);
    else {
      // (a bf16 head would take a threadgroup per MV_R rows, each forming the norm: apart)
      if (read) encodeReadApart(ctx, read, 1);
      encodeLogits(ctx, lm, rowAt(hidden, r0), s.head.logits, rows);
    }
    encodeArgmax(ctx, s.head.logits, bind(ids.buffer, ids.offset + r0 * 4), bind(margins.buffer, margins.offset + r0 * 4), rows, vocab);
  }
}
