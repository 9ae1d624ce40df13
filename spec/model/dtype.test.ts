import { describe, expect, test } from "bun:test";
import {
  bf16BitsToF32,
  bf16ToF32,
  f16BitsToF32,
  f32ToBf16,
  f32ToBf16Bits,
  f32ToF16Bits,
  roundBf16,
} from "../../lib/model/dtype.ts";
import { Rng } from "../../lib/model/rng.ts";

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
const fromBits = (u: number) => ((u32[0] = u), f32[0]!);

describe("bf16", () => {
  test("ties round to even, others to nearest", () => {
    expect(roundBf16(1 + 2 ** -8)).toBe(1); // halfway, 1 is even
    expect(roundBf16(1 + 3 * 2 ** -8)).toBe(1 + 2 ** -6); // halfway, rounds up to even
    expect(roundBf16(1 + 2 ** -8 + 2 ** -20)).toBe(1 + 2 ** -7); // above halfway
    expect(roundBf16(-(1 + 2 ** -8))).toBe(-1);
    expect(roundBf16(3.140625)).toBe(3.140625); // exactly representable
  });

  test("specials survive", () => {
    expect(bf16BitsToF32(f32ToBf16Bits(Infinity))).toBe(Infinity);
    expect(bf16BitsToF32(f32ToBf16Bits(-Infinity))).toBe(-Infinity);
    expect(Number.isNaN(bf16BitsToF32(f32ToBf16Bits(NaN)))).toBe(true);
    expect(Object.is(bf16BitsToF32(f32ToBf16Bits(-0)), -0)).toBe(true);
    // the largest finite f32 rounds past the largest bf16: to infinity, as torch does
    expect(roundBf16(3.4028234663852886e38)).toBe(Infinity);
  });

  test("the result is the nearer of the two neighbouring bf16 values (random bit patterns)", () => {
    const rng = new Rng(7, "bf16");
    for (let i = 0; i < 20000; i++) {
      const u = rng.nextU32() & 0x7f7fffff; // finite, positive
      const x = fromBits(u);
      const lo = fromBits(u & 0xffff0000);
      const hi = fromBits((u & 0xffff0000) + 0x10000);
      const r = roundBf16(x);
      const dLo = x - lo;
      const dHi = hi - x;
      if (dLo < dHi) expect(r).toBe(lo);
      else if (dHi < dLo) expect(r).toBe(hi);
      else expect(f32ToBf16Bits(r) & 1).toBe(0);
    }
  });

  test("bulk conversion agrees with the scalar one and round-trips bf16 values exactly", () => {
    const rng = new Rng(3, "bulk");
    const x = Float32Array.from({ length: 1000 }, () => rng.normal() * 100);
    const bits = f32ToBf16(x);
    bits.forEach((b, i) => expect(b).toBe(f32ToBf16Bits(x[i]!)));
    const back = bf16ToF32(bits);
    expect(Array.from(f32ToBf16(back))).toEqual(Array.from(bits));
  });
});

describe("f16", () => {
  test("normals, ties, subnormals, overflow", () => {
    expect(f16BitsToF32(f32ToF16Bits(1))).toBe(1);
    expect(f16BitsToF32(f32ToF16Bits(1 + 2 ** -11))).toBe(1); // tie to even
    expect(f16BitsToF32(f32ToF16Bits(1 + 3 * 2 ** -11))).toBe(1 + 2 ** -9);
    expect(f16BitsToF32(f32ToF16Bits(65504))).toBe(65504);
    expect(f16BitsToF32(f32ToF16Bits(65520))).toBe(Infinity); // halfway past the max rounds up
    expect(f16BitsToF32(f32ToF16Bits(2 ** -24))).toBe(2 ** -24); // smallest subnormal
    expect(f16BitsToF32(f32ToF16Bits(2 ** -25))).toBe(0); // tie to even (zero)
    expect(f16BitsToF32(f32ToF16Bits(3 * 2 ** -25))).toBe(2 ** -23);
    expect(f16BitsToF32(f32ToF16Bits(2 ** -14 - 2 ** -25))).toBe(2 ** -14); // carries into the smallest normal
    expect(Number.isNaN(f16BitsToF32(f32ToF16Bits(NaN)))).toBe(true);
  });

  test("every f16 value round-trips through f32", () => {
    for (let b = 0; b < 0x10000; b++) {
      if ((b & 0x7c00) === 0x7c00 && b & 0x3ff) continue; // NaNs
      expect(f32ToF16Bits(f16BitsToF32(b))).toBe(b);
    }
  });
});
