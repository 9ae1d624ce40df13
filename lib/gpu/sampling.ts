// The end of a step (kernels/hc.metal, matvec.metal, output.metal): the final
// hyper-connection read with the final RMSNorm, the logits projection (LM head or the tied
// embedding, any stored dtype), the greedy argmax per row with its top1 - top2 margin, and
// sampling over the logits on the device (the vocab never travels to the host).
import { hasPenalties, type SamplingParams } from "../reference/sampling.ts";
import type { Binding, Buffer, Device } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { encodeHcCoefficientsRead, type HcConfig, type HcScratch, type HcSiteRefs } from "./hyperconnection.ts";
import { SIMD_WIDTH, threadsWithin } from "./limits.ts";
import { encodeRmsNorm } from "./norms.ts";
import { Params } from "./params.ts";
import { checkRows, encodeMatvec } from "./projections.ts";

/**
 * hidden[r] = RMSNorm(sum_i pre_i X[r][i], final_norm) with the head's pre (hc_head.*), or
 * RMSNorm(X[r], final_norm) with n = 1 (head null). The MTP head reads `hidden` too.
 * `folded`: the head's raw products, left by the last write (lib/gpu/hc-fold.ts).
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
  folded?: RowsRef,
): void {
  if (!head) {
    if (cfg.streams !== 1) throw new Error(`hc_head weights are required with ${cfg.streams} streams`);
    encodeRmsNorm(ctx, X, finalNorm, hidden, nb, eps);
    return;
  }
  encodeHcCoefficientsRead(ctx, X, head, scratch, hidden, nb, cfg, d, { w: finalNorm, eps }, true, folded);
}

/** logits[r] = W x[r] for the LM head (or the tied embedding) in any stored dtype. */
export function encodeLogits(ctx: EncodeContext, lmHead: TensorRef, x: RowsRef, logits: RowsRef, nb: number): void {
  encodeMatvec(ctx, lmHead, x, logits, nb);
}

/** ids[r] = argmax of logits[r] (ties: lowest id), margin[r] = top1 - top2 (0 on a tie). */
export function encodeArgmax(ctx: EncodeContext, logits: RowsRef, ids: Binding, margin: Binding, nb: number, vocab: number): void {
  checkRows(nb, "argmax");
  if (!Number.isInteger(vocab) || vocab < 1) throw new Error(`argmax: vocab ${vocab} must be a positive integer`);
  // One threadgroup reads the whole row, so it needs many loads in flight: 32 simdgroups (fewer
  // if the pipeline allows fewer), 8 for a small vocabulary on a GPU (the tiny model's 4,096
  // logits took 5.3 us on the H200 with one simdgroup walking them, a third of a cycle's MTP
  // draft in argmaxes); one simdgroup then on the CPU backend, whose threads are fibers.
  const small = vocab <= 4096;
  const threads = small && ctx.device.backend === "cpu" ? SIMD_WIDTH : threadsWithin(ctx.device.pipeline("argmax_f32"), (small ? 8 : 32) * SIMD_WIDTH);
  const vec4 = vocab % 4 === 0 && logits.offset % 16 === 0 && logits.stride % 16 === 0;
  dispatch(
    ctx,
    "argmax_f32",
    Params.Argmax,
    { rows: nb, cols: vocab, x_stride: logits.stride, vec4: vec4 ? 1 : 0 },
    [bind(logits.buffer, logits.offset), ids, margin],
    nb,
    threads,
  );
}

// ---- sampling (kernels/sampling.metal; the definition is lib/reference/sampling.ts) --------

/** Logprob alternatives the kernel can report per row. */
export const MAX_TOP_LOGPROBS = 20;

/** The sampling kernel's buffers for up to `rows` rows at once (allocated on first use). */
export class SamplingScratch {
  /** [rows][2][vocab] f32: y, then the kept weights. */
  readonly work: Buffer;
  readonly ids: Buffer;
  readonly accepted: Buffer;
  /** [rows][1 + MAX_TOP_LOGPROBS] f32 and [rows][MAX_TOP_LOGPROBS] i32. */
  readonly lp: Buffer;
  readonly lpIds: Buffer;
  /** [drafts][vocab] f32: the distribution each draft was drawn from. */
  readonly q: Buffer;
  /** Bound where a request has no counts, extras or drafts (never read then). */
  readonly none: Buffer;
  constructor(
    device: Device,
    readonly vocab: number,
    readonly rows: number,
    drafts: number,
  ) {
    this.work = device.buffer(rows * 2 * vocab * 4);
    this.ids = device.buffer(rows * 4);
    this.accepted = device.buffer(rows * 4);
    this.lp = device.buffer(rows * (1 + MAX_TOP_LOGPROBS) * 4);
    this.lpIds = device.buffer(rows * MAX_TOP_LOGPROBS * 4);
    this.q = device.buffer(Math.max(1, drafts) * vocab * 4);
    this.none = device.buffer(16);
  }
  /** The logprobs of row r (top n alternatives), from the last completed step. */
  logprobs(r: number, n: number): { logprob: number; top: { id: number; logprob: number }[] } {
    const lp = this.lp.f32.subarray(r * (1 + MAX_TOP_LOGPROBS));
    const ids = this.lpIds.i32.subarray(r * MAX_TOP_LOGPROBS);
    return { logprob: lp[0]!, top: Array.from({ length: n }, (_, k) => ({ id: ids[k]!, logprob: lp[1 + k]! })) };
  }
  release(): void {
    for (const b of [this.work, this.ids, this.accepted, this.lp, this.lpIds, this.q, this.none]) b.release();
  }
}

