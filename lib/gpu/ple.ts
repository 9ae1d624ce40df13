// PLE (n-gram memory) dispatch (docs/model.md, "PLE"): the hash + gather of table rows into
// e, the gate that turns (k, q, W_v e) into v and the conv input u, and the dilated causal
// conv with its per-sequence history whose output is added to every residual stream. The
// projections W_k e + b_k, W_v e, the mean of the streams and the two RMSNorms (k, q) are
// the dense kernels'. Row indices depend only on tokens: the host computes the same hash
// (lib/reference pleRowIndex) to prefetch table rows.
import type { ModelConfig } from "../model/config.ts";
import type { Binding, Buffer } from "../shim.ts";
import { bind, dispatch, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import { HC_MAX_STREAMS, SIMD_WIDTH } from "./limits.ts";
import { Params } from "./params.ts";
import { CONV_MAX_SPAN, PLE_MAX_ORDER, PLE_MAX_TABLES } from "./params-sequence.ts";
import { checkRows, checkVector } from "./projections.ts";
import { snapshotArgs, type SnapshotRequest } from "./snapshots.ts";

const at = (r: RowsRef): Binding => bind(r.buffer, r.offset);

/** One PLE layer's tables in a bound buffer (ple.bin): byte offsets per (order, head), order-major. */
export interface PleTablesRef {
  readonly buffer: Buffer;
  readonly dtype: "f32" | "bf16";
  readonly offsets: readonly number[];
}

export interface PleGatherArgs {
  rows: number;
  pos0: number;
  ple: NonNullable<ModelConfig["ple"]>;
  /** Token ids (i32) of positions pos0 - history .. pos0 + nb - 1. */
  tokens: Binding;
  /** Tokens before pos0 at the start of `tokens`: at least min(pos0, max order - 1). */
  history: number;
  tables: PleTablesRef;
  /** e [nb][tables * head_dim]. */
  e: RowsRef;
  /** Row index of each (row, table): u32 [nb][tables]. */
  rowIds: Binding;
}

/** The n-gram hash of every row and table, and the gather of the rows into e (one dispatch). */
export function encodePleGather(ctx: EncodeContext, a: PleGatherArgs): void {
  checkRows(a.rows, "ple gather");
  const p = a.ple;
  const tables = p.orders.length * p.heads;
  if (tables > PLE_MAX_TABLES) throw new Error(`ple gather: ${tables} tables (orders x heads) exceed ${PLE_MAX_TABLES}`);
  if (a.tables.offsets.length !== tables) throw new Error(`ple gather: ${a.tables.offsets.length} table offsets, expected ${tables}`);
  const maxOrder = Math.max(...p.orders);
  if (maxOrder > PLE_MAX_ORDER) throw new Error(`ple gather: order ${maxOrder} exceeds ${PLE_MAX_ORDER}`);
  if (a.history < Math.min(a.pos0, maxOrder - 1) || a.history > a.pos0)
    throw new RangeError(`ple gather: history ${a.history} must be in min(pos0, ${maxOrder - 1})..pos0 (pos0 ${a.pos0})`);
  const offsets = new Array<number>(PLE_MAX_TABLES).fill(0);
  a.tables.offsets.forEach((o, i) => (offsets[i] = o));
  const order = new Array<number>(PLE_MAX_TABLES).fill(0);
  const rows = new Array<number>(PLE_MAX_TABLES).fill(1);
  const mult = new Array<number>(PLE_MAX_TABLES * PLE_MAX_ORDER).fill(0);
  p.orders.forEach((o, oi) => {
    for (let j = 0; j < p.heads; j++) {
      const tb = oi * p.heads + j;
      order[tb] = o;
      rows[tb] = p.rows[oi]![j]!;
      p.mult[oi]![j]!.forEach((m, i) => (mult[tb * PLE_MAX_ORDER + i] = m));
    }
  });
  const total = a.rows * tables * p.head_dim;
  const tg = 256;
  dispatch(
    ctx,
    a.tables.dtype === "bf16" ? "ple_gather_bf16" : "ple_gather_f32",
    Params.PleGather,
    {
      rows: a.rows,
      tables,
      head_dim: p.head_dim,
      pos0: a.pos0,
      history: a.history,
      pad_id: p.pad_id,
      e_stride: a.e.stride,
      table_order: order,
      table_rows: rows,
      table_mult: mult,
      table_offset: offsets,
    },
    [a.tokens, a.tables.buffer, at(a.e), a.rowIds],
    Math.ceil(total / tg),
    tg,
  );
}

export interface PleGateArgs {
  rows: number;
  dim: number;
  eps: number;
  /** k = RMSNorm(W_k e + b_k, k_norm) and q = RMSNorm(mean of streams, q_norm), [nb][d]. */
  k: RowsRef;
  q: RowsRef;
  /** W_v e without its bias, [nb][d]. */
  vIn: RowsRef;
  vBias: TensorRef;
  convNorm: TensorRef;
  /** Outputs v = alpha (W_v e + b_v) and u = RMSNorm(v, conv_norm), [nb][d]. */
  v: RowsRef;
  u: RowsRef;
}

/** The PLE gate, one simdgroup per row. */
export function encodePleGate(ctx: EncodeContext, a: PleGateArgs): void {
  checkRows(a.rows, "ple gate");
  checkVector(a.vBias, a.dim, "ple v_bias");
  checkVector(a.convNorm, a.dim, "ple conv_norm");
  const nsg = 4;
  dispatch(
    ctx,
    "ple_gate_f32",
    Params.PleGate,
    {
      rows: a.rows,
      dim: a.dim,
      eps: a.eps,
      norm: Math.sqrt(a.dim),
      k_stride: a.k.stride,
      q_stride: a.q.stride,
      vin_stride: a.vIn.stride,
      v_stride: a.v.stride,
      u_stride: a.u.stride,
      vec4: [a.k, a.q, a.vIn, a.v, a.u].every((r) => r.offset % 16 === 0 && r.stride % 16 === 0) && a.dim % 4 === 0 && a.vBias.offset % 16 === 0 && a.convNorm.offset % 16 === 0 ? 1 : 0,
    },
    [at(a.k), at(a.q), at(a.vIn), bind(a.vBias.buffer, a.vBias.offset), bind(a.convNorm.buffer, a.convNorm.offset), at(a.v), at(a.u)],
    Math.ceil(a.rows / nsg),
    SIMD_WIDTH * nsg,
  );
}

export interface PleConvArgs {
  rows: number;
  dim: number;
  /** Dilation: the largest PLE order. */
  dilation: number;
  /** Conv weights [d, K], f32. */
  weight: TensorRef;
  /** u (conv input) and v, [nb][d], from encodePleGate. */
  u: RowsRef;
  v: RowsRef;
  /** Live history [(K-1) dilation][d], oldest first; updated. */
  history: Binding;
  /** Residual streams X [nb][streams][d]: every stream += y. */
  x: RowsRef;
  streams: number;
  /** Bytes between the streams of a row (d * 4 when packed). */
  streamStride: number;
  snapshots?: SnapshotRequest;
}

/** Floats of one PLE layer's conv history. */
export const pleHistoryFloats = (dim: number, taps: number, dilation: number) => (taps - 1) * dilation * dim;

/** y = v + SiLU(dilated causal conv of u), added to every stream; one thread per channel. */
export function encodePleConv(ctx: EncodeContext, a: PleConvArgs): void {
  checkRows(a.rows, "ple conv");
  const [d, K] = a.weight.shape;
  if (a.weight.shape.length !== 2 || d !== a.dim) throw new Error(`ple conv: weight shape [${a.weight.shape.join(", ")}], expected [${a.dim}, K]`);
  checkVector(a.weight, d * K!, "ple conv");
  const span = (K! - 1) * a.dilation;
  if (!(a.dilation >= 1) || span > CONV_MAX_SPAN) throw new Error(`ple conv: (K-1) x dilation = ${span} exceeds ${CONV_MAX_SPAN}`);
  if (!Number.isInteger(a.streams) || a.streams < 1 || a.streams > HC_MAX_STREAMS) throw new Error(`ple conv: ${a.streams} streams, expected 1..${HC_MAX_STREAMS}`);
  const snap = snapshotArgs(a.snapshots, pleHistoryFloats(d, K!, a.dilation), a.rows, a.history, "ple conv");
  const tg = 256;
  dispatch(
    ctx,
    "ple_conv_f32",
    Params.PleConv,
    {
      rows: a.rows,
      dim: d,
      taps: K!,
      dilation: a.dilation,
      streams: a.streams,
      snap_rows: snap.snapRows,
      u_stride: a.u.stride,
      v_stride: a.v.stride,
      x_stride: a.x.stride,
      stream_stride: a.streamStride,
      plane_stride: snap.planeStride,
    },
    [at(a.u), at(a.v), bind(a.weight.buffer, a.weight.offset), a.history, at(a.x), snap.binding],
    Math.ceil(d / tg),
    tg,
  );
}
