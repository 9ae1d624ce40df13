// Param structs of the dense kernel families (kernels/{embed,norm,hc,matvec,moe,output,
// elementwise}.metal). Plain data: params.ts lays them out and checks them. Rules are in
// params.ts's header. Weights are bound at their tensor's byte offset (a binding offset), so
// structs carry no weight offsets except inside an expert record.
import type { ParamFamily } from "./params.ts";

export const denseParams = {
  Embed: {
    doc: "Embedding gather: y[r][i] = table[ids[r]] for every stream i < streams.",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "cols", type: "i32", doc: "hidden size d" },
      { name: "streams", type: "i32", doc: "residual streams n the row is copied into" },
      { name: "vocab", type: "i32", doc: "table rows; an id outside [0, vocab) writes NaN" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows" },
      { name: "stream_stride", type: "u64", doc: "bytes between streams of one output row" },
    ],
  },
  RmsNorm: {
    doc: "RMSNorm of `heads` vectors of `dim` per row: y = x * rsqrt(mean(x^2) + eps) * (centred ? 1 + w : w) [* SiLU(z) when gated].",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "heads", type: "i32", doc: "vectors per row (1 for a whole-row norm)" },
      { name: "dim", type: "i32", doc: "elements per vector; vector h of a row starts at h * dim" },
      { name: "centred", type: "u32", doc: "1: scale by (1 + w) (zero-centred), 0: by w (plain)" },
      { name: "eps", type: "f32" },
      { name: "_pad0", type: "u32" },
      { name: "x_stride", type: "u64", doc: "bytes between input rows" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows" },
      { name: "z_stride", type: "u64", doc: "bytes between gate rows (gated form only)" },
    ],
  },
  HalfSet: {
    doc: "HalfSet prep: per row, the even and odd elements of x and its per-32 group sums (q4 matvec input).",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "cols", type: "i32", doc: "elements per row (a multiple of 32)" },
      { name: "x_stride", type: "u64", doc: "bytes between input rows" },
      { name: "h_stride", type: "u64", doc: "bytes between HalfSet rows" },
    ],
  },
  Matvec: {
    doc: "Row-batched matrix-vector product y[r] = W x[r] (+ y[r] when accumulating); W [out_dim, in_dim] bound at its offset.",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "in_dim", type: "i32" },
      { name: "out_dim", type: "i32" },
      { name: "accumulate", type: "u32", doc: "1: y += W x, 0: y = W x" },
      { name: "rows_per_group", type: "i32", doc: "batch rows one threadgroup serves (its weights are read once for them)" },
      { name: "_pad0", type: "u32" },
      { name: "x_stride", type: "u64", doc: "bytes between input rows (HalfSet rows for q4)" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows" },
    ],
  },
  HcCoeffs: {
    doc: "Hyper-connection coefficients per row from the raw fn . flat products: pre, post and Sinkhorn comb (site) or pre only (head).",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "streams", type: "i32", doc: "n" },
      { name: "cols", type: "i32", doc: "hidden size d" },
      { name: "head", type: "u32", doc: "1: final read (n mixes, pre only), 0: a site (2n + n*n mixes)" },
      { name: "iters", type: "i32", doc: "hc.sinkhorn_iters" },
      { name: "eps", type: "f32", doc: "hc.eps" },
      { name: "x_stride", type: "u64", doc: "bytes between rows of the streams X [nb][n][d]" },
      { name: "raw_stride", type: "u64", doc: "bytes between rows of the raw products" },
      { name: "c_stride", type: "u64", doc: "bytes between coefficient rows (pre | post | comb)" },
    ],
  },
  HcRead: {
    doc: "Hyper-connection read x[r] = sum_i pre_i X[r][i], optionally followed by RMSNorm(x, w).",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "streams", type: "i32", doc: "n" },
      { name: "cols", type: "i32", doc: "hidden size d" },
      { name: "centred", type: "u32", doc: "norm weight: 1 zero-centred, 0 plain" },
      { name: "eps", type: "f32", doc: "rms_norm_eps (normalising form)" },
      { name: "_pad0", type: "u32" },
      { name: "x_stride", type: "u64", doc: "bytes between rows of X" },
      { name: "c_stride", type: "u64", doc: "bytes between coefficient rows (pre first)" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows" },
    ],
  },
  HcWrite: {
    doc: "Hyper-connection write, in place: X'[r][j] = post_j y[r] + sum_i comb[i][j] X[r][i].",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "streams", type: "i32", doc: "n" },
      { name: "cols", type: "i32", doc: "hidden size d" },
      { name: "_pad0", type: "u32" },
      { name: "x_stride", type: "u64", doc: "bytes between rows of X" },
      { name: "c_stride", type: "u64", doc: "bytes between coefficient rows (pre | post | comb)" },
      { name: "y_stride", type: "u64", doc: "bytes between rows of the sub-layer output" },
    ],
  },
  Elementwise: {
    doc: "Elementwise op over [rows][cols]: y = f(a, b) (add, SiLU(a) * b, a * sigmoid(b), a + scale * b). y may be a.",
    fields: [
      { name: "rows", type: "i32" },
      { name: "cols", type: "i32" },
      { name: "scale", type: "f32", doc: "scale_add's factor" },
      { name: "_pad0", type: "u32" },
      { name: "a_stride", type: "u64", doc: "bytes between rows of a" },
      { name: "b_stride", type: "u64", doc: "bytes between rows of b" },
      { name: "y_stride", type: "u64", doc: "bytes between rows of y" },
    ],
  },
  Router: {
    doc: "Router per row: softmax over the expert logits, top-k (ties: lower id), weights p_k or p_k / sum.",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "experts", type: "i32", doc: "E (at most 1024)" },
      { name: "top_k", type: "i32" },
      { name: "norm_topk", type: "u32", doc: "1: divide the chosen p by their sum" },
      { name: "logits_stride", type: "u64", doc: "bytes between logit rows" },
    ],
  },
  MoeLists: {
    doc: "Groups the (row, k) pairs of a step by expert: offsets[E + 1] and pairs sorted by expert.",
    fields: [
      { name: "pairs", type: "i32", doc: "nb * top_k" },
      { name: "experts", type: "i32", doc: "E (at most 1024)" },
    ],
  },
  MoeExperts: {
    doc: "Routed experts through the slot table: pool slot s holds a record at s * record_stride; parts at their offsets.",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "top_k", type: "i32" },
      { name: "in_dim", type: "i32", doc: "d for gate/up, I for down" },
      { name: "out_dim", type: "i32", doc: "I for gate/up, d for down" },
      { name: "experts", type: "i32", doc: "E" },
      { name: "slots", type: "i32", doc: "slots in the pool; a slot outside [0, slots) counts as missing" },
      { name: "record_stride", type: "u64", doc: "bytes between pool slots" },
      { name: "w0_offset", type: "u64", doc: "gate part (gate_up) or down part (down) inside a record" },
      { name: "w1_offset", type: "u64", doc: "up part inside a record (gate_up only)" },
      { name: "x_stride", type: "u64", doc: "bytes between input rows: per batch row (gate_up), per pair (down)" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows (per pair)" },
    ],
  },
  MoeCombine: {
    doc: "MoE output y[r] = sum_k w[r][k] o[r*k + k'] (+ sigmoid(sg[r]) s[r] with the shared expert).",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "top_k", type: "i32" },
      { name: "cols", type: "i32", doc: "d" },
      { name: "_pad0", type: "u32" },
      { name: "o_stride", type: "u64", doc: "bytes between per-pair expert outputs" },
      { name: "s_stride", type: "u64", doc: "bytes between shared expert output rows" },
      { name: "sg_stride", type: "u64", doc: "bytes between shared gate logits" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows" },
    ],
  },
  Argmax: {
    doc: "Greedy pick per row: the index of the largest value (ties: lowest), and top1 - top2.",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "cols", type: "i32", doc: "vocabulary size" },
      { name: "x_stride", type: "u64", doc: "bytes between logit rows" },
    ],
  },
  MtpFuse: {
    doc: "MTP input: y[r] = [RMSNorm(embed[ids[r]], en) | RMSNorm(h[r], hn)] (embedding first), [nb][2d].",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "cols", type: "i32", doc: "hidden size d" },
      { name: "vocab", type: "i32" },
      { name: "eps", type: "f32", doc: "rms_norm_eps" },
      { name: "h_stride", type: "u64", doc: "bytes between hidden rows" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows" },
    ],
  },
} as const satisfies ParamFamily;
