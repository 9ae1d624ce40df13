/**
 * `bun run bench:kernels`: time per kernel dispatch on the selected backend (the CPU
 * backend off macOS) at the small preset's shapes (presetConfig("small"), or --preset), for a decode row
 * (nb = 1) and a 32-row batch. Weights are random, stored as a q4 model stores them
 * (matrices q4, small tensors bf16, norms f32); all experts are resident.
 *
 *   bun spec/bench/kernels.ts [--json] [--iters N] [--reps N] [--nb 1,32] [--filter text[|text...]] [--warmup-ms T]
 *                             [--preset small|30b-a3b-shape|...] [--storage shared|device]
 * (--reps N: exactly N dispatches per timed command buffer, 1 with --iters 1 suits a profiler such
 * as ncu; without it each case takes 10 or more, as many as make one buffer last --min-ms, 2 ms,
 * up to 400: the host's timing jitter, tens of microseconds, is then spread over that many copies;
 * --warmup-ms T keeps each case running for T ms before its timed runs: 300 unless --reps is given)
 *
 * --preset picks the shapes (default small); --storage device puts every buffer in device
 * storage (HBM on cuda, uploaded after the host fills it), as the engine does; the default,
 * shared, is host memory on cuda (read over the bus) and the same thing elsewhere. Weights over
 * 16M values are random bytes rather than quantized random floats (timing only: the values
 * do not matter, making them would take minutes).
 *
 * Each case records `reps` copies of its dispatches into one command buffer, and 2 x `reps`
 * into another, runs each `iters` times after a warm-up, and reports per copy the difference
 * of the fastest runs over `reps` (the least disturbed by other processes on a shared machine),
 * and likewise of the medians: the command buffer's fixed commit-to-completion cost cancels out.
 * (Timed as a whole, that cost, some 100-200 us on the H200, added 10-20 us to every copy of a
 * one-row kernel at 10 reps: docs/performance.md "eleventh run".) `overheadUs` in the JSON is
 * that fixed cost.
 * A case may be several dispatches (named in `kernels`). Cases that declare their arithmetic
 * (the GEMMs) also print TFLOP/s: 2 * out * in * nb per copy over the fastest run. The GEMM
 * cases (filter "gemm") run the tiled q4 GEMM (gemm_q4_f32: split bf16 operands, the engine's;
 * gemm_plain_q4_f32: one bf16 product) beside the matvec at the model's dense shapes and the LM
 * head, e.g. `--preset 30b-a3b-shape --storage device --nb 32,256,512 --filter gemm`; the
 * crossover row count is lib/gpu/gemm.ts's GEMM_MIN_ROWS.
 */
import { presetConfig, type PresetName } from "../../lib/convert/presets.ts";
import { dims, type DType } from "../../lib/model/config.ts";
import { f32ToBf16, f32ToF16 } from "../../lib/model/dtype.ts";
import { quantizeQ4 } from "../../lib/model/q4.ts";
import { Rng } from "../../lib/model/rng.ts";
import { tensorBytes } from "../../lib/model/tensors.ts";
import { encodeResidualAdd, encodeElementwise } from "../../lib/gpu/elementwise.ts";
import { encodeEmbed } from "../../lib/gpu/embed.ts";
import type { EncodeContext, RowsRef, TensorRef } from "../../lib/gpu/dispatch.ts";
import { encodeExpertLists, encodeMoeCombine, encodeRouterTopK, encodeRoutedExperts, encodeSharedExpert, type ExpertPool } from "../../lib/gpu/experts.ts";
import { encodeHcCoefficients, encodeHcCoefficientsRead, encodeHcWrite, hcFold, hcFoldCount, hcMixCount, type HcSiteRefs } from "../../lib/gpu/hyperconnection.ts";
import { encodeMtpInput } from "../../lib/gpu/mtp.ts";
import { encodeRmsNorm, encodeRmsNormGated } from "../../lib/gpu/norms.ts";
import { encodeMatvec } from "../../lib/gpu/projections.ts";
import { MAX_NB } from "../../lib/gpu/limits.ts";
import { encodeGemm } from "../../lib/gpu/gemm.ts";
import { encodeArgmax, encodeFinalRead } from "../../lib/gpu/sampling.ts";
import { Device, type Buffer, type Storage } from "../../lib/shim.ts";
import { allocateKvCache, attentionPartialBytes, attentionSplits, encodeAttention, encodeKvAppend, encodeQsa, encodeRope, qsaScoreBytes } from "../../lib/gpu/attention.ts";
import { recordingNames } from "../dispatch-names.ts";
import { deltanetChunkBytes, deltanetStateFloats, encodeConvSilu, encodeDeltaNet, encodeDeltaNetBlock } from "../../lib/gpu/deltanet.ts";
import { encodePleConv, encodePleGate, encodePleGather, pleHistoryFloats } from "../../lib/gpu/ple.ts";

interface BenchCase {
  name: string;
  /** Pipelines it dispatches, in order. */
  kernels: string[];
  /** Shape note for the table. */
  shape: string;
  /** Returns the encode of one copy of the case at nb rows, or null where the case has no such form (left out of the table). */
  setup(nb: number): ((ctx: EncodeContext) => void) | null;
  /** The fewest bytes one copy must move through device memory (weights read once, inputs read, outputs written). */
  bytes?(nb: number): number;
  /** Floating-point operations of one copy (multiply-adds count 2), for a TFLOP/s column. */
  flops?(nb: number): number;
}

export interface BenchResult {
  name: string;
  kernels: string[];
  shape: string;
  nb: number;
  /** Copies of the case in the shorter timed command buffer (the longer one has twice as many). */
  reps: number;
  /** Fastest run, microseconds per copy. */
  us: number;
  /** Median run, microseconds per copy. */
  medianUs: number;
  /** The command buffer's fixed cost (commit to completion, outside the copies), microseconds. */
  overheadUs: number;
  /** The case's byte count (when it declares one) and the bandwidth that makes: bytes / fastest run. */
  bytes?: number;
  gbPerS?: number;
  /** The case's operation count (when it declares one) and the rate: flops / fastest run. */
  flops?: number;
  tflops?: number;
}

const argv = process.argv.slice(2);
const argValue = (flag: string) => {
  const i = argv.indexOf(flag);
  return i >= 0 ? argv[i + 1] : undefined;
};
const PRESET = (argValue("--preset") ?? "small") as PresetName;
const STORAGE = (argValue("--storage") ?? "shared") as Storage;
if (STORAGE !== "shared" && STORAGE !== "device") throw new Error(`--storage: expected shared or device, got ${STORAGE}`);
const cfg = presetConfig(PRESET);
const D = dims(cfg);
const { d, n } = D;
const moe = cfg.moe;
const SI = moe.shared_intermediate;
const dn = cfg.deltanet;
const at = cfg.attention;

