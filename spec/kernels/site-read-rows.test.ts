// A verify batch's read formed by the projections that consume it (CHERENKOV_HC_READ_FUSED_ROWS,
// matvec_multi_q4_read_f32 / matvec_multi_q4_norm_f32): for 2..4 rows one dispatch gives, bit for
// bit, what the read kernel (hc_coeffs_read_norm_f32 from the folded partials, or rms_norm_f32)
// followed by the batch's projections give (bf16 ones in matvec_multi_split's form, q4 ones in
// matvec_multi_q4's rows form, or the one-simdgroup split form): the projections of every row,
// every row's read stored to xn, and every row's coefficients. Steps it cannot take fall back.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeSiteRead, hcMixCount } from "../../lib/gpu/hyperconnection.ts";
import { encodeRmsNorm } from "../../lib/gpu/norms.ts";
import { encodeMatvecs, type Projection } from "../../lib/gpu/projections.ts";
import { encodeSiteProjections, plainRead, r1ReadKernel } from "../../lib/gpu/site-read.ts";
import type { DType } from "../../lib/model/config.ts";
import { bitsOf as bits, hostTensor, openDevice, outputF32, randomF32, recordingNames, restoreEnvAfterEach, rows, run, uploadF32, uploadWeight, uploadWeights } from "./harness.ts";
import { siteCase } from "./site-case.ts";

const dev = openDevice();
afterAll(() => dev.close());
restoreEnvAfterEach("CHERENKOV_HC_READ_FUSED", "CHERENKOV_HC_READ_TILES", "CHERENKOV_HC_READ_FUSED_ROWS", "CHERENKOV_MATVEC_GROUP_ROWS");

/** How the unfused batch computes its q4 projections: the rows form, or the split form (a GPU's, for narrow groups). */
type Q4Form = "rows" | "split";

/**
 * The projections of nb rows both ways: the fused dispatch, and the read kernel + the batch's
 * matvecs. fusedRows: CHERENKOV_HC_READ_FUSED_ROWS (null: unset, where a batch run one row a
 * threadgroup takes the one-row kernels a row each).
 */
function bothWays(n: number, d: number, nb: number, weights: [DType, number][], seed: number, q4Form: Q4Form, fusedRows: string | null = "4") {
  const ws = weights.map(([dt, out], i) => uploadWeight(dev, dt, [out, d], seed + 10 + i).ref);
  const side = () => {
    const ys = ws.map((w) => outputF32(dev, nb * w.shape[0]!));
    return { ys, xn: outputF32(dev, nb * d), names: [] as string[], items: ws.map((w, i): Projection => ({ w, y: rows(ys[i]!, w.shape[0]!) })) };
  };
  const fused = side();
  const apart = side();
  const unfusedMatvecs = (c: Parameters<typeof encodeMatvecs>[0], items: Projection[]) => {
    // bf16 in the split form (a GPU's for narrow groups, the fused kernel's), then q4.
    const bf16 = items.filter((it) => it.w.dtype === "bf16");
    const q4 = items.filter((it) => it.w.dtype === "q4");
    if (bf16.length) encodeMatvecs(c, bf16, rows(apart.xn, d), nb, { form: "split" });
    if (q4.length) encodeMatvecs(c, q4, rows(apart.xn, d), nb, { form: q4Form });
  };
  process.env.CHERENKOV_HC_READ_FUSED = "1";
  if (fusedRows === null) delete process.env.CHERENKOV_HC_READ_FUSED_ROWS;
  else process.env.CHERENKOV_HC_READ_FUSED_ROWS = fusedRows;
  if (n === 1) {
    const X = { buffer: uploadF32(dev, randomF32(nb * d, seed, 2, "X")), offset: 0, stride: d * 4 };
    const norm = { w: uploadWeights(dev, { norm: hostTensor(randomF32(d, seed, 0.3, "norm"), "f32", [d]) }).refs.norm, eps: 1e-6 };
    run(dev, (ctx) => encodeSiteProjections(recordingNames(ctx, fused.names), fused.items, plainRead(X, rows(fused.xn, d), d, norm), rows(fused.xn, d), nb));
    run(dev, (ctx) => {
      const c = recordingNames(ctx, apart.names);
      encodeRmsNorm(c, X, norm.w, rows(apart.xn, d), nb, norm.eps, { centred: true });
      unfusedMatvecs(c, apart.items);
    });
    return { ws, fused, apart, coeffs: undefined };
  }
  const site = siteCase(dev, n, d, nb, seed);
  const fs = site.scratch();
  const as = site.scratch();
  run(dev, (ctx) => encodeSiteProjections(recordingNames(ctx, fused.names), fused.items, site.read(fs, fused.xn), rows(fused.xn, d), nb));
  run(dev, (ctx) => {
    const c = recordingNames(ctx, apart.names);
    encodeSiteRead(c, rows(site.X, n * d), site.refs, as, rows(apart.xn, d), nb, site.cfg, d, { w: site.refs.norm, eps: 1e-6 }, site.folded);
    unfusedMatvecs(c, apart.items);
  });
  return { ws, fused, apart, coeffs: { fused: bits(fs.coeffs.buffer, nb * site.M), apart: bits(as.coeffs.buffer, nb * site.M) } };
}

