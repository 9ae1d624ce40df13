// Param structs of the sequence kernel families (kernels/{conv,deltanet,rope,kv,qsa,attention,ple}.metal).
// Plain data: params.ts lays them out and checks them. Rules are in params.ts's header.
// Row batches are nb consecutive positions pos0 .. pos0+nb-1; `snap_rows` > 0 asks a
// kernel that carries per-sequence state to store that state after each of its first
// snap_rows rows into snapshot planes (lib/gpu/snapshots.ts), for rollback.
import type { ParamFamily } from "./params.ts";

/** Largest rotary dim the RoPE table in RopeParams holds (rd/2 frequency pairs). */
export const ROPE_MAX_PAIRS = 128;
/** PLE: at most this many (order, head) tables per layer, each of order at most PLE_MAX_ORDER. */
export const PLE_MAX_TABLES = 16;
export const PLE_MAX_ORDER = 4;
/** Longest conv window a kernel keeps in registers, (K-1) * dilation (SEQ_CONV_MAX_SPAN in kernels/sequence.h). */
export const CONV_MAX_SPAN = 32;
/** Largest head/key dim of the kernels that give each SIMD lane up to 8 values (SEQ_MAX_PER_LANE * 32). */
export const SEQ_MAX_HEAD_DIM = 256;

