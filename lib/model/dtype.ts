// Conversions between f32 and the 16-bit float formats stored on disk (bf16, f16), rounding
// to nearest even like torch and MLX do. All on-disk data is little-endian, as is every
// machine cherenkov runs on, so typed-array views over file bytes read it directly.

const scratchF32 = new Float32Array(1);
const scratchU32 = new Uint32Array(scratchF32.buffer);

const bitsOf = (x: number) => ((scratchF32[0] = x), scratchU32[0]!);

/** bf16 bits of an f32 value, round to nearest even; NaN stays a (quiet) NaN. */
export function f32ToBf16Bits(x: number): number {
  return bf16FromBits(bitsOf(x));
}

function bf16FromBits(u: number): number {
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

export function bf16BitsToF32(bits: number): number {
  scratchU32[0] = (bits & 0xffff) << 16;
  return scratchF32[0]!;
}

/** The f32 value nearest to x that bf16 can hold. */
export const roundBf16 = (x: number) => bf16BitsToF32(f32ToBf16Bits(x));

/** Bulk f32 -> bf16. */
export function f32ToBf16(src: Float32Array, dst: Uint16Array = new Uint16Array(src.length)): Uint16Array {
  const u = new Uint32Array(src.buffer, src.byteOffset, src.length);
  for (let i = 0; i < u.length; i++) dst[i] = bf16FromBits(u[i]!);
  return dst;
}

/** Bulk bf16 -> f32 (exact). */
export function bf16ToF32(src: Uint16Array, dst: Float32Array = new Float32Array(src.length)): Float32Array {
  const u = new Uint32Array(dst.buffer, dst.byteOffset, dst.length);
  for (let i = 0; i < src.length; i++) u[i] = src[i]! << 16;
  return dst;
}

/** IEEE half bits of an f32 value, round to nearest even, with subnormals, overflow to inf. */
export function f32ToF16Bits(x: number): number {
  const u = bitsOf(x);
  const sign = (u >>> 16) & 0x8000;
  const exp = (u >>> 23) & 0xff;
  let mant = u & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 | (mant >>> 13) : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    const rem = mant & ((1 << shift) - 1);
    let r = mant >>> shift;
    if (rem > half || (rem === half && r & 1)) r++;
    return sign | r; // a carry into bit 10 is exactly the smallest normal
  }
  let r = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && r & 1)) r++; // a carry into the exponent is correct, up to inf
  return sign | r;
}

export function f16BitsToF32(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >>> 10) & 0x1f;
  const mant = bits & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

export function f32ToF16(src: Float32Array, dst: Uint16Array = new Uint16Array(src.length)): Uint16Array {
  for (let i = 0; i < src.length; i++) dst[i] = f32ToF16Bits(src[i]!);
  return dst;
}

export function f16ToF32(src: Uint16Array, dst: Float32Array = new Float32Array(src.length)): Float32Array {
  for (let i = 0; i < src.length; i++) dst[i] = f16BitsToF32(src[i]!);
  return dst;
}