describe("matvec_multi_q4_read_f32: a verify batch's read and its projections in one dispatch, the same bits a row", () => {
  const cases: [string, number, number, number, [DType, number][], Q4Form, string][] = [
    ["DeltaNet's four (bf16 b, a beside q4 qkv, z), the tiny model's shape", 4, 256, 2, [["q4", 512], ["q4", 256], ["bf16", 8], ["bf16", 8]], "rows", "2"],
    ["DeltaNet's four, three rows", 4, 256, 3, [["q4", 512], ["q4", 256], ["bf16", 8], ["bf16", 8]], "rows", "2"],
    ["DeltaNet's four, four rows, the split form a GPU gives the q4 ones", 4, 256, 4, [["q4", 512], ["q4", 256], ["bf16", 8], ["bf16", 8]], "split", "2"],
    ["attention's four q4, a tile a simdgroup", 4, 256, 4, [["q4", 256], ["q4", 256], ["q4", 68], ["q4", 64]], "rows", "1"],
    ["attention's four q4, three tiles a simdgroup", 4, 256, 3, [["q4", 256], ["q4", 256], ["q4", 68], ["q4", 64]], "split", "3"],
    ["the MoE site's router and shared gate (bf16 alone)", 4, 256, 4, [["bf16", 16], ["bf16", 1]], "rows", "2"],
    ["four rows of 512 (the whole staging), two streams", 2, 512, 4, [["q4", 1040], ["bf16", 4]], "rows", "2"],
    ["two rows of 1,024 (a thread's two turns of the read)", 4, 1024, 2, [["q4", 520]], "rows", "2"],
    ["the plain residual's read (n = 1: matvec_multi_q4_norm_f32)", 1, 256, 3, [["q4", 256], ["q4", 256], ["q4", 64], ["q4", 64]], "rows", "2"],
  ];
  test.each(cases)("%s: n = %i, d = %i, %i rows", (_, n, d, nb, weights, q4Form, tiles) => {
    process.env.CHERENKOV_HC_READ_TILES = tiles;
    const { ws, fused, apart, coeffs } = bothWays(n, d, nb, weights, 7 + n + d + nb, q4Form);
    expect(fused.names).toEqual([n === 1 ? "matvec_multi_q4_norm_f32" : "matvec_multi_q4_read_f32"]);
    expect(apart.names[0]).toBe(n === 1 ? "rms_norm_f32" : "hc_coeffs_read_norm_f32");
    ws.forEach((w, i) => expect(bits(fused.ys[i]!, nb * w.shape[0]!)).toEqual(bits(apart.ys[i]!, nb * w.shape[0]!)));
    expect(bits(fused.xn, nb * d)).toEqual(bits(apart.xn, nb * d));
    if (coeffs) expect(coeffs.fused).toEqual(coeffs.apart);
    // Not a vacuous equality: every row's outputs were written.
    for (let r = 0; r < nb; r++) {
      expect(bits(fused.xn, nb * d).slice(r * d, (r + 1) * d).some((v) => v !== 0)).toBe(true);
      const out0 = ws[0]!.shape[0]!;
      expect(bits(fused.ys[0]!, nb * out0).slice(r * out0, (r + 1) * out0).some((v) => v !== 0)).toBe(true);
      if (coeffs) expect(coeffs.fused.slice(r * hcMixCount(n), (r + 1) * hcMixCount(n)).some((v) => v !== 0)).toBe(true);
    }
  });
});

