// An append-only per-position cache of `heads` vectors of `dim` values: attention K and V,
// and the QSA index keys. "q8" stores each (position, head) vector as int8 plus one f32
// scale (MODEL.md); "f32" keeps floats. Readers see `values`, the dequantized floats, so the
// rounding of q8 applies to every position read, the current one included.
import { dequantizeQ8, quantizeQ8 } from "./ops.ts";

export type KvKind = "q8" | "f32";

export class KvCache {
  length = 0;
  private capacity = 0;
  /** int8 codes [capacity, heads, dim] (q8 only) */
  codes: Int8Array = new Int8Array(0);
  /** one scale per (position, head) (q8 only) */
  scales: Float32Array = new Float32Array(0);
  /** the values attention reads: [capacity, heads, dim] (dequantized for q8) */
  values: Float32Array = new Float32Array(0);

  constructor(readonly kind: KvKind, readonly heads: number, readonly dim: number) {}

  /** Appends one position (heads * dim floats). */
  append(x: Float32Array): void {
    const w = this.heads * this.dim;
    if (x.length !== w) throw new Error(`KvCache.append: got ${x.length} values, expected ${w}`);
    if (this.length === this.capacity) this.grow();
    const p = this.length++;
    if (this.kind === "f32") {
      this.values.set(x, p * w);
      return;
    }
    for (let h = 0; h < this.heads; h++) {
      const off = p * w + h * this.dim;
      const q = this.codes.subarray(off, off + this.dim);
      const scale = quantizeQ8(x.subarray(h * this.dim, (h + 1) * this.dim), q);
      this.scales[p * this.heads + h] = scale;
      dequantizeQ8(q, scale, this.values.subarray(off, off + this.dim));
    }
  }

  /** The stored vector of (position, head), as read by attention. */
  vector(pos: number, head: number): Float32Array {
    if (pos >= this.length) throw new Error(`KvCache: position ${pos} not cached (length ${this.length})`);
    const off = (pos * this.heads + head) * this.dim;
    return this.values.subarray(off, off + this.dim);
  }

  /** Forgets every position >= len (rollback). */
  truncate(len: number): void {
    if (len > this.length) throw new Error(`KvCache.truncate: ${len} exceeds length ${this.length}`);
    this.length = len;
  }

  /** The live content (positions < length), for exact state comparisons in tests. */
  live(): { codes: Int8Array; scales: Float32Array; values: Float32Array } {
    const w = this.heads * this.dim;
    return {
      codes: this.codes.slice(0, this.kind === "q8" ? this.length * w : 0),
      scales: this.scales.slice(0, this.kind === "q8" ? this.length * this.heads : 0),
      values: this.values.slice(0, this.length * w),
    };
  }

  private grow(): void {
    const cap = Math.max(16, this.capacity * 2);
    const w = this.heads * this.dim;
    const values = new Float32Array(cap * w);
    values.set(this.values);
    this.values = values;
    if (this.kind === "q8") {
      const codes = new Int8Array(cap * w);
      codes.set(this.codes);
      this.codes = codes;
      const scales = new Float32Array(cap * this.heads);
      scales.set(this.scales);
      this.scales = scales;
    }
    this.capacity = cap;
  }
}
