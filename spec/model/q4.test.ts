import { describe, expect, test } from "bun:test";
import { bf16BitsToF32, f32ToBf16Bits, roundBf16 } from "../../lib/model/dtype.ts";
import { assembleQ4, dequantizeQ4, q4Layout, quantizeQ4, splitG64 } from "../../lib/model/q4.ts";
import { Rng } from "../../lib/model/rng.ts";
import { tensorBytes } from "../../lib/model/tensors.ts";

const randomValues = (n: number, seed: number, spread = 1) => {
  const rng = new Rng(seed, "q4");
  return Float32Array.from({ length: n }, () => rng.normal() * spread);
};

describe("q4 layout", () => {
  test("nibbles, then bf16 scales, then bf16 biases; size matches tensorBytes", () => {
    const L = q4Layout(64 * 96);
    expect(L.scalesOffset).toBe((64 * 96) / 2);
    expect(L.biasesOffset).toBe(L.scalesOffset + ((64 * 96) / 32) * 2);
    expect(L.bytes).toBe(tensorBytes([64, 96], "q4"));
    expect(() => q4Layout(33)).toThrow(/multiple of 32/);
  });

  test("even element in the low nibble, odd in the high nibble", () => {
    // group: 0, 15*s, 1*s, 2*s, ... so min = 0 and scale = s exactly
    const v = new Float32Array(32);
    v[1] = 15;
    v[2] = 3;
    v[3] = 7;
    const q = quantizeQ4(v);
    expect(q[0]).toBe(0 | (15 << 4));
    expect(q[1]).toBe(3 | (7 << 4));
    expect(bf16BitsToF32(new Uint16Array(q.buffer, 16, 1)[0]!)).toBe(1); // scale
    expect(bf16BitsToF32(new Uint16Array(q.buffer, 18, 1)[0]!)).toBe(0); // bias
  });
});

describe("q4 round trip", () => {
  test("each value is within half a step (plus bf16 rounding of scale and bias) of the original", () => {
    const n = 128 * 64;
    const x = randomValues(n, 1, 3);
    const y = dequantizeQ4(quantizeQ4(x), n);
    for (let g = 0; g < n / 32; g++) {
      const group = x.subarray(g * 32, g * 32 + 32);
      const min = Math.min(...group);
      const max = Math.max(...group);
      const step = (max - min) / 15;
      const bound = step / 2 + (Math.abs(min) + (max - min)) * 2 ** -8 + 1e-7;
      for (let i = 0; i < 32; i++) expect(Math.abs(y[g * 32 + i]! - group[i]!)).toBeLessThanOrEqual(bound);
    }
  });

  test("values already on a bf16 grid come back exactly", () => {
    const rng = new Rng(5, "grid");
    const n = 32 * 40;
    const x = new Float32Array(n);
    for (let g = 0; g < n / 32; g++) {
      const scale = (1 + rng.int(64)) / 64; // few mantissa bits: exact in bf16 and in sums
      const bias = -(rng.int(128) / 32);
      for (let i = 0; i < 32; i++) x[g * 32 + i] = scale * (i < 2 ? i * 15 : rng.int(16)) + bias; // q 0 and 15 present
    }
    expect(Array.from(dequantizeQ4(quantizeQ4(x), n))).toEqual(Array.from(x));
  });

  test("a constant group is stored as scale 0 and its bf16 value", () => {
    const x = new Float32Array(64).fill(0.3);
    x.fill(-2, 32);
    const y = dequantizeQ4(quantizeQ4(x), 64);
    expect(y[0]).toBe(roundBf16(0.3));
    expect(y[31]).toBe(roundBf16(0.3));
    expect(y[32]).toBe(-2);
  });

  test("quantizeQ4 writes into a given buffer, dequantize reads from an offset view", () => {
    const x = randomValues(256, 9);
    const fresh = quantizeQ4(x);
    const big = new Uint8Array(fresh.length + 7);
    quantizeQ4(x, big.subarray(3, 3 + fresh.length)); // odd offset: bf16 parameters unaligned
    expect(Array.from(big.subarray(3, 3 + fresh.length))).toEqual(Array.from(fresh));
    expect(Array.from(dequantizeQ4(big.subarray(3), 256))).toEqual(Array.from(dequantizeQ4(fresh, 256)));
  });
});

describe("MLX group-64 parameters", () => {
  test("splitG64 gives two g32 groups per g64 group with the same scale and bias: the same weights", () => {
    const rng = new Rng(11, "mlx");
    const rows = 4;
    const cols = 128;
    const n = rows * cols;
    const nibbles = Uint8Array.from({ length: n / 2 }, () => rng.nextU32() & 0xff);
    const g64 = n / 64;
    const scales64 = Uint16Array.from({ length: g64 }, () => f32ToBf16Bits(rng.next() * 0.1));
    const biases64 = Uint16Array.from({ length: g64 }, () => f32ToBf16Bits(rng.symmetric()));
    const w = dequantizeQ4(assembleQ4(nibbles, splitG64(scales64), splitG64(biases64)), n);
    for (let i = 0; i < n; i++) {
      const q = (nibbles[i >> 1]! >> ((i & 1) * 4)) & 15;
      const g = Math.floor(i / 64);
      const expected = Math.fround(bf16BitsToF32(scales64[g]!) * q + bf16BitsToF32(biases64[g]!));
      expect(w[i]).toBe(expected);
    }
    expect(Array.from(splitG64(Uint16Array.of(1, 2)))).toEqual([1, 1, 2, 2]);
  });

  test("assembleQ4 rejects parameter counts that do not match", () => {
    expect(() => assembleQ4(new Uint8Array(32), new Uint16Array(1), new Uint16Array(2))).toThrow(/2 scales and biases/);
  });
});