test("a decode row's fused read (matvec_multi_q4_r1_read_f32 / _norm_f32) gives the bits of the read + the one-simdgroup split form a GPU runs for narrow q4 groups (d <= 1,024)", () => {
  for (const [n, d, weights] of [
    [4, 256, [["q4", 512], ["q4", 256], ["bf16", 8], ["bf16", 8]]],
    [4, 1024, [["q4", 520]]],
    [1, 256, [["q4", 256], ["q4", 64]]],
  ] as [number, number, [DType, number][]][]) {
    process.env.CHERENKOV_HC_READ_TILES = "2";
    const { ws, fused, apart } = bothWays(n, d, 1, weights, 31 + n + d, "split");
    expect(fused.names).toEqual([n === 1 ? "matvec_multi_q4_r1_norm_f32" : r1ReadKernel(n)]);
    expect(apart.names.some((name) => /split_q4/.test(name))).toBe(true); // the q4 ones in the split form
    ws.forEach((w, i) => expect(bits(fused.ys[i]!, w.shape[0]!)).toEqual(bits(apart.ys[i]!, w.shape[0]!)));
    expect(bits(fused.ys[0]!, ws[0]!.shape[0]!).some((v) => v !== 0)).toBe(true);
  }
});

describe("a batch one row a threadgroup (a GPU's verify batch): the one-row fused kernel, a grid row a batch row, gives each row a decode row's bits", () => {
  const cases: [string, number, number, number, [DType, number][]][] = [
    ["DeltaNet's four (bf16 b, a beside q4 qkv, z)", 4, 256, 2, [["q4", 512], ["q4", 256], ["bf16", 8], ["bf16", 8]]],
    ["DeltaNet's four, four rows", 4, 256, 4, [["q4", 512], ["q4", 256], ["bf16", 8], ["bf16", 8]]],
    ["attention's four q4, three rows", 4, 256, 3, [["q4", 256], ["q4", 256], ["q4", 68], ["q4", 64]]],
    ["the MoE site's router and shared gate (bf16 alone), two streams", 2, 512, 3, [["bf16", 16], ["bf16", 1]]],
    ["rows of 1,024", 4, 1024, 2, [["q4", 520]]],
    ["the plain residual's read (n = 1: matvec_multi_q4_r1_norm_f32)", 1, 256, 3, [["q4", 256], ["q4", 256], ["q4", 64], ["q4", 64]]],
  ];
  test.each(cases)("%s: n = %i, d = %i, %i rows", (_, n, d, nb, weights) => {
    process.env.CHERENKOV_HC_READ_TILES = "2";
    process.env.CHERENKOV_MATVEC_GROUP_ROWS = "1"; // every backend: what a GPU does for up to 4 rows
    const { ws, fused, apart, coeffs } = bothWays(n, d, nb, weights, 53 + n + d + nb, "rows", null);
    expect(fused.names).toEqual([n === 1 ? "matvec_multi_q4_r1_norm_f32" : r1ReadKernel(n)]);
    // Apart: the read, then the q4 projections one row a threadgroup in their one-row forms.
    expect(apart.names[0]).toBe(n === 1 ? "rms_norm_f32" : "hc_coeffs_read_norm_f32");
    expect(apart.names.filter((k) => k.includes("q4")).every((k) => k.includes("_r1_"))).toBe(true);
    ws.forEach((w, i) => expect(bits(fused.ys[i]!, nb * w.shape[0]!)).toEqual(bits(apart.ys[i]!, nb * w.shape[0]!)));
    expect(bits(fused.xn, nb * d)).toEqual(bits(apart.xn, nb * d));
    if (coeffs) expect(coeffs.fused).toEqual(coeffs.apart);
    // Every row's outputs, read and coefficients were written (and differ row to row).
    const out0 = ws[0]!.shape[0]!;
    const y0 = bits(fused.ys[0]!, nb * out0);
    for (let r = 0; r < nb; r++) {
      expect(bits(fused.xn, nb * d).slice(r * d, (r + 1) * d).some((v) => v !== 0)).toBe(true);
      expect(y0.slice(r * out0, (r + 1) * out0).some((v) => v !== 0)).toBe(true);
      if (r > 0) expect(y0.slice(r * out0, (r + 1) * out0)).not.toEqual(y0.slice(0, out0));
      if (coeffs) expect(coeffs.fused.slice(r * hcMixCount(n), (r + 1) * hcMixCount(n)).some((v) => v !== 0)).toBe(true);
    }
  });
});