/** A device and the random data of the cases (buffers live until the process ends). */
class Fixture {
  readonly rng = new Rng(1, "bench");
  constructor(readonly dev: Device) {}

  /** A zero-filled buffer in the bench's storage; call `upload` on it after filling it from the host. */
  buffer(bytes: number): Buffer {
    return this.dev.buffer(bytes, STORAGE);
  }

  random(count: number, scale = 1): Float32Array {
    return Float32Array.from({ length: count }, () => this.rng.symmetric() * scale);
  }

  /** Activation rows [nb][width] with random values. */
  rows(nb: number, width: number, scale = 1): RowsRef {
    const b = this.buffer(nb * width * 4);
    b.f32.set(this.random(nb * width, scale));
    b.upload();
    return { buffer: b, offset: 0, stride: width * 4 };
  }

  i32(values: ArrayLike<number>): Buffer {
    const b = this.buffer(Math.max(4, values.length * 4));
    b.i32.set(Array.from(values));
    b.upload();
    return b;
  }

  /** A weight of `shape` stored as `dtype` in its own buffer. */
  weight(shape: number[], dtype: DType, scale = 0.3): TensorRef {
    const count = shape.reduce((a, b) => a * b, 1);
    if (count > 16 << 20) {
      const buffer = this.buffer(tensorBytes(shape, dtype) + 256);
      for (let o = 0; o < buffer.bytes.length; o += 65536) crypto.getRandomValues(buffer.bytes.subarray(o, o + 65536));
      buffer.upload();
      return { buffer, offset: 256, dtype, shape };
    }
    const values = this.random(count, scale);
    const bytes =
      dtype === "q4" ? quantizeQ4(values)
      : dtype === "bf16" ? new Uint8Array(f32ToBf16(values).buffer)
      : dtype === "f16" ? new Uint8Array(f32ToF16(values).buffer)
      : new Uint8Array(values.buffer);
    if (bytes.byteLength !== tensorBytes(shape, dtype)) throw new Error("bench: weight size mismatch");
    const buffer = this.buffer(bytes.byteLength + 256);
    buffer.bytes.set(bytes, 256);
    buffer.upload();
    return { buffer, offset: 256, dtype, shape };
  }

  site(head = false): HcSiteRefs {
    const M = hcMixCount(n, head);
    return { fn: this.weight([M, n * d], "bf16", 0.05), base: this.weight([M], "f32"), scale: this.weight([head ? 1 : 3], "f32") };
  }

  /** Coefficients [nb][M] and the raw partials of `flat` = n*d stream values ([M + 1][chunks rounded up to 4] a row). */
  scratch(nb: number, M: number, flat: number) {
    return { raw: this.rows(nb, (M + 1) * Math.ceil(Math.ceil(flat / 256) / 4) * 4), coeffs: this.rows(nb, M) };
  }
}

