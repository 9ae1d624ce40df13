// Param structs of the dense kernel families (kernels/{embed,norm,hc,matvec,moe,output}.metal).
// Plain data: params.ts lays them out and checks them. Rules are in params.ts's header.
import type { ParamFamily } from "./params.ts";

export const denseParams = {
  RmsNorm: {
    doc: "RMSNorm over row batches: y = x * rsqrt(mean(x^2) + eps) * w.",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "cols", type: "i32", doc: "elements per row" },
      { name: "eps", type: "f32" },
      { name: "_pad0", type: "u32" },
      { name: "x_stride", type: "u64", doc: "bytes between input rows" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows" },
    ],
  },
  Matvec: {
    doc: "Row-batched matrix-vector product y[r] = W x[r] over a weight matrix in a bound buffer.",
    fields: [
      { name: "rows", type: "i32", doc: "rows in the batch (nb)" },
      { name: "in_dim", type: "i32" },
      { name: "out_dim", type: "i32" },
      { name: "_pad0", type: "u32" },
      { name: "w_offset", type: "u64", doc: "byte offset of W in its buffer" },
      { name: "x_stride", type: "u64", doc: "bytes between input rows" },
      { name: "y_stride", type: "u64", doc: "bytes between output rows" },
    ],
  },
} as const satisfies ParamFamily;
