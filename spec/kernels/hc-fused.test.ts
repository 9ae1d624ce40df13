// The hyper-connection write fused into the kernels that produce the sub-layer output
// (kernels/hc.h; matvec_hc / matvec_split_hc through encodeMatvec's `hc` and
// encodeProjectionWrite): the same bits as the projection into y followed by hc_write_f32
// (or, for n = 1, the residual add), in every dtype and form the host can pick. The MoE
// site's fused form (moe_down_combine_hc) is pinned in moe.test.ts.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeResidualAdd } from "../../lib/gpu/elementwise.ts";
import { encodeHcWrite, encodeProjectionWrite, hcMixCount, type SiteWrite } from "../../lib/gpu/hyperconnection.ts";
import { encodeMatvec, prefersSplit } from "../../lib/gpu/projections.ts";
import type { DType } from "../../lib/model/config.ts";
import type { Buffer } from "../../lib/shim.ts";
import { openDevice, randomF32, recordingNames, rows, run, uploadF32, uploadWeight } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

const bits = (b: Buffer, n: number) => [...new Uint32Array(b.bytes.buffer, b.bytes.byteOffset, n)];

/** Random streams X [nb][n][d], coefficient rows [pre | post | comb] and a projection's input. */
function streamsCase(nb: number, n: number, d: number, inDim: number, seed: number) {
  const M = hcMixCount(n);
  return {
    X: randomF32(nb * n * d, seed, 2, "X"),
    coeffs: randomF32(nb * M, seed, 1.5, "coeffs"),
    x: uploadF32(dev, randomF32(nb * inDim, seed, 1, "x")),
    M,
  };
}

/** The pipelines a recording dispatches (names), and what it left in the device. */
function recordNames(encode: (ctx: Parameters<Parameters<typeof run>[1]>[0]) => void): string[] {
  const names: string[] = [];
  run(dev, (ctx) => encode(recordingNames(ctx, names)));
  return names;
}

const DTYPES: DType[] = ["f32", "bf16", "f16", "q4"];
const FORMS = ["rows", "split"] as const;

describe("matvec_hc: the same bits as matvec + hc_write_f32", () => {
  // d = 40: ten float4 columns, not a multiple of a rows-form threadgroup's 16 outputs.
  // rowsPerGroup 1: the q4 one-row (decode) kernels, here over several rows.
  const cases = DTYPES.flatMap((dt) => FORMS.flatMap((f) => [[dt, f, 1, undefined], [dt, f, 3, undefined], [dt, f, 3, 1]] as const));
  test.each(cases)("%s weights, %s form, nb = %i, rowsPerGroup %p", (dtype, form, nb, rowsPerGroup) => {
    const [n, d, inDim] = [4, 40, 96];
    const { ref } = uploadWeight(dev, dtype, [d, inDim], 31);
    const c = streamsCase(nb, n, d, inDim, 7 + nb);
    const fused = uploadF32(dev, c.X);
    const split = uploadF32(dev, c.X);
    const coeffs = uploadF32(dev, c.coeffs);
    const y = uploadF32(dev, new Float32Array(nb * d));
    const names = recordNames((ctx) =>
      encodeMatvec(ctx, ref, rows(c.x, inDim), rows(y, d), nb, { form, rowsPerGroup, hc: { X: rows(fused, n * d), coeffs: rows(coeffs, c.M), streams: n } }),
    );
    expect(names.length).toBe(1);
    expect(names[0]).toStartWith(form === "split" ? "matvec_split_hc_" : "matvec_hc_");
    run(dev, (ctx) => {
      encodeMatvec(ctx, ref, rows(c.x, inDim), rows(y, d), nb, { form, rowsPerGroup });
      encodeHcWrite(ctx, rows(split, n * d), rows(coeffs, c.M), rows(y, d), nb, n, d);
    });
    expect(bits(fused, nb * n * d)).toEqual(bits(split, nb * n * d));
    expect(bits(fused, nb * n * d)).not.toEqual([...new Uint32Array(c.X.buffer)]); // the write happened
  });

  // Every stream count the kernels hold, through the decode (one-row q4) form.
  test.each([1, 2, 3, 5, 6, 8])("n = %i (q4 one-row form)", (n) => {
    const [nb, d, inDim] = [1, 24, 64];
    const { ref } = uploadWeight(dev, "q4", [d, inDim], 40 + n);
    const c = streamsCase(nb, n, d, inDim, 50 + n);
    const fused = uploadF32(dev, c.X);
    const split = uploadF32(dev, c.X);
    const coeffs = uploadF32(dev, c.coeffs);
    const y = uploadF32(dev, new Float32Array(nb * d));
    run(dev, (ctx) => {
      encodeMatvec(ctx, ref, rows(c.x, inDim), rows(y, d), nb, { hc: { X: rows(fused, n * d), coeffs: rows(coeffs, c.M), streams: n } });
      encodeMatvec(ctx, ref, rows(c.x, inDim), rows(y, d), nb);
      encodeHcWrite(ctx, rows(split, n * d), rows(coeffs, c.M), rows(y, d), nb, n, d);
    });
    expect(bits(fused, nb * n * d)).toEqual(bits(split, nb * n * d));
  });

  test("refuses what it cannot write: outputs not whole float4 columns, accumulate, streams out of range", () => {
    const { ref } = uploadWeight(dev, "q4", [22, 64], 3);
    const b = dev.buffer(8192);
    const hc = { X: rows(b, 4 * 24), coeffs: rows(b, 24), streams: 4 };
    expect(() => run(dev, (ctx) => encodeMatvec(ctx, ref, rows(b, 64), rows(b, 22), 1, { hc }))).toThrow("matvec_hc: 22 output rows");
    const { ref: w24 } = uploadWeight(dev, "q4", [24, 64], 3);
    expect(() => run(dev, (ctx) => encodeMatvec(ctx, w24, rows(b, 64), rows(b, 24), 1, { hc, accumulate: true }))).toThrow("accumulate does not apply");
    expect(() => run(dev, (ctx) => encodeMatvec(ctx, w24, rows(b, 64), rows(b, 24), 1, { hc: { ...hc, streams: 9 } }))).toThrow("9 streams, expected 1..8");
  });
});