function cases(f: Fixture): BenchCase[] {
  const q4 = "q4" as const;
  const E = moe.experts;
  const k = moe.top_k;
  const I = moe.intermediate;
  const vocab = cfg.vocab_size;
  const proj = (name: string, out: number, inDim: number, dtype: DType): BenchCase => ({
    name,
    kernels: [`matvec_${dtype}_f32`],
    shape: `[${out}, ${inDim}] ${dtype}`,
    setup(nb) {
      const w = f.weight([out, inDim], dtype);
      const x = f.rows(nb, inDim);
      const y = f.rows(nb, out);
      return (ctx) => encodeMatvec(ctx, w, x, y, nb, { gemm: false });
    },
    bytes: (nb) => tensorBytes([out, inDim], dtype) + nb * (inDim + out) * 4,
    flops: (nb) => 2 * out * inDim * nb,
  });
  // The tiled GEMM (lib/gpu/gemm.ts) at a dense shape, split (the engine's) or plain operands.
  const gemm = (name: string, out: number, inDim: number, precision: "split" | "plain"): BenchCase => ({
    name: `gemm ${precision}: ${name}`,
    kernels: [precision === "split" ? "gemm_q4_f32" : "gemm_plain_q4_f32"],
    shape: `[${out}, ${inDim}] q4`,
    setup(nb) {
      const w = f.weight([out, inDim], q4);
      const x = f.rows(nb, inDim);
      const y = f.rows(nb, out);
      return (ctx) => encodeGemm(ctx, w, x, y, nb, { precision });
    },
    bytes: (nb) => tensorBytes([out, inDim], q4) + nb * (inDim + out) * 4,
    flops: (nb) => 2 * out * inDim * nb,
  });
  const gemmCases = (["split", "plain"] as const).flatMap((precision) => [
    gemm("dn.qkv projection", D.dnConvChannels, d, precision),
    gemm("dn.out / attn.o projection", d, D.dnValue, precision),
    gemm("logits (lm head)", vocab, d, precision),
  ]);
  // The streaming reference: y = a + b over STREAM_FLOATS floats (two reads and a write each),
  // what a memory-bound kernel of this backend can reach (the "copy bandwidth" of the table).
  const STREAM_FLOATS = f.dev.backend === "cpu" ? 1 << 20 : 1 << 25;
  const STREAM_COLS = STREAM_FLOATS / 1024; // 1024 rows: a step's most
  const list: BenchCase[] = [
    {
      name: "stream (a + b)",
      kernels: ["ew_add_f32"],
      shape: `${STREAM_FLOATS} floats`,
      setup() {
        const rows = STREAM_FLOATS / STREAM_COLS;
        const a = f.rows(rows, STREAM_COLS);
        const b = f.rows(rows, STREAM_COLS);
        const y = f.rows(rows, STREAM_COLS);
        // 1024 threads a threadgroup: with the engine's 64 the H200 ran 524,288 threadgroups
        // and their scheduling, not the memory, set the time (606 GB/s, eleventh run).
        return (ctx) => encodeElementwise(ctx, "add", a, b, y, rows, STREAM_COLS, 1, 1024);
      },
      bytes: () => STREAM_FLOATS * 12,
    },
    {
      name: "embed",
      kernels: ["embed_q4_f32"],
      shape: `[${vocab}, ${d}] q4 -> ${n} streams`,
      setup(nb) {
        const table = f.weight([vocab, d], q4);
        const ids = f.i32(Array.from({ length: nb }, (_, i) => (i * 37) % vocab));
        const X = f.rows(nb, n * d);
        return (ctx) => encodeEmbed(ctx, table, ids, X, nb, n);
      },
    },
    {
      name: "hc coefficients",
      kernels: ["hc_mix_partials_bf16_f32", "hc_coeffs_f32"],
      shape: `fn [${D.hcMix}, ${n * d}] bf16, Sinkhorn ${cfg.hc.sinkhorn_iters}`,
      setup(nb) {
        const X = f.rows(nb, n * d);
        const site = f.site();
        const s = f.scratch(nb, D.hcMix, n * d);
        return (ctx) => encodeHcCoefficients(ctx, X, site, s, nb, cfg.hc, d);
      },
    },
    {
      name: "hc site read (coefficients + read + norm)",
      kernels: ["hc_mix_partials_bf16_f32", "hc_coeffs_read_norm_f32"],
      shape: `fn [${D.hcMix}, ${n * d}] bf16, ${n} x ${d}`,
      setup(nb) {
        const X = f.rows(nb, n * d);
        const site = f.site();
        const s = f.scratch(nb, D.hcMix, n * d);
        const y = f.rows(nb, d);
        const w = f.weight([d], "f32");
        return (ctx) => encodeHcCoefficientsRead(ctx, X, site, s, y, nb, cfg.hc, d, { w, eps: cfg.rms_norm_eps });
      },
    },
    {
      name: "hc write",
      kernels: ["hc_write_f32"],
      shape: `${n} x ${d}`,
      setup(nb) {
        const X = f.rows(nb, n * d);
        const coeffs = f.rows(nb, D.hcMix, 0.5);
        const y = f.rows(nb, d);
        return (ctx) => encodeHcWrite(ctx, X, coeffs, y, nb, n, d);
      },
    },
    {
      name: "hc write + the next site's partials (the fold)",
      kernels: ["hc_write_fold_f32"],
      shape: `${n} x ${d}, fn [${D.hcMix}, ${n * d}] bf16`,
      setup(nb) {
        const X = f.rows(nb, n * d);
        const coeffs = f.rows(nb, D.hcMix, 0.5);
        const y = f.rows(nb, d);
        const fold = hcFold(f.site(), f.rows(nb, hcFoldCount(n, d)), cfg.hc, d);
        return (ctx) => encodeHcWrite(ctx, X, coeffs, y, nb, n, d, fold);
      },
    },
    {
      name: "hc site read from folded partials",
      kernels: ["hc_coeffs_read_norm_f32"],
      shape: `partials [${D.hcMix + 1}, ${d / 4}], ${n} x ${d}`,
      setup(nb) {
        const X = f.rows(nb, n * d);
        const site = f.site();
        const s = f.scratch(nb, D.hcMix, n * d);
        const folded = f.rows(nb, hcFoldCount(n, d));
        const y = f.rows(nb, d);
        const w = f.weight([d], "f32");
        return (ctx) => encodeHcCoefficientsRead(ctx, X, site, s, y, nb, cfg.hc, d, { w, eps: cfg.rms_norm_eps }, false, folded);
      },
    },
    {
      name: "residual add (n = 1)",
      kernels: ["ew_add_f32"],
      shape: `${d}`,
      setup(nb) {
        const X = f.rows(nb, d);
        const y = f.rows(nb, d);
        return (ctx) => encodeResidualAdd(ctx, X, y, nb, d);
      },
    },
    {
      name: "rms norm",
      kernels: ["rms_norm_f32"],
      shape: `${d}`,
      setup(nb) {
        const x = f.rows(nb, d);
        const w = f.weight([d], "f32");
        return (ctx) => encodeRmsNorm(ctx, x, w, x, nb, cfg.rms_norm_eps);
      },
    },
    {
      name: "rms norm per head (q_norm)",
      kernels: ["rms_norm_f32"],
      shape: `${at.heads} x ${at.head_dim}`,
      setup(nb) {
        const x = f.rows(nb, D.attnQ);
        const w = f.weight([at.head_dim], "f32");
        return (ctx) => encodeRmsNorm(ctx, x, w, x, nb, cfg.rms_norm_eps, { heads: at.heads });
      },
    },
    {
      name: "rms norm gated (DeltaNet out)",
      kernels: ["rms_norm_gated_f32"],
      shape: `${dn.value_heads} x ${dn.value_dim}`,
      setup(nb) {
        const o = f.rows(nb, D.dnValue);
        const z = f.rows(nb, D.dnValue);
        const w = f.weight([dn.value_dim], "f32");
        return (ctx) => encodeRmsNormGated(ctx, o, z, w, o, nb, dn.value_heads, cfg.rms_norm_eps);
      },
    },
    proj("dn.qkv projection", D.dnConvChannels, d, q4),
    proj("attn.q projection", D.attnQ, d, q4),
    proj("dn.out / attn.o projection", d, D.dnValue, q4),
    proj("dn.b (small) projection", dn.value_heads, d, "bf16"),
    proj("router logits", E, d, "bf16"),
    proj("f32 projection", d, d, "f32"),
    // ggml's anchor case (test-backend-ops MUL_MAT q4_0, m = 4096, k = 14336: a [4096, 14336]
    // weight), so issue 18's bandwidth comparison can also be made at the same shape.
    proj("q4 matvec at ggml's anchor shape", 4096, 14336, q4),
    {
      name: "attention gate",
      kernels: ["ew_sigmoid_mul_f32"],
      shape: `${D.attnQ}`,
      setup(nb) {
        const o = f.rows(nb, D.attnQ);
        const g = f.rows(nb, D.attnQ);
        return (ctx) => encodeElementwise(ctx, "sigmoid_mul", o, g, o, nb, D.attnQ);
      },
    },
    {
      name: "router top-k",
      kernels: ["router_topk_f32"],
      shape: `E ${E}, k ${k}`,
      setup(nb) {
        const logits = f.rows(nb, E, 3);
        const ids = f.buffer(nb * k * 4);
        const weights = f.buffer(nb * k * 4);
        return (ctx) => encodeRouterTopK(ctx, logits, { ids, weights }, nb, moe);
      },
    },
    {
      name: "expert lists",
      kernels: ["moe_lists_i32"],
      shape: `${k} pairs per row`,
      setup(nb) {
        const ids = f.i32(Array.from({ length: nb * k }, (_, i) => (i * 7) % E));
        const lists = { offsets: f.buffer((E + 1) * 4), pairs: f.buffer(nb * k * 4), active: f.buffer((E + 1) * 4) };
        return (ctx) => encodeExpertLists(ctx, ids, lists, nb, k, E);
      },
    },
    {
      name: "routed experts",
      // From the GEMM row threshold on (lib/gpu/gemm.ts), moe_gemm_gate_up_q4_f32 + moe_gemm_down_q4_f32.
      kernels: ["moe_gate_up_pairs_q4 + moe_down_combine_q4 (nb 1)", "moe_gate_up_q4 + moe_down_q4 (nb > 1)"],
      shape: `k ${k}, [${I}, ${d}] q4 records`,
      setup(nb) {
        const gate = f.weight([I, d], q4);
        const up = f.weight([I, d], q4);
        const down = f.weight([d, I], q4);
        const parts = [gate, up, down];
        const align = (x: number) => Math.ceil(x / 256) * 256;
        let cursor = 0;
        const offsets = parts.map((p) => {
          const o = align(cursor);
          cursor = o + (p.buffer.length - 256);
          return o;
        });
        const stride = Math.ceil(cursor / 16384) * 16384;
        const pool = f.buffer(stride * E);
        for (let s = 0; s < E; s++)
          parts.forEach((p, i) => pool.bytes.set(p.buffer.bytes.subarray(256, 256 + tensorBytes(p.shape, q4)), s * stride + offsets[i]!));
        pool.upload();
        const expertPool: ExpertPool = {
          buffers: [pool],
          slotsPerBuffer: E,
          slots: E,
          stride,
          parts: ["gate", "up", "down"].map((name, i) => ({ name, dtype: q4, shape: parts[i]!.shape, offset: offsets[i]! })),
        };
        const slotOf = f.i32(Array.from({ length: E }, (_, e) => e));
        const ids = f.i32(Array.from({ length: nb * k }, (_, i) => (i * 7 + Math.floor(i / k)) % E));
        const lists = { offsets: f.buffer((E + 1) * 4), pairs: f.buffer(nb * k * 4), active: f.buffer((E + 1) * 4) };
        runOnce(f.dev, (ctx) => encodeExpertLists(ctx, ids, lists, nb, k, E));
        const x = f.rows(nb, d);
        const scratch = { h: f.rows(nb * k, I), o: f.rows(nb * k, d) };
        // One row takes the decode path (gate + up per pair, then down + combine in one);
        // more rows the grouped kernels (the combine is a row of its own, "moe combine").
        if (nb === 1) {
          const combine = { ids, weights: f.rows(1, k).buffer, y: f.rows(1, d) };
          return (ctx) => encodeRoutedExperts(ctx, expertPool, slotOf, null, x, scratch, nb, k, E, combine);
        }
        return (ctx) => encodeRoutedExperts(ctx, expertPool, slotOf, lists, x, scratch, nb, k, E);
      },
      // Each active expert's three projections once, the rows in and out (h written and read).
      bytes: (nb) => {
        const active = new Set(Array.from({ length: nb * k }, (_, i) => (i * 7 + Math.floor(i / k)) % E)).size;
        return active * 3 * tensorBytes([I, d], q4) + nb * d * 4 + nb * k * (2 * I + d) * 4;
      },
      flops: (nb) => 3 * 2 * I * d * nb * k,
    },
    {
      name: "shared expert",
      kernels: ["ffn_gate_up_q4_f32", "matvec_q4(_r1)_f32", "matvec_bf16_f32"],
      shape: `[${SI}, ${d}] q4 + gate`,
      setup(nb) {
        const w = { gate: f.weight([SI, d], q4), up: f.weight([SI, d], q4), down: f.weight([d, SI], q4), expertGate: f.weight([1, d], "bf16") };
        const x = f.rows(nb, d);
        const scratch = { h: f.rows(nb, SI), s: f.rows(nb, d), sg: f.rows(nb, 1) };
        return (ctx) => encodeSharedExpert(ctx, w, x, scratch, nb);
      },
    },
    {
      name: "moe combine",
      kernels: ["moe_combine_shared_f32"],
      shape: `k ${k} + shared, ${d}`,
      setup(nb) {
        const weights = f.rows(nb, k);
        const o = f.rows(nb * k, d);
        const s = f.rows(nb, d);
        const sg = f.rows(nb, 1);
        const y = f.rows(nb, d);
        return (ctx) => encodeMoeCombine(ctx, weights.buffer, o, y, nb, k, d, { s, sg });
      },
    },
    {
      name: "final read + norm",
      kernels: ["hc_mix_partials_bf16_f32", "hc_coeffs_read_norm_f32"],
      shape: `${n} x ${d}`,
      setup(nb) {
        const X = f.rows(nb, n * d);
        const head = f.site(true);
        const s = f.scratch(nb, n, n * d);
        const hidden = f.rows(nb, d);
        const norm = f.weight([d], "f32");
        return (ctx) => encodeFinalRead(ctx, X, head, s, hidden, nb, cfg.hc, d, norm, cfg.rms_norm_eps);
      },
    },
    proj("logits (lm head)", vocab, d, q4),
    ...gemmCases,
    {
      name: "argmax",
      kernels: ["argmax_f32"],
      shape: `vocab ${vocab}`,
      setup(nb) {
        const logits = f.rows(nb, vocab, 5);
        const ids = f.buffer(nb * 4);
        const margin = f.buffer(nb * 4);
        return (ctx) => encodeArgmax(ctx, logits, ids, margin, nb, vocab);
      },
    },
    {
      name: "mtp input fusion",
      kernels: ["mtp_fuse_q4_f32"],
      shape: `2 x ${d}`,
      setup(nb) {
        const embed = f.weight([vocab, d], q4);
        const ids = f.i32(Array.from({ length: nb }, (_, i) => (i * 11) % vocab));
        const h = f.rows(nb, d);
        const norms = { embedNorm: f.weight([d], "f32"), hiddenNorm: f.weight([d], "f32") };
        const y = f.rows(nb, 2 * d);
        return (ctx) => encodeMtpInput(ctx, embed, ids, h, norms, y, nb, cfg.rms_norm_eps);
      },
    },
  ];
  return [...list, ...loadsOnly(f, list)];
}

