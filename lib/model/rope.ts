// The RoPE frequency rule every implementation follows (docs/model.md, "Numeric rules"):
// the rule transformers uses for converted Qwen models, in f32 throughout, so that angles at
// long positions agree with the checkpoints' own implementation (an f64 angle drifts from it
// by up to pos * 2^-24 rad: 4e-4 rad at position 32k).

/**
 * inv_freq[i] = f32(1 / f32(theta ^ f32(2i / rd))) for i < rd/2: transformers'
 * `1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))`, each step rounded to f32.
 */
export function ropeInvFreq(rd: number, theta: number): Float32Array {
  if (!Number.isInteger(rd) || rd < 2 || rd % 2 !== 0) throw new RangeError(`rope: rotary dim ${rd} must be an even integer >= 2`);
  const f = new Float32Array(rd / 2);
  for (let i = 0; i < rd / 2; i++) {
    const exponent = Math.fround((2 * i) / rd);
    f[i] = Math.fround(1 / Math.fround(Math.pow(Math.fround(theta), exponent)));
  }
  return f;
}

/** The angle of pair i at `pos`: the f32 product f32(pos) * inv_freq[i] (positions < 2^24). */
export function ropeAngle(pos: number, invFreq: number): number {
  return Math.fround(Math.fround(pos) * invFreq);
}