describe("encodeProjectionWrite: the projection and the site's write, fused where a kernel does both", () => {
  const [d, inDim] = [32, 64];

  function both(nb: number, n: number, dtype: DType, seed: number) {
    const { ref } = uploadWeight(dev, dtype, [d, inDim], seed);
    const c = streamsCase(nb, n, d, inDim, seed);
    const fused = uploadF32(dev, c.X);
    const split = uploadF32(dev, c.X);
    const coeffs = uploadF32(dev, c.coeffs);
    const y = uploadF32(dev, new Float32Array(nb * d));
    const write: SiteWrite = { X: rows(fused, n * d), coeffs: n === 1 ? null : rows(coeffs, c.M), streams: n, d };
    const names = recordNames((ctx) => encodeProjectionWrite(ctx, ref, rows(c.x, inDim), rows(y, d), nb, write));
    run(dev, (ctx) => {
      encodeMatvec(ctx, ref, rows(c.x, inDim), rows(y, d), nb);
      if (n === 1) encodeResidualAdd(ctx, rows(split, d), rows(y, d), nb, d);
      else encodeHcWrite(ctx, rows(split, n * d), rows(coeffs, c.M), rows(y, d), nb, n, d);
    });
    expect(bits(fused, nb * n * d)).toEqual(bits(split, nb * n * d));
    return names;
  }

  // Its 32 outputs take the split form on a GPU (prefersSplit), the rows form on the CPU backend.
  const form = (rowsName: string, splitName: string) => (prefersSplit(dev.backend, d) ? splitName : rowsName);

  test("n = 4, decode: one dispatch (matvec_hc, q4 one-row form)", () => {
    expect(both(1, 4, "q4", 61)).toEqual([form("matvec_hc_q4_r1_f32", "matvec_split_hc_q4_r1_f32")]);
  });

  test.each(["q4", "bf16"] as const)("n = 1 (%s): the matvec accumulates into X, the same bits as matvec + residual add", (dtype) => {
    const r1 = dtype === "q4" ? "q4_r1" : dtype;
    // (a one-row q4 rows form stages its input: matvec_q4_staged_r1, the same bits as matvec_q4_r1)
    expect(both(1, 1, dtype, 62)).toEqual([form(dtype === "q4" ? "matvec_q4_staged_r1_f32" : `matvec_${r1}_f32`, `matvec_split_${r1}_f32`)]);
    expect(both(5, 1, dtype, 63)).toEqual([form(`matvec_${dtype}_f32`, `matvec_split_${dtype}_f32`)]);
  });

  test("rows the GEMM takes: into y, then hc_write (n = 4); the GEMM accumulating into X (n = 1)", () => {
    const before = process.env.CHERENKOV_GEMM_MIN_ROWS;
    process.env.CHERENKOV_GEMM_MIN_ROWS = "4";
    try {
      const gemm = both(6, 4, "q4", 64);
      expect(gemm.length).toBe(2);
      expect(gemm[1]).toBe("hc_write_f32");
      expect(both(6, 1, "q4", 65).length).toBe(1);
    } finally {
      if (before === undefined) delete process.env.CHERENKOV_GEMM_MIN_ROWS;
      else process.env.CHERENKOV_GEMM_MIN_ROWS = before;
    }
  });

  test("refuses a weight whose outputs are not the streams' hidden size", () => {
    const { ref } = uploadWeight(dev, "q4", [d + 4, inDim], 3);
    const b = dev.buffer(16384);
    const write: SiteWrite = { X: rows(b, 4 * d), coeffs: rows(b, 24), streams: 4, d };
    expect(() => run(dev, (ctx) => encodeProjectionWrite(ctx, ref, rows(b, inDim), rows(b, d + 4), 1, write))).toThrow(
      "the weight has 36 output rows, the streams' hidden size is 32",
    );
  });
});