// The q4 kernels' loads without their arithmetic (q4_loads_only, kernels/matvec.h): the same
// dispatches with each q4 kernel swapped for its loads-only form, so the difference to the case
// itself is what the nibble arithmetic costs (issue 18: is a decode GEMV bound by its
// instructions or by its memory trips?). Their outputs mean nothing.
const LOADS_ONLY: Record<string, string> = {
  matvec_q4_r1_f32: "matvec_q4_loads_r1_f32",
  matvec_q4_staged_r1_f32: "matvec_q4_staged_loads_r1_f32",
  moe_gate_up_pairs_q4_f32: "moe_gate_up_pairs_q4_loads_f32",
  moe_down_combine_q4_f32: "moe_down_combine_q4_loads_f32",
};
const LOADS_ONLY_CASES = ["dn.qkv projection", "q4 matvec at ggml's anchor shape", "routed experts"];

function loadsOnly(f: Fixture, list: BenchCase[]): BenchCase[] {
  return list
    .filter((c) => LOADS_ONLY_CASES.includes(c.name))
    .map((c) => ({
      ...c,
      name: `loads only: ${c.name}`,
      kernels: c.kernels.map((k) => LOADS_ONLY[k] ?? k),
      setup(nb: number) {
        // One row only: the loads-only forms are the one-row kernels'.
        const encode = nb === 1 ? c.setup(nb) : null;
        return (
          encode &&
          ((ctx: EncodeContext) => {
            const sw = swapped(ctx, f.dev, LOADS_ONLY);
            encode(sw);
            sw.done();
          })
        );
      },
    }));
}

