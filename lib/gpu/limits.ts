// Fixed limits of the GPU step, shared by the engine, the kernels' tests and the docs.

/** Rows per step: a prefill chunk, or 1 + drafts when verifying. Scratch is sized for it. */
export const MAX_NB = 1024;
/** Rollback planes: a verify batch may have up to this many rows after the first. */
export const MAX_SNAP = 8;
/** SIMD width every backend runs with (Metal's on Apple silicon; the CPU emulator's). */
export const SIMD_WIDTH = 32;