/** One sampling dispatch: `rows` rows of logits drawing positions position, position + 1, ... */
export interface SampleArgs {
  params: SamplingParams;
  seed: number;
  rows: number;
  /** Sequence position row 0 draws. */
  position: number;
  /** Draw index of the plain draws (Draw.sample or Draw.draft). */
  draw: number;
  /** Penalty counts storage ([all | gen], 2 * vocab i32), or null without penalties. */
  counts: Binding | null;
  /** Tokens counted as generated on top of counts: row r counts extras[0 .. extrasBase + r). */
  extras: Binding | null;
  extrasBase: number;
  /** Rows 0..verify.rows-1 verify verify.drafts[r], drawn from the rows of q. */
  verify: { rows: number; drafts: Binding } | null;
  /** Write each row's distribution into q (rows from qRow on), for a later verification. */
  qRow: number | null;
  /** Logprob alternatives (0..20), or null for no logprobs. */
  topLogprobs: number | null;
  /** Where the drawn ids go (default the scratch's ids). */
  ids?: Binding;
}

/** Records the sampling kernel over rows of `logits`; results land in `scratch` (ids, accepted, lp). */
export function encodeSample(ctx: EncodeContext, logits: RowsRef, scratch: SamplingScratch, a: SampleArgs): void {
  checkRows(a.rows, "sample");
  if (a.rows > scratch.rows) throw new Error(`sample: ${a.rows} rows, the sampling scratch holds ${scratch.rows}`);
  if (a.topLogprobs !== null && (!Number.isInteger(a.topLogprobs) || a.topLogprobs < 0 || a.topLogprobs > MAX_TOP_LOGPROBS))
    throw new RangeError(`sample: topLogprobs ${a.topLogprobs} must be an integer in [0, ${MAX_TOP_LOGPROBS}]`);
  const p = a.params;
  const vocab = scratch.vocab;
  const pen = a.counts !== null && hasPenalties(p);
  const flags = (pen ? 1 : 0) | (a.verify ? 2 : 0) | (a.qRow !== null ? 4 : 0);
  // Small vocabularies (tests, tiny models): fewer threads, fewer emulated fibers per barrier.
  // Large ones: 1024, or what the pipeline allows (Metal lowers it for register-heavy kernels).
  const threads = vocab <= 1024 ? SIMD_WIDTH : vocab <= 4096 ? 2 * SIMD_WIDTH : threadsWithin(ctx.device.pipeline("sample_f32"), 32 * SIMD_WIDTH);
  dispatch(
    ctx,
    "sample_f32",
    Params.Sample,
    {
      rows: a.rows,
      vocab,
      top_k: p.topK,
      top_n: a.topLogprobs ?? -1,
      flags,
      extras_base: a.extrasBase,
      draft_rows: a.verify?.rows ?? 0,
      draw: a.draw,
      position: a.position,
      seed_lo: a.seed % 2 ** 32,
      seed_hi: Math.floor(a.seed / 2 ** 32),
      temperature: p.temperature,
      top_p: p.topP,
      min_p: p.minP,
      repetition: p.repetitionPenalty,
      presence: p.presencePenalty,
      frequency: p.frequencyPenalty,
      x_stride: logits.stride,
    },
    [
      bind(logits.buffer, logits.offset),
      pen ? a.counts! : scratch.none,
      pen && a.extras ? a.extras : scratch.none,
      a.verify?.drafts ?? scratch.none,
      scratch.q,
      scratch.work,
      a.ids ?? scratch.ids,
      scratch.accepted,
      a.qRow !== null ? bind(scratch.q, a.qRow * vocab * 4) : scratch.none,
      scratch.lp,
      scratch.lpIds,
    ],
    a.rows,
    threads,
  );
}