/**
 * ctx whose dispatches of the kernels `map` names run the kernels it maps them to (the same
 * params and bindings). Throws at the end of an encode that swapped nothing (`done`): a case
 * whose kernel has no loads-only form would otherwise time the kernel itself under that name.
 */
function swapped(ctx: EncodeContext, dev: Device, map: Record<string, string>): EncodeContext & { done(): void } {
  const cb = ctx.cb;
  const seen: string[] = [];
  let swaps = 0;
  const dispatch = (...a: Parameters<typeof cb.dispatch>) => {
    const name = typeof a[0] === "string" ? a[0] : a[0].name;
    const to = map[name];
    seen.push(name);
    if (to !== undefined) {
      a[0] = typeof a[0] === "string" ? to : dev.pipeline(to);
      swaps++;
    }
    return cb.dispatch(...a);
  };
  const done = () => {
    if (swaps === 0) throw new Error(`bench:kernels: no loads-only form of ${[...new Set(seen)].join(" + ")} (LOADS_ONLY)`);
  };
  return { ...ctx, cb: new Proxy(cb, { get: (t, k) => (k === "dispatch" ? dispatch : Reflect.get(t, k, t)) }), done };
}

/** Positions already in the caches when a sequence case runs (a short decode context). */
const CONTEXT = 256;
/** Contexts of the QSA selection cases: the 30b shape's top-k (2048) and past it. */
const QSA_CONTEXTS = [2048, 4096, 8192];

