// Encoding f32 values into a storage dtype and decoding them back: the one place that knows
// how each dtype's bytes look (q4 details live in q4.ts).
import type { DType } from "./config.ts";
import { bf16ToF32, f16ToF32, f32ToBf16, f32ToF16 } from "./dtype.ts";
import { dequantizeQ4, quantizeQ4 } from "./q4.ts";
import { numel, tensorBytes } from "./tensors.ts";

/** Writes `values` as `dtype` into `out` (tensorBytes(shape, dtype) bytes). */
export function encodeInto(values: Float32Array, dtype: DType, out: Uint8Array): void {
  const n = values.length;
  switch (dtype) {
    case "f32":
      out.set(new Uint8Array(values.buffer, values.byteOffset, n * 4));
      return;
    case "bf16":
    case "f16": {
      const aligned = out.byteOffset % 2 === 0;
      const dst = aligned ? new Uint16Array(out.buffer, out.byteOffset, n) : new Uint16Array(n);
      (dtype === "bf16" ? f32ToBf16 : f32ToF16)(values, dst);
      if (!aligned) out.set(new Uint8Array(dst.buffer));
      return;
    }
    case "q4":
      quantizeQ4(values, out);
      return;
  }
}

export function encode(values: Float32Array, shape: readonly number[], dtype: DType): Uint8Array {
  const out = new Uint8Array(tensorBytes(shape, dtype));
  encodeInto(values, dtype, out);
  return out;
}

/**
 * The f32 values of a tensor stored as `dtype` in `bytes`, written into `out` when given (it
 * must hold numel(shape) values: the reference's expert cache recycles evicted storage).
 */
export function decode(bytes: Uint8Array, shape: readonly number[], dtype: DType, out?: Float32Array): Float32Array {
  const n = numel(shape);
  if (out && out.length !== n) throw new Error(`decode: output holds ${out.length} values, shape [${shape.join(", ")}] has ${n}`);
  switch (dtype) {
    case "f32": {
      const src = bytes.byteOffset % 4 === 0 ? new Float32Array(bytes.buffer, bytes.byteOffset, n) : new Float32Array(bytes.slice(0, n * 4).buffer);
      if (out) return (out.set(src), out);
      return src.buffer === bytes.buffer ? src.slice() : src;
    }
    case "bf16":
      return bf16ToF32(u16View(bytes, n), out);
    case "f16":
      return f16ToF32(u16View(bytes, n), out);
    case "q4":
      return dequantizeQ4(bytes, n, out);
  }
}

function u16View(bytes: Uint8Array, n: number): Uint16Array {
  if (bytes.byteOffset % 2 === 0) return new Uint16Array(bytes.buffer, bytes.byteOffset, n);
  return new Uint16Array(bytes.slice(0, n * 2).buffer);
}
