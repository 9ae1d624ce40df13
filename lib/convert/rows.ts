// A 2-d tensor as rows of its last dimension, held either as f32 or as q4 (group 32) rows.
// Converters reorder and split projections by rows (per-head packing, grouped qkvz, fused
// experts); doing that on q4 rows keeps an already-quantized checkpoint bit-exact.
import { assembleQ4, dequantizeQ4, Q4_GROUP } from "../model/q4.ts";

/** q4 rows: cols/2 nibble bytes per row (even column low), cols/32 bf16 scales and biases per row. */
export interface Q4Rows {
  nibbles: Uint8Array;
  scales: Uint16Array;
  biases: Uint16Array;
}

export class RowMatrix {
  private constructor(
    readonly rows: number,
    readonly cols: number,
    private readonly f32Data: Float32Array | null,
    readonly q4: Q4Rows | null,
  ) {}

  static f32(rows: number, cols: number, values: Float32Array): RowMatrix {
    if (values.length !== rows * cols) throw new Error(`RowMatrix: ${values.length} values for ${rows} x ${cols}`);
    return new RowMatrix(rows, cols, values, null);
  }

  static fromQ4(rows: number, cols: number, q: Q4Rows): RowMatrix {
    if (cols % Q4_GROUP !== 0) throw new Error(`RowMatrix: q4 rows need cols % ${Q4_GROUP} == 0, got ${cols}`);
    const groups = (rows * cols) / Q4_GROUP;
    if (q.nibbles.length !== (rows * cols) / 2 || q.scales.length !== groups || q.biases.length !== groups)
      throw new Error(`RowMatrix: q4 parts do not match ${rows} x ${cols}`);
    return new RowMatrix(rows, cols, null, q);
  }

  get isQ4(): boolean {
    return this.q4 !== null;
  }

  /** The rows at `indices`, in that order. */
  gather(indices: readonly number[]): RowMatrix {
    for (const r of indices)
      if (!Number.isInteger(r) || r < 0 || r >= this.rows) throw new Error(`RowMatrix: row ${r} outside 0..${this.rows - 1}`);
    const n = indices.length;
    const c = this.cols;
    if (this.f32Data) {
      const out = new Float32Array(n * c);
      indices.forEach((r, i) => out.set(this.f32Data!.subarray(r * c, (r + 1) * c), i * c));
      return RowMatrix.f32(n, c, out);
    }
    const q = this.q4!;
    const nb = c / 2;
    const g = c / Q4_GROUP;
    const nibbles = new Uint8Array(n * nb);
    const scales = new Uint16Array(n * g);
    const biases = new Uint16Array(n * g);
    indices.forEach((r, i) => {
      nibbles.set(q.nibbles.subarray(r * nb, (r + 1) * nb), i * nb);
      scales.set(q.scales.subarray(r * g, (r + 1) * g), i * g);
      biases.set(q.biases.subarray(r * g, (r + 1) * g), i * g);
    });
    return RowMatrix.fromQ4(n, c, { nibbles, scales, biases });
  }

  /** Rows start .. start + count - 1. */
  range(start: number, count: number): RowMatrix {
    return this.gather(Array.from({ length: count }, (_, i) => start + i));
  }

  /** The values as f32 (q4 rows are dequantized exactly as the format reader does). */
  toF32(): Float32Array {
    if (this.f32Data) return this.f32Data;
    return dequantizeQ4(this.toQ4Bytes()!, this.rows * this.cols);
  }

  /** The q4 tensor bytes (nibbles, scales, biases) when the rows are q4, else null. */
  toQ4Bytes(): Uint8Array | null {
    if (!this.q4) return null;
    return assembleQ4(this.q4.nibbles, this.q4.scales, this.q4.biases);
  }
}

/** Row indices a..a+n-1 shifted by `base`. */
export const span = (base: number, n: number): number[] => Array.from({ length: n }, (_, i) => base + i);