/** The sequence family's kernels (helper-K2's encode functions) at the same shapes. */
function sequenceCases(f: Fixture): BenchCase[] {
  const C = D.dnConvChannels;
  const K = dn.conv_kernel;
  const hd = at.head_dim;
  const qsa = at.qsa!;
  const ple = cfg.ple!;
  const fillCache = (heads: number, dim: number) => {
    const cache = allocateKvCache(f.dev, at.kv_cache, heads, dim, CONTEXT + 64);
    const src = f.rows(CONTEXT, heads * dim);
    runOnce(f.dev, (ctx) => encodeKvAppend(ctx, { rows: CONTEXT, pos0: 0, x: src, cache }));
    return cache;
  };
  return [
    {
      name: "conv + SiLU (DeltaNet)",
      kernels: ["conv_silu_rows_f32"],
      shape: `${C} channels, K ${K}`,
      setup(nb) {
        const x = f.rows(nb, C);
        const y = f.rows(nb, C);
        const weight = f.weight([C, K], "f32");
        const state = f.buffer((K - 1) * C * 4);
        return (ctx) => encodeConvSilu(ctx, { rows: nb, channels: C, x, weight, state, y });
      },
    },
    {
      name: "DeltaNet recurrence",
      kernels: ["deltanet_rows_f32"],
      shape: `Hk ${dn.key_heads} x ${dn.key_dim}, Hv ${dn.value_heads} x ${dn.value_dim}`,
      setup(nb) {
        const shape = { keyHeads: dn.key_heads, keyDim: dn.key_dim, valueHeads: dn.value_heads, valueDim: dn.value_dim };
        const qkv = f.rows(nb, C);
        const b = f.rows(nb, dn.value_heads);
        const a = f.rows(nb, dn.value_heads);
        const aLog = f.weight([dn.value_heads], "f32");
        const dtBias = f.weight([dn.value_heads], "f32");
        const state = f.buffer(deltanetStateFloats(shape) * 4);
        const o = f.rows(nb, D.dnValue);
        return (ctx) => encodeDeltaNet(ctx, { ...shape, rows: nb, qkv, b, a, aLog, dtBias, state, o });
      },
    },
    // The recurrence over a prompt chunk both ways (encodeDeltaNet): the row scan, and the chunked
    // form lib/gpu/deltanet.ts takes from DELTANET_CHUNKED_MIN_ROWS rows on a GPU, its scan with 2
    // state columns a simdgroup (the default, DELTANET_CHUNK_COLS) and with 4; e.g.
    // --preset 30b-a3b-shape --storage device --nb 64,256,1024 --filter "deltanet chunk".
    ...([
      [false, 2],
      [true, 2],
      [true, 4],
    ] as const).map(([chunked, cols]) => ({
      name: `deltanet chunk: ${chunked ? `chunked form, ${cols} columns a simdgroup` : "row scan"}`,
      kernels: chunked ? ["deltanet_chunk_prep_f32", cols === 4 ? "deltanet_chunk_scan_c4_f32" : "deltanet_chunk_scan_f32"] : ["deltanet_rows_f32"],
      shape: `Hk ${dn.key_heads} x ${dn.key_dim}, Hv ${dn.value_heads} x ${dn.value_dim}`,
      setup(nb: number) {
        const shape = { keyHeads: dn.key_heads, keyDim: dn.key_dim, valueHeads: dn.value_heads, valueDim: dn.value_dim };
        const bytes = deltanetChunkBytes(nb, dn.value_heads);
        const args = {
          ...shape,
          rows: nb,
          qkv: f.rows(nb, C),
          b: f.rows(nb, dn.value_heads),
          a: f.rows(nb, dn.value_heads),
          aLog: f.weight([dn.value_heads], "f32"),
          dtBias: f.weight([dn.value_heads], "f32"),
          state: f.buffer(deltanetStateFloats(shape) * 4),
          o: f.rows(nb, D.dnValue),
          work: { buffer: f.buffer(bytes), offset: 0, bytes },
          chunked,
          chunkColumns: cols,
        };
        return (ctx: EncodeContext) => encodeDeltaNet(ctx, args);
      },
    })),
    // The mixer's conv + recurrence + gated norm both ways (encodeDeltaNetBlock): the host fuses up
    // to DELTANET_FUSE_MAX_ROWS rows; timing both at each nb is how to set that threshold.
    ...([false, true] as const).map((fuse) => ({
      name: `DeltaNet block, ${fuse ? "fused" : "three kernels"}`,
      kernels: fuse ? ["deltanet_conv_rows_f32", "rms_norm_gated_conv_window_f32"] : ["conv_silu_rows_f32", "deltanet_rows_f32", "rms_norm_gated_f32"],
      shape: `Hk ${dn.key_heads} x ${dn.key_dim}, Hv ${dn.value_heads} x ${dn.value_dim}, K ${K}`,
      setup(nb: number) {
        const shape = { keyHeads: dn.key_heads, keyDim: dn.key_dim, valueHeads: dn.value_heads, valueDim: dn.value_dim };
        const args = {
          ...shape,
          rows: nb,
          x: f.rows(nb, C),
          convWeight: f.weight([C, K], "f32"),
          convState: f.buffer((K - 1) * C * 4),
          convOut: f.rows(nb, C),
          b: f.rows(nb, dn.value_heads),
          a: f.rows(nb, dn.value_heads),
          aLog: f.weight([dn.value_heads], "f32"),
          dtBias: f.weight([dn.value_heads], "f32"),
          state: f.buffer(deltanetStateFloats(shape) * 4),
          z: f.rows(nb, D.dnValue),
          normWeight: f.weight([dn.value_dim], "f32"),
          eps: cfg.rms_norm_eps,
          o: f.rows(nb, D.dnValue),
        };
        return (ctx: EncodeContext) => encodeDeltaNetBlock(ctx, args, fuse);
      },
    })),
    {
      name: "RoPE (q and k)",
      kernels: ["rope_neox_f32"],
      shape: `${at.heads} + ${at.kv_heads} heads, rd ${D.rotaryDim}`,
      setup(nb) {
        const q = f.rows(nb, D.attnQ);
        const k = f.rows(nb, D.attnKv);
        return (ctx) =>
          encodeRope(ctx, { rows: nb, pos0: CONTEXT, headDim: hd, rotDim: D.rotaryDim, theta: at.rope_theta, q, qHeads: at.heads, k, kHeads: at.kv_heads });
      },
    },
    {
      name: "KV append",
      kernels: [`kv_append_${at.kv_cache}`],
      shape: `${at.kv_heads} x ${hd} ${at.kv_cache}`,
      setup(nb) {
        const cache = allocateKvCache(f.dev, at.kv_cache, at.kv_heads, hd, CONTEXT + 64);
        const x = f.rows(nb, D.attnKv);
        return (ctx) => encodeKvAppend(ctx, { rows: nb, pos0: CONTEXT, x, cache });
      },
    },
    {
      name: "QSA scores + top-k",
      kernels: [`qsa_scores_${at.kv_cache}`, "qsa_topk_f32"],
      shape: `${qsa.heads} x ${qsa.head_dim}, topk ${qsa.topk}, context ${CONTEXT}`,
      setup(nb) {
        const ik = fillCache(1, qsa.head_dim);
        runOnce(f.dev, (ctx) => encodeKvAppend(ctx, { rows: nb, pos0: CONTEXT, x: f.rows(nb, qsa.head_dim), cache: ik }));
        const iq = f.rows(nb, qsa.heads * qsa.head_dim);
        const iw = f.rows(nb, qsa.heads);
        const scores = { buffer: f.buffer(qsaScoreBytes(nb, CONTEXT)), offset: 0, stride: (CONTEXT + nb) * 4 };
        const selected = f.buffer(nb * qsa.topk * 4);
        const counts = f.buffer(nb * 4);
        return (ctx) => encodeQsa(ctx, { rows: nb, pos0: CONTEXT, topk: qsa.topk, iq, iw, heads: qsa.heads, ik, scores, selected, counts });
      },
    },
    // Past the top-k, where the selection switches on (the cases above run at CONTEXT, under
    // it at the large presets): rows at positions context .. context + nb - 1, so every row
    // selects; e.g. --preset 30b-a3b-shape --storage device --nb 1,256 --filter "QSA selection".
    ...QSA_CONTEXTS.map((context) => ({
      name: `QSA selection, context ${context}`,
      kernels: [`qsa_scores_${at.kv_cache}`, "qsa_topk_f32"],
      shape: `${qsa.heads} x ${qsa.head_dim} ${at.kv_cache}, topk ${qsa.topk}`,
      setup(nb: number) {
        const longest = context + nb;
        const ik = allocateKvCache(f.dev, at.kv_cache, 1, qsa.head_dim, longest, STORAGE);
        const keys = f.rows(Math.min(longest, MAX_NB), qsa.head_dim);
        for (let p0 = 0; p0 < longest; p0 += MAX_NB)
          runOnce(f.dev, (ctx) => encodeKvAppend(ctx, { rows: Math.min(MAX_NB, longest - p0), pos0: p0, x: keys, cache: ik }));
        const iq = f.rows(nb, qsa.heads * qsa.head_dim);
        const iw = f.rows(nb, qsa.heads);
        const scores = { buffer: f.buffer(qsaScoreBytes(nb, context)), offset: 0, stride: longest * 4 };
        const selected = f.buffer(nb * qsa.topk * 4);
        const counts = f.buffer(nb * 4);
        return (ctx: EncodeContext) => encodeQsa(ctx, { rows: nb, pos0: context, topk: qsa.topk, iq, iw, heads: qsa.heads, ik, scores, selected, counts });
      },
      // The index keys (codes and scales) and q read, the scores written and read back once.
      bytes: (nb: number) => (context + nb) * (qsa.head_dim + 4) + nb * qsa.heads * (qsa.head_dim + 1) * 4 + 2 * nb * (context + nb) * 4,
      flops: (nb: number) => 2 * qsa.heads * qsa.head_dim * (nb * context + (nb * (nb + 1)) / 2),
    })),
    {
      name: "attention (causal)",
      kernels: [`attn_rows_${at.kv_cache}`],
      shape: `${at.heads} / ${at.kv_heads} heads x ${hd}, context ${CONTEXT}`,
      setup(nb) {
        const k = fillCache(at.kv_heads, hd);
        const v = fillCache(at.kv_heads, hd);
        const q = f.rows(nb, D.attnQ);
        const o = f.rows(nb, D.attnQ);
        const args = { rows: nb, pos0: CONTEXT, heads: at.heads, q, k, v, o, tiles: false };
        const { splits } = attentionSplits(args);
        const partials = f.buffer(Math.max(4, attentionPartialBytes(nb, at.heads, hd, splits)));
        return (ctx) => encodeAttention(ctx, { ...args, partials });
      },
    },
    // A prompt chunk's attention (issue 19): attn_tiles (the tile API) against attn_rows, as the
    // first chunk (pos0 0) and as a second one after 1,024 positions.
    ...[0, 1024].flatMap((pos0) =>
      [true, false].map((tiles) => ({
        name: `attention (prefill, pos0 ${pos0}), ${tiles ? "tiles" : "rows"}`,
        kernels: [tiles ? (hd > 128 ? "attn_tiles_wide_q8" : `attn_tiles_${at.kv_cache}`) : `attn_rows_${at.kv_cache}`],
        shape: `${at.heads} / ${at.kv_heads} heads x ${hd}, positions ${pos0}..`,
        setup(nb: number) {
          if (nb === 1) return null; // one row is decode's attention ("attention (causal)")
          const k = allocateKvCache(f.dev, at.kv_cache, at.kv_heads, hd, pos0 + nb);
          const v = allocateKvCache(f.dev, at.kv_cache, at.kv_heads, hd, pos0 + nb);
          const src = f.rows(MAX_NB, at.kv_heads * hd);
          for (let p0 = 0; p0 < pos0 + nb; p0 += MAX_NB) {
            const rows = Math.min(MAX_NB, pos0 + nb - p0);
            runOnce(f.dev, (ctx) => [k, v].forEach((cache) => encodeKvAppend(ctx, { rows, pos0: p0, x: src, cache })));
          }
          const args = { rows: nb, pos0, heads: at.heads, q: f.rows(nb, D.attnQ), k, v, o: f.rows(nb, D.attnQ), tiles };
          return (ctx: EncodeContext) => encodeAttention(ctx, args);
        },
        // q k and p v over every (row, position <= its own) pair.
        flops: (nb: number) => 4 * at.heads * hd * (nb * pos0 + (nb * (nb + 1)) / 2),
      })),
    ),
    {
      name: "PLE gather",
      kernels: ["ple_gather_bf16"],
      shape: `${ple.orders.length * ple.heads} tables x ${ple.head_dim} bf16`,
      setup(nb) {
        const tables = ple.orders.flatMap((_, o) => ple.rows[o]!.map((rowsOfTable) => f.weight([rowsOfTable, ple.head_dim], "bf16", 1)));
        const sizes = tables.map((t) => tensorBytes(t.shape, "bf16"));
        const buffer = f.buffer(sizes.reduce((a, b) => a + Math.ceil(b / 256) * 256, 0));
        const offsets: number[] = [];
        let cursor = 0;
        tables.forEach((t, i) => {
          offsets.push(cursor);
          buffer.bytes.set(t.buffer.bytes.subarray(256, 256 + sizes[i]!), cursor);
          cursor += Math.ceil(sizes[i]! / 256) * 256;
        });
        buffer.upload();
        const history = Math.max(...ple.orders) - 1;
        const tokens = f.i32(Array.from({ length: history + nb }, (_, i) => (i * 13) % cfg.vocab_size));
        const e = f.rows(nb, D.pleEmbed);
        const rowIds = f.buffer(nb * tables.length * 4);
        return (ctx) => encodePleGather(ctx, { rows: nb, pos0: CONTEXT, ple, tokens, history, tables: { buffer, dtype: "bf16", offsets }, e, rowIds });
      },
    },
    {
      name: "PLE gate",
      kernels: ["ple_gate_f32"],
      shape: `${d}`,
      setup(nb) {
        const [k, q, vIn, v, u] = [f.rows(nb, d), f.rows(nb, d), f.rows(nb, d), f.rows(nb, d), f.rows(nb, d)];
        const vBias = f.weight([d], "f32");
        const convNorm = f.weight([d], "f32");
        return (ctx) => encodePleGate(ctx, { rows: nb, dim: d, eps: cfg.rms_norm_eps, k, q, vIn, vBias, convNorm, v, u });
      },
    },
    {
      name: "PLE conv (+ into streams)",
      kernels: ["ple_conv_f32"],
      shape: `${d}, K ${ple.conv_kernel}, dilation ${D.pleDilation}, ${n} streams`,
      setup(nb) {
        const weight = f.weight([d, ple.conv_kernel], "f32");
        const [u, v] = [f.rows(nb, d), f.rows(nb, d)];
        const history = f.buffer(pleHistoryFloats(d, ple.conv_kernel, D.pleDilation) * 4);
        const x = f.rows(nb, n * d);
        return (ctx) => encodePleConv(ctx, { rows: nb, dim: d, dilation: D.pleDilation, weight, u, v, history, x, streams: n, streamStride: d * 4 });
      },
    },
  ];
}

