// Elementwise kernels (kernels/elementwise.metal) against the reference's sigmoid/silu.
import { afterAll, describe, test } from "bun:test";

import { encodeElementwise, type ElementwiseOp } from "../../lib/gpu/elementwise.ts";
import { sigmoid, silu } from "../../lib/reference/ops.ts";
import { expectClose, expectGuard, NB_CASES, openDevice, outputF32, randomF32, readF32, rows, run, uploadF32 } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

const OPS: [ElementwiseOp, (a: number, b: number) => number][] = [
  ["add", (a, b) => a + b],
  ["silu_mul", (a, b) => silu(a) * b],
  ["sigmoid_mul", (a, b) => a * sigmoid(b)],
  ["scale_add", (a, b) => a + 0.375 * b],
];

// One f32 exp and a division per element: a few ulps of the result; sums of operands up to
// 6 in size can cancel, so also a few ulps of the operands (1e-6).
const TOL = { rel: 2e-6, abs: 1e-6 };

describe.each(OPS)("ew_%s_f32", (op, f) => {
  test.each(NB_CASES)("nb = %i", (nb) => {
    const cols = nb === 1024 ? 40 : 131;
    const a = randomF32(nb * cols, nb, 6, `a-${op}`);
    const b = randomF32(nb * cols, nb, 6, `b-${op}`);
    const ab = uploadF32(dev, a);
    const bb = uploadF32(dev, b);
    const y = outputF32(dev, nb * cols);
    run(dev, (ctx) => encodeElementwise(ctx, op, rows(ab, cols), rows(bb, cols), rows(y, cols), nb, cols, 0.375));
    const want = a.map((v, i) => f(v, b[i]!));
    expectClose(readF32(y, nb * cols), want, TOL, `ew_${op}_f32 nb=${nb}`, cols);
    expectGuard(y, nb * cols);
  });
});

test("ew_add_f32 in place over strided rows (the n = 1 residual write)", () => {
  const [nb, cols, stride] = [3, 20, 32];
  const x = randomF32(nb * stride, 1);
  const y = randomF32(nb * cols, 2);
  const xb = uploadF32(dev, x);
  const yb = uploadF32(dev, y);
  run(dev, (ctx) => encodeElementwise(ctx, "add", rows(xb, stride), rows(yb, cols), rows(xb, stride), nb, cols));
  const want = x.slice();
  for (let r = 0; r < nb; r++) for (let c = 0; c < cols; c++) want[r * stride + c] = Math.fround(x[r * stride + c]! + y[r * cols + c]!);
  expectClose(readF32(xb, nb * stride), want, { abs: 0 }, "ew_add_f32 in place", stride);
});