describe("a batch the rows form does not take encodes the read, then the projections", () => {
  const first = (nb: number, d: number, weights: [DType, number][], rowsEnv: string | undefined) => {
    const site = siteCase(dev, 4, d, nb, 90 + d + nb);
    const ws = weights.map(([dt, out], i) => uploadWeight(dev, dt, [out, d], 95 + i).ref);
    const got: string[] = [];
    process.env.CHERENKOV_HC_READ_FUSED = "1";
    if (rowsEnv === undefined) delete process.env.CHERENKOV_HC_READ_FUSED_ROWS;
    else process.env.CHERENKOV_HC_READ_FUSED_ROWS = rowsEnv;
    const xn = outputF32(dev, nb * d);
    run(dev, (ctx) =>
      encodeSiteProjections(
        recordingNames(ctx, got),
        ws.map((w) => ({ w, y: rows(outputF32(dev, nb * w.shape[0]!), w.shape[0]!) })),
        site.read(site.scratch(), xn),
        rows(xn, d),
        nb,
      ),
    );
    return got[0];
  };
  test("unset (the default: decode rows only), more rows than the option allows, rows past the staging (the 30b shape's d = 2,048)", () => {
    // (a GPU runs 2 rows one a threadgroup, each as it runs one decode row: above)
    expect(first(2, 256, [["q4", 512]], undefined)).toBe(dev.backend === "cpu" ? "hc_coeffs_read_norm_f32" : first(1, 256, [["q4", 512]], undefined));
    expect(first(3, 256, [["q4", 512]], "2")).toBe("hc_coeffs_read_norm_f32");
    expect(first(2, 256, [["q4", 512]], "2")).toBe("matvec_multi_q4_read_f32");
    expect(first(2, 2048, [["q4", 512]], "4")).toBe("hc_coeffs_read_norm_f32");
    // A decode row: fused on the CPU backend (the rows form); a GPU computes 512 q4 rows in the
    // split form (prefersSplit), which forms its read itself only up to d = 1,024.
    expect(first(1, 2048, [["q4", 512]], "4")).toBe(dev.backend === "cpu" ? r1ReadKernel(4) : "hc_coeffs_read_norm_f32");
  });
  test("CHERENKOV_HC_READ_FUSED_ROWS refuses what is not a row count in 1..4, by name", () => {
    for (const bad of ["0", "5", "2.5", "x"]) expect(() => first(2, 256, [["q4", 512]], bad)).toThrow(/CHERENKOV_HC_READ_FUSED_ROWS/);
  });
});
