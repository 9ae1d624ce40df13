// The fold of a site's raw products into the write before it (kernels/hc.h hc_store_lanes):
// the kernel that writes a sub-layer's output into the streams also leaves the next site's
// fn . flat, a partial per (mix, float4 column), and the next site's coefficients gather them
// instead of running hc_mix_partials. What a writer binds for it, and when a step folds.
import type { Binding } from "../shim.ts";
import { bind, type RowsRef, type TensorRef } from "./dispatch.ts";
import { gemmMinRows } from "./gemm.ts";

/** Mixes per row: 2n + n*n for a site, n for the final read (hcMixCount). */
const mixCount = (n: number, head: boolean) => (head ? n : 2 * n + n * n);

/** Floats per row of folded partials: [mixes + 1][d / 4] (the last is the sum of squares). */
export const hcFoldCount = (n: number, d: number, head = false) => (mixCount(n, head) + 1) * (d / 4);

/**
 * Whether the writes of a step of `rows` rows fold the next site's raw products: n > 1 (a site)
 * and d % 16 == 0 (whole float4s of partials a mix, as the gather reads them), for steps below
 * the GEMM's row threshold (gemmMinRows: every step on the CPU backend), so a prompt chunk's
 * rows get the bits token-by-token steps get wherever the chunk's projections do. A chunk that
 * takes the GEMM differs from token-by-token steps anyway, and there the fold's partials (one a
 * float4 column and mix, 16 times what hc_mix_partials writes) cost more than they save: on
 * the H200 a 256-token prompt ran at 1,396-1,438 tok/s folded, 1,622 without.
 * CHERENKOV_HC_FOLD=0 turns it off (every site runs hc_mix_partials: an A/B on a GPU, and the
 * test that counts what the fold saves).
 */
export const hcFolds = (cfg: { streams: number }, d: number, rows: number, backend: string): boolean =>
  cfg.streams > 1 && d % 16 === 0 && process.env.CHERENKOV_HC_FOLD !== "0" && rows < gemmMinRows(backend);

/** The next site a write folds: its fn ([mixes][n * d]) and where its partials go. */
export interface HcFold {
  fn: TensorRef;
  raw: RowsRef;
  mixes: number;
}

/** fn's dtype as the fold's params name it (HC_FN_* in kernels/hc.h). */
export const HC_FOLD_DTYPES: Record<string, number> = { f32: 0, bf16: 1, f16: 2 };

/** A writer's fold params (fold_mixes 0: none). */
export function hcFoldParams(fold: HcFold | undefined): { fold_mixes: number; fold_dtype: number; p_stride: number } {
  return fold ? { fold_mixes: fold.mixes, fold_dtype: HC_FOLD_DTYPES[fold.fn.dtype]!, p_stride: fold.raw.stride } : { fold_mixes: 0, fold_dtype: 0, p_stride: 0 };
}

/** A writer's fold bindings (fn, partials); without a fold `unused` stands in (never read). */
export function hcFoldBindings(fold: HcFold | undefined, unused: RowsRef): Binding[] {
  if (!fold) return [bind(unused.buffer, unused.offset), bind(unused.buffer, unused.offset)];
  return [bind(fold.fn.buffer, fold.fn.offset), bind(fold.raw.buffer, fold.raw.offset)];
}