function runOnce(dev: Device, encode: (ctx: EncodeContext) => void, names?: string[]): void {
  const cb = dev.commandBuffer();
  try {
    // With `names`: the pipelines the encode dispatched, in order (the table's kernels column).
    const ctx = { device: dev, cb };
    encode(names ? recordingNames(ctx, names) : ctx);
    cb.commit().waitUntilCompleted(120_000);
  } finally {
    cb.release();
  }
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

/** The most copies a timed command buffer takes when the count adapts (runBench's minMs). */
const MAX_REPS = 400;

/**
 * minMs: when set, the copies per timed buffer grow from `reps` until one buffer of them lasts
 * about minMs (estimated from a run of `reps` copies, whose fixed cost makes it an
 * overestimate per copy, so the count errs low), up to MAX_REPS.
 */
export function runBench(opts: { nbs: number[]; iters: number; reps: number; filter?: string; minMs?: number; warmupMs?: number }): BenchResult[] {
  const dev = Device.open();
  const f = new Fixture(dev);
  const out: BenchResult[] = [];
  try {
    for (const c of [...cases(f), ...sequenceCases(f)]) {
      if (opts.filter && !opts.filter.split("|").some((f) => c.name.includes(f))) continue;
      if (c.name === "shared expert" && !SI) continue; // the preset has none (30b-a3b-shape)
      for (const nb of opts.nbs) {
        const encode = c.setup(nb);
        if (!encode) continue;
        const copies = (n: number) => (ctx: EncodeContext) => {
          for (let r = 0; r < n; r++) encode(ctx);
        };
        const timed = (run: (ctx: EncodeContext) => void) => {
          const t0 = performance.now();
          runOnce(dev, run);
          return (performance.now() - t0) * 1000;
        };
        // Warm-up: pipelines and caches, and on cuda a graph per shape (built on its second sight).
        const names: string[] = [];
        runOnce(dev, encode, names);
        let reps = opts.reps;
        if (opts.minMs) {
          runOnce(dev, copies(reps));
          reps = Math.min(MAX_REPS, Math.max(reps, Math.ceil((opts.minMs * 1000 * reps) / timed(copies(reps)))));
        }
        const [one, two] = [copies(reps), copies(2 * reps)];
        for (let w = 0; w < 2; w++) for (const run of [one, two]) runOnce(dev, run);
        // Busy for warmupMs before the timed runs, as a GPU is in a decode step: timed straight
        // after its set-up (the GPU idle while the host made the case's weights), a kernel ran
        // up to 80% slower on the H200 with its SM clock unchanged (cause not known).
        for (const t0 = performance.now(); performance.now() - t0 < (opts.warmupMs ?? 0); ) runOnce(dev, two);
        const [t1, t2]: number[][] = [[], []];
        for (let i = 0; i < opts.iters; i++) {
          t1.push(timed(one));
          t2.push(timed(two));
        }
        // reps more copies cost (fastest 2R run - fastest R run); the fixed cost is what is left.
        const us = Math.max(0, (Math.min(...t2) - Math.min(...t1)) / reps);
        const medianUs = Math.max(0, (median(t2) - median(t1)) / reps);
        const overheadUs = Math.max(0, Math.min(...t1) - us * reps);
        const bytes = c.bytes?.(nb);
        const flops = c.flops?.(nb);
        out.push({
          name: c.name,
          kernels: names.length > 0 ? [...new Set(names)] : c.kernels,
          shape: c.shape,
          nb,
          reps,
          us,
          medianUs,
          overheadUs,
          bytes,
          gbPerS: bytes === undefined ? undefined : bytes / us / 1000,
          flops,
          tflops: flops === undefined ? undefined : flops / us / 1e6,
        });
      }
    }
  } finally {
    dev.close();
  }
  return out;
}

function table(results: BenchResult[], nbs: number[]): string {
  const names = [...new Set(results.map((r) => r.name))];
  // Bandwidth columns are relative to the stream case's (this backend's memory-bound ceiling).
  const stream = results.find((r) => r.name.startsWith("stream") && r.gbPerS !== undefined)?.gbPerS;
  const rates = results.some((r) => r.tflops !== undefined);
  const head = [
    "case",
    "kernels",
    "shape",
    ...nbs.map((nb) => `nb=${nb} (us)`),
    ...nbs.map((nb) => `nb=${nb} GB/s (% stream)`),
    ...(rates ? nbs.map((nb) => `nb=${nb} TFLOP/s`) : []),
  ];
  const bw = (r: BenchResult | undefined) =>
    r?.gbPerS === undefined ? "" : `${r.gbPerS.toFixed(r.gbPerS < 10 ? 2 : 0)}${stream ? ` (${((100 * r.gbPerS) / stream).toFixed(0)}%)` : ""}`;
  const rate = (r: BenchResult | undefined) => (r?.tflops === undefined ? "" : r.tflops.toFixed(r.tflops < 1 ? 3 : 1));
  const body = names.map((name) => {
    const rs = results.filter((r) => r.name === name);
    const at = (nb: number) => rs.find((r) => r.nb === nb);
    return [
      name,
      rs[0]!.kernels.join(" + "),
      rs[0]!.shape,
      ...nbs.map((nb) => at(nb)?.us.toFixed(1) ?? ""),
      ...nbs.map((nb) => bw(at(nb))),
      ...(rates ? nbs.map((nb) => rate(at(nb))) : []),
    ];
  });
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((row) => row[i]!.length)));
  const line = (row: string[]) => row.map((v, i) => (i >= 3 ? v.padStart(widths[i]!) : v.padEnd(widths[i]!))).join("  ");
  return [line(head), widths.map((w) => "-".repeat(w)).join("  "), ...body.map(line)].join("\n");
}

