// Affine 4-bit quantization, group 32 along the input dimension (MLX-compatible):
// w = scale * q + bias with q in 0..15. A q4 tensor of n values is stored as
//   [n/2 bytes: nibbles, element 2k in the low nibble of byte k]
//   [n/32 bf16: scales][n/32 bf16: biases]
// Groups never straddle rows because the input dimension is a multiple of 32, so group g of
// the flattened row-major tensor is row floor(g / (in/32)), columns 32*(g mod (in/32)).. .
import { bf16BitsToF32, f32ToBf16Bits } from "./dtype.ts";

export const Q4_GROUP = 32;

export interface Q4Layout {
  /** Bytes of packed nibbles (n/2); the scales start here. */
  scalesOffset: number;
  /** Where the biases start. */
  biasesOffset: number;
  /** Total bytes: n/2 + 4 * n/32. */
  bytes: number;
  groups: number;
}

export function q4Layout(n: number): Q4Layout {
  if (n % Q4_GROUP !== 0) throw new Error(`q4 needs a multiple of ${Q4_GROUP} values, got ${n}`);
  const groups = n / Q4_GROUP;
  return { scalesOffset: n / 2, biasesOffset: n / 2 + groups * 2, bytes: n / 2 + groups * 4, groups };
}

/**
 * Quantizes each group of 32 with its min/max: scale = (max - min) / 15, bias = min, both
 * rounded to bf16 first and q chosen against the rounded values (so the stored numbers are
 * the ones the error is minimised for). A constant group gets scale 0 and q = 0.
 */
export function quantizeQ4(values: Float32Array, out?: Uint8Array): Uint8Array {
  const L = q4Layout(values.length);
  const bytes = out ?? new Uint8Array(L.bytes);
  if (bytes.byteLength < L.bytes) throw new Error(`q4 output needs ${L.bytes} bytes, got ${bytes.byteLength}`);
  // Views when 2-byte aligned; otherwise parameters are gathered and copied in at the end.
  const aligned = bytes.byteOffset % 2 === 0;
  const params = (offset: number) => (aligned ? new Uint16Array(bytes.buffer, bytes.byteOffset + offset, L.groups) : new Uint16Array(L.groups));
  const scales = params(L.scalesOffset);
  const biases = params(L.biasesOffset);
  for (let g = 0; g < L.groups; g++) {
    const base = g * Q4_GROUP;
    let min = values[base]!;
    let max = min;
    for (let i = 1; i < Q4_GROUP; i++) {
      const v = values[base + i]!;
      if (v < min) min = v;
      if (v > max) max = v;
    }
    const sBits = f32ToBf16Bits((max - min) / 15);
    const bBits = f32ToBf16Bits(min);
    scales[g] = sBits;
    biases[g] = bBits;
    const s = bf16BitsToF32(sBits);
    const b = bf16BitsToF32(bBits);
    const packed = base >> 1;
    if (!(s > 0)) {
      bytes.fill(0, packed, packed + Q4_GROUP / 2);
      continue;
    }
    // (v + 0.5) | 0 rounds half up for v >= -0.5 and gives <= 0 below, which the clamp maps to 0.
    const inv = 1 / s;
    for (let i = 0; i < Q4_GROUP; i += 2) {
      let q0 = ((values[base + i]! - b) * inv + 0.5) | 0;
      let q1 = ((values[base + i + 1]! - b) * inv + 0.5) | 0;
      q0 = q0 < 0 ? 0 : q0 > 15 ? 15 : q0;
      q1 = q1 < 0 ? 0 : q1 > 15 ? 15 : q1;
      bytes[packed + (i >> 1)] = q0 | (q1 << 4);
    }
  }
  if (!aligned) {
    bytes.set(new Uint8Array(scales.buffer), L.scalesOffset);
    bytes.set(new Uint8Array(biases.buffer), L.biasesOffset);
  }
  return bytes;
}

/** The f32 values of a q4 tensor of n values: fround(scale * q + bias) (the product is exact). */
export function dequantizeQ4(bytes: Uint8Array, n: number, out: Float32Array = new Float32Array(n)): Float32Array {
  const L = q4Layout(n);
  if (bytes.byteLength < L.bytes) throw new Error(`q4 tensor of ${n} values needs ${L.bytes} bytes, got ${bytes.byteLength}`);
  const scales = q4Params(bytes, L.scalesOffset, L.groups);
  const biases = q4Params(bytes, L.biasesOffset, L.groups);
  for (let g = 0; g < L.groups; g++) {
    const s = bf16BitsToF32(scales[g]!);
    const b = bf16BitsToF32(biases[g]!);
    const base = g * Q4_GROUP;
    const packed = base >> 1;
    for (let i = 0; i < Q4_GROUP; i += 2) {
      const byte = bytes[packed + (i >> 1)]!;
      out[base + i] = s * (byte & 15) + b;
      out[base + i + 1] = s * (byte >> 4) + b;
    }
  }
  return out;
}

/** A u16 view when aligned, a copy otherwise (bytes may come from an odd offset). */
function q4Params(bytes: Uint8Array, offset: number, count: number): Uint16Array {
  const at = bytes.byteOffset + offset;
  if (at % 2 === 0) return new Uint16Array(bytes.buffer, at, count);
  return new Uint16Array(bytes.slice(offset, offset + count * 2).buffer);
}

/**
 * Builds q4 bytes from parts that are already quantized with group 32 (nibbles n/2 bytes,
 * one bf16 scale and bias per group). With MLX's g64 parts, pass them through splitG64 first.
 */
export function assembleQ4(nibbles: Uint8Array, scales: Uint16Array, biases: Uint16Array): Uint8Array {
  const n = nibbles.byteLength * 2;
  const L = q4Layout(n);
  if (scales.length !== L.groups || biases.length !== L.groups)
    throw new Error(`q4 of ${n} values needs ${L.groups} scales and biases, got ${scales.length} and ${biases.length}`);
  const out = new Uint8Array(L.bytes);
  out.set(nibbles, 0);
  out.set(new Uint8Array(scales.buffer, scales.byteOffset, scales.byteLength), L.scalesOffset);
  out.set(new Uint8Array(biases.buffer, biases.byteOffset, biases.byteLength), L.biasesOffset);
  return out;
}

/**
 * Per-group parameters (scales or biases) of a group-64 quantization as group-32 ones: each
 * g64 group covers two consecutive g32 groups with the same scale and bias, so this is exact.
 */
export function splitG64(params: Uint16Array): Uint16Array {
  const out = new Uint16Array(params.length * 2);
  for (let i = 0; i < params.length; i++) out[2 * i] = out[2 * i + 1] = params[i]!;
  return out;
}