export const sequenceParams = {
  Conv: {
    doc: "Causal depthwise conv + SiLU over the DeltaNet qkv channels, one thread per channel, rows in order.",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "channels", type: "i32" },
      { name: "taps", type: "i32", doc: "kernel size K; the state holds the last K-1 inputs" },
      { name: "snap_rows", type: "i32", doc: "store the window after each of the first snap_rows rows (0: none)" },
      { name: "x_stride", type: "u64", doc: "bytes between input rows" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows" },
      { name: "plane_stride", type: "u64", doc: "bytes between snapshot planes" },
    ],
  },
  DeltaNet: {
    doc: "Gated DeltaNet recurrence over nb rows: one simdgroup per (value head, state column).",
    fields: [
      { name: "rows", type: "i32" },
      { name: "key_heads", type: "i32" },
      { name: "key_dim", type: "i32" },
      { name: "value_heads", type: "i32" },
      { name: "value_dim", type: "i32" },
      { name: "snap_rows", type: "i32", doc: "store S after each of the first snap_rows rows (0: none)" },
      { name: "q_scale", type: "f32", doc: "key_dim^-0.5" },
      { name: "l2_eps", type: "f32", doc: "eps of the q/k L2 normalisation (1e-6)" },
      { name: "qkv_stride", type: "u64", doc: "bytes between rows of the conv output [q | k | v]" },
      { name: "b_stride", type: "u64", doc: "bytes between rows of b (beta logits)" },
      { name: "a_stride", type: "u64", doc: "bytes between rows of a (decay inputs)" },
      { name: "o_stride", type: "u64", doc: "bytes between output rows" },
      { name: "plane_stride", type: "u64", doc: "bytes between snapshot planes" },
    ],
  },
  DeltaNetConv: {
    doc: "DeltaNet with the causal conv + SiLU formed where the recurrence reads q, k, v (the window only read).",
    fields: [
      { name: "rows", type: "i32" },
      { name: "key_heads", type: "i32" },
      { name: "key_dim", type: "i32" },
      { name: "value_heads", type: "i32" },
      { name: "value_dim", type: "i32" },
      { name: "snap_rows", type: "i32", doc: "store S after each of the first snap_rows rows (0: none)" },
      { name: "q_scale", type: "f32", doc: "key_dim^-0.5" },
      { name: "l2_eps", type: "f32", doc: "eps of the q/k L2 normalisation (1e-6)" },
      { name: "taps", type: "i32", doc: "conv kernel size K; the window holds the last K-1 inputs" },
      { name: "_pad0", type: "u32" },
      { name: "qkv_stride", type: "u64", doc: "bytes between rows of the projection [q | k | v] (before the conv)" },
      { name: "b_stride", type: "u64", doc: "bytes between rows of b (beta logits)" },
      { name: "a_stride", type: "u64", doc: "bytes between rows of a (decay inputs)" },
      { name: "o_stride", type: "u64", doc: "bytes between output rows" },
      { name: "plane_stride", type: "u64", doc: "bytes between snapshot planes of S" },
    ],
  },
  DeltaNetTail: {
    doc: "Gated RMSNorm of the DeltaNet output per value head, and the conv window's advance over the rows.",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "heads", type: "i32", doc: "value heads per row" },
      { name: "dim", type: "i32", doc: "value dim (the norm weight's length)" },
      { name: "channels", type: "i32", doc: "conv channels C" },
      { name: "taps", type: "i32", doc: "conv kernel size K" },
      { name: "snap_rows", type: "i32", doc: "store the window after each of the first snap_rows rows (0: none)" },
      { name: "eps", type: "f32" },
      { name: "_pad0", type: "u32" },
      { name: "o_stride", type: "u64", doc: "bytes between rows of o" },
      { name: "y_stride", type: "u64", doc: "bytes between rows of y (may be o)" },
      { name: "z_stride", type: "u64", doc: "bytes between gate rows" },
      { name: "x_stride", type: "u64", doc: "bytes between rows of the conv input" },
      { name: "plane_stride", type: "u64", doc: "bytes between snapshot planes of the window" },
    ],
  },
  SnapshotRestore: {
    doc: "Copies two float regions (a snapshot plane back into live state); bindings carry the offsets.",
    fields: [
      { name: "n0", type: "i32", doc: "floats of region 0" },
      { name: "n1", type: "i32", doc: "floats of region 1 (0: none)" },
    ],
  },
  Rope: {
    doc: "NeoX rotate-half RoPE in place on q [nb][q_heads][head_dim] and k [nb][k_heads][head_dim].",
    fields: [
      { name: "rows", type: "i32" },
      { name: "q_heads", type: "i32" },
      { name: "k_heads", type: "i32" },
      { name: "head_dim", type: "i32" },
      { name: "rot_dim", type: "i32", doc: "rotated dims rd (even); pair (i, i + rd/2)" },
      { name: "pos0", type: "i32", doc: "position of row 0" },
      { name: "q_stride", type: "u64", doc: "bytes between q rows" },
      { name: "k_stride", type: "u64", doc: "bytes between k rows" },
      { name: "inv_freq", type: "f32", count: ROPE_MAX_PAIRS, doc: "theta^(-2i/rd) by the f32 rule of lib/model/rope.ts" },
    ],
  },
  AttnPrep: {
    doc: "Per decode/prefill row: q and k per-head RMSNorm, RoPE on both, then the K (normed, rotated) and V appends at pos0.., and QSA's index key normed and appended (one dispatch).",
    fields: [
      { name: "rows", type: "i32" },
      { name: "q_heads", type: "i32" },
      { name: "kv_heads", type: "i32" },
      { name: "head_dim", type: "i32", doc: "of q, k, v and the two norm weights" },
      { name: "rot_dim", type: "i32", doc: "rotated dims rd (even); pair (i, i + rd/2)" },
      { name: "pos0", type: "i32", doc: "position of row 0" },
      { name: "centred", type: "u32", doc: "1: norms scale by (1 + w), 0: by w" },
      { name: "eps", type: "f32" },
      { name: "q_stride", type: "u64", doc: "bytes between q rows (normed and rotated in place)" },
      { name: "k_stride", type: "u64", doc: "bytes between k rows (normed and rotated in place)" },
      { name: "v_stride", type: "u64", doc: "bytes between v rows" },
      { name: "ik_stride", type: "u64", doc: "bytes between QSA index-key rows (normed in place; ik_dim > 0)" },
      { name: "ik_dim", type: "i32", doc: "QSA index-key width: one more vector a row, normed and appended to the ik cache, not rotated (0: none)" },
      { name: "inv_freq", type: "f32", count: ROPE_MAX_PAIRS, doc: "theta^(-2i/rd) by the f32 rule of lib/model/rope.ts" },
      { name: "_pad0", type: "u32" },
    ],
  },
  KvAppend: {
    doc: "Writes nb rows of heads x dim vectors into a cache at positions pos0.. (q8 codes + scales, or f32).",
    fields: [
      { name: "rows", type: "i32" },
      { name: "heads", type: "i32" },
      { name: "dim", type: "i32" },
      { name: "pos0", type: "i32" },
      { name: "x_stride", type: "u64", doc: "bytes between input rows" },
    ],
  },
  QsaScores: {
    doc: "QSA index scores: score(t, s) = sum_h iw_h relu(iq_h . ik_s) / sqrt(di) for s <= pos0 + t.",
    fields: [
      { name: "rows", type: "i32" },
      { name: "heads", type: "i32", doc: "index heads Hi" },
      { name: "head_dim", type: "i32", doc: "di" },
      { name: "pos0", type: "i32" },
      { name: "topk", type: "i32", doc: "rows with pos + 1 <= topk are skipped (they attend everywhere)" },
      { name: "norm", type: "f32", doc: "sqrt(di)" },
      { name: "iq_stride", type: "u64" },
      { name: "iw_stride", type: "u64" },
      { name: "score_stride", type: "u64", doc: "bytes between score rows" },
    ],
  },
  QsaTopk: {
    doc: "Per row: the topk highest-scoring positions (ties: lower s), ascending; every position when pos + 1 <= topk.",
    fields: [
      { name: "rows", type: "i32" },
      { name: "topk", type: "i32" },
      { name: "pos0", type: "i32" },
      { name: "_pad0", type: "u32" },
      { name: "score_stride", type: "u64" },
    ],
  },
  Attention: {
    doc: "Softmax attention of nb rows over cached K/V (causal, or a selected-position list), split over positions.",
    fields: [
      { name: "rows", type: "i32" },
      { name: "heads", type: "i32" },
      { name: "kv_heads", type: "i32" },
      { name: "head_dim", type: "i32" },
      { name: "pos0", type: "i32" },
      { name: "use_list", type: "i32", doc: "1: row t reads positions list[t][0 .. counts[t]); 0: all s <= pos0 + t" },
      { name: "list_stride", type: "i32", doc: "entries between list rows (topk)" },
      { name: "split_len", type: "i32", doc: "positions per split" },
      { name: "splits", type: "i32", doc: "splits per (row, head); 1 writes o directly, else partials for the combine" },
      { name: "scale", type: "f32", doc: "1/sqrt(head_dim)" },
      { name: "q_stride", type: "u64" },
      { name: "o_stride", type: "u64" },
      { name: "gate_stride", type: "u64", doc: "bytes between gate rows (gated only)" },
      { name: "gated", type: "i32", doc: "1: o = attention / (1 + e^-gate) (the output gate; with one split)" },
      { name: "_pad0", type: "u32" },
    ],
  },
  AttentionCombine: {
    doc: "Merges the per-split partial softmax results (max, sum, acc[hd]) of Attention into o.",
    fields: [
      { name: "rows", type: "i32" },
      { name: "heads", type: "i32" },
      { name: "head_dim", type: "i32" },
      { name: "splits", type: "i32" },
      { name: "o_stride", type: "u64" },
      { name: "gate_stride", type: "u64", doc: "bytes between gate rows (gated only)" },
      { name: "gated", type: "i32", doc: "1: o = attention / (1 + e^-gate) (the output gate)" },
      { name: "_pad0", type: "u32" },
    ],
  },
  PleGather: {
    doc: "PLE n-gram hash of each row and table, and the gather of the table rows into e [nb][tables * head_dim].",
    fields: [
      { name: "rows", type: "i32" },
      { name: "tables", type: "i32", doc: "orders x heads, order-major" },
      { name: "head_dim", type: "i32" },
      { name: "pos0", type: "i32" },
      { name: "history", type: "i32", doc: "tokens before pos0 held at the start of the token buffer" },
      { name: "pad_id", type: "i32", doc: "token of positions < 0" },
      { name: "e_stride", type: "u64" },
      { name: "table_order", type: "u32", count: PLE_MAX_TABLES },
      { name: "table_rows", type: "u32", count: PLE_MAX_TABLES },
      { name: "table_mult", type: "u32", count: PLE_MAX_TABLES * PLE_MAX_ORDER, doc: "[table][i]" },
      { name: "table_offset", type: "u64", count: PLE_MAX_TABLES, doc: "byte offset of each table in the bound buffer" },
    ],
  },
  PleGate: {
    doc: "PLE gate and conv input: alpha from (k . q), v = alpha (W_v e + b_v), u = RMSNorm(v, conv_norm).",
    fields: [
      { name: "rows", type: "i32" },
      { name: "dim", type: "i32", doc: "d" },
      { name: "eps", type: "f32" },
      { name: "norm", type: "f32", doc: "sqrt(d)" },
      { name: "k_stride", type: "u64" },
      { name: "q_stride", type: "u64" },
      { name: "vin_stride", type: "u64", doc: "bytes between rows of W_v e (without bias)" },
      { name: "v_stride", type: "u64", doc: "bytes between rows of v (output)" },
      { name: "u_stride", type: "u64", doc: "bytes between rows of u (output)" },
      { name: "vec4", type: "u32", doc: "1: d % 4 == 0 and every row and vector 16-byte aligned (float4 loads)" },
      { name: "_pad0", type: "u32" },
    ],
  },
  PleConv: {
    doc: "PLE dilated causal conv with history: y = v + SiLU(conv(u)), added to every stream.",
    fields: [
      { name: "rows", type: "i32" },
      { name: "dim", type: "i32" },
      { name: "taps", type: "i32", doc: "kernel size K" },
      { name: "dilation", type: "i32" },
      { name: "streams", type: "i32" },
      { name: "snap_rows", type: "i32" },
      { name: "u_stride", type: "u64" },
      { name: "v_stride", type: "u64" },
      { name: "x_stride", type: "u64", doc: "bytes between rows of the streams X" },
      { name: "stream_stride", type: "u64", doc: "bytes between the streams of one row" },
      { name: "plane_stride", type: "u64" },
    ],
  },
} as const satisfies ParamFamily;