if (import.meta.main) {
  const args = argv;
  const value = argValue;
  const nbs = (value("--nb") ?? "1,32").split(",").map(Number);
  if (nbs.some((x) => !Number.isInteger(x) || x < 1)) throw new Error(`--nb: expected row counts like 1,32`);
  const iters = Number(value("--iters") ?? 5);
  const reps = Number(value("--reps") ?? 10);
  const minMs = value("--reps") === undefined ? Number(value("--min-ms") ?? 2) : 0;
  // Warm by default (not in the profiler's --reps form): timed straight after its set-up, the
  // H200's [8192, 2048] took 6.8-10.0 us a copy where 300 ms busy first gave 5.3-5.6, its SM
  // clock at 1,980 MHz throughout (docs/performance.md, seventeenth run).
  const warmupMs = Number(value("--warmup-ms") ?? (value("--reps") === undefined ? 300 : 0));
  if (!(warmupMs >= 0)) throw new Error("--warmup-ms: expected a duration in milliseconds");
  if (!Number.isInteger(iters) || iters < 1 || !Number.isInteger(reps) || reps < 1) throw new Error("--iters and --reps: expected positive integers");
  if (!(minMs >= 0)) throw new Error("--min-ms: expected a duration in milliseconds (0: exactly --reps copies)");
  const results = runBench({ nbs, iters, reps, filter: value("--filter"), minMs, warmupMs });
  if (args.includes("--json")) {
    console.log(JSON.stringify({ preset: PRESET, storage: STORAGE, backend: process.env.CHERENKOV_BACKEND ?? "default", results }, null, 2));
  } else {
    const copiesNote = minMs > 0 ? `${reps}-${MAX_REPS} copies a buffer, as many as last ${minMs} ms` : `${reps} copies a buffer`;
    console.log(`Kernel times at presetConfig("${PRESET}") shapes (d ${d}, n ${n}), ${STORAGE} storage; fastest of ${iters} runs (${copiesNote}), per dispatch group:\n`);
    console.log(table(results, nbs));
  }
}
