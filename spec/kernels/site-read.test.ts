// A site's read formed by the projections that consume it (lib/gpu/site-read.ts,
// matvec_multi_q4_r1_read_f32): one dispatch gives, bit for bit, what the site's read kernel
// (hc_coeffs_read_norm_f32, from the folded partials) followed by the decode projections
// (matvec_multi_q4_r1_f32, bf16 ones first in the split form) give: the projections, the read
// stored to xn, and the site's coefficients. Steps it cannot take fall back to those two.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeSiteRead } from "../../lib/gpu/hyperconnection.ts";
import { encodeMatvecs, type Projection } from "../../lib/gpu/projections.ts";
import { encodeSiteProjections, r1ReadKernel } from "../../lib/gpu/site-read.ts";
import type { DType } from "../../lib/model/config.ts";
import type { Buffer } from "../../lib/shim.ts";
import { withEnvVar } from "../env-var.ts";
import { bitsOf as bits, openDevice, outputF32, recordingNames, restoreEnvAfterEach, rows, run, uploadWeight } from "./harness.ts";
import { siteCase } from "./site-case.ts";

const dev = openDevice();
afterAll(() => dev.close());
restoreEnvAfterEach("CHERENKOV_HC_READ_FUSED", "CHERENKOV_HC_READ_TILES");

/** The projections both ways: the fused dispatch and the read kernel + matvec_multi_q4_r1. */
function bothWays(n: number, d: number, weights: [DType, number][], seed: number) {
  const site = siteCase(dev, n, d, 1, seed);
  const ws = weights.map(([dt, out], i) => uploadWeight(dev, dt, [out, d], seed + 10 + i).ref);
  const outs = (): Buffer[] => ws.map((w) => outputF32(dev, w.shape[0]!));
  const items = (ys: Buffer[]): Projection[] => ws.map((w, i) => ({ w, y: rows(ys[i]!, w.shape[0]!) }));
  const fused = { ys: outs(), xn: outputF32(dev, d), s: site.scratch(), names: [] as string[] };
  const plain = { ys: outs(), xn: outputF32(dev, d), s: site.scratch(), names: [] as string[] };
  process.env.CHERENKOV_HC_READ_FUSED = "1";
  run(dev, (ctx) => encodeSiteProjections(recordingNames(ctx, fused.names), items(fused.ys), site.read(fused.s, fused.xn), rows(fused.xn, d), 1));
  run(dev, (ctx) => {
    const c = recordingNames(ctx, plain.names);
    encodeSiteRead(c, rows(site.X, n * d), site.refs, plain.s, rows(plain.xn, d), 1, site.cfg, d, { w: site.refs.norm, eps: 1e-6 }, site.folded);
    // bf16 alone: the split form a GPU gives them (the fused kernel's; a CPU would take rows).
    const bf16Only = weights.every(([dt]) => dt === "bf16");
    encodeMatvecs(c, items(plain.ys), rows(plain.xn, d), 1, bf16Only ? { form: "split" } : { mixed: true });
  });
  return { ws, fused, plain, M: site.M, site };
}

describe("matvec_multi_q4_r1_read_f32: the read kernel and the decode projections in one dispatch, the same bits", () => {
  // q4 groups of 3,072+ rows: the rows form on a GPU too (narrower ones take the split form
  // there, which the fused kernel does not compute: they fall back, below).
  const cases: [string, number, number, [DType, number][], string][] = [
    ["DeltaNet's four (bf16 b, a beside q4 qkv, z)", 4, 96, [["q4", 2048], ["q4", 1040], ["bf16", 8], ["bf16", 8]], "2"],
    ["attention's four q4, a tile a simdgroup", 4, 64, [["q4", 1024], ["q4", 1024], ["q4", 516], ["q4", 512]], "1"],
    ["attention's four q4, three tiles a simdgroup", 4, 64, [["q4", 1024], ["q4", 1024], ["q4", 516], ["q4", 512]], "3"],
    ["one q4, two streams", 2, 32, [["q4", 3076]], "2"],
    ["a row of 2,048 (two turns of the read a thread)", 4, 2048, [["q4", 3072], ["bf16", 4]], "2"],
    ["the MoE site's router and shared gate (bf16 alone)", 4, 64, [["bf16", 16], ["bf16", 1]], "2"],
    ["a router alone", 4, 96, [["bf16", 128]], "2"],
    // Wider sites take the general form (the coefficients' second gather and serial Sinkhorn).
    ["five streams (the second gather, Sinkhorn in lanes)", 5, 64, [["q4", 3072], ["bf16", 4]], "2"],
    ["eight streams (the second gather, serial Sinkhorn)", 8, 64, [["q4", 3072]], "2"],
  ];
  test.each(cases)("%s: n = %i, d = %i", (_, n, d, weights, tiles) => {
    process.env.CHERENKOV_HC_READ_TILES = tiles;
    const { ws, fused, plain, M } = bothWays(n, d, weights, 3 + n + d);
    expect(fused.names).toEqual([r1ReadKernel(n)]);
    expect(r1ReadKernel(n)).toBe(n <= 4 ? "matvec_multi_q4_r1_read_hc4_f32" : "matvec_multi_q4_r1_read_f32");
    // (a lone projection is a matvec of its own: matvec_q4_staged_r1_f32, the same pass over x)
    const bf16Only = weights.every(([dt]) => dt === "bf16");
    const plainForm = bf16Only ? (ws.length > 1 ? "matvec_multi_split_bf16_f32" : "matvec_split_bf16_f32") : ws.length > 1 ? "matvec_multi_q4_r1_f32" : "matvec_q4_staged_r1_f32";
    expect(plain.names).toEqual(["hc_coeffs_read_norm_f32", plainForm]);
    ws.forEach((w, i) => expect(bits(fused.ys[i]!, w.shape[0]!)).toEqual(bits(plain.ys[i]!, w.shape[0]!)));
    expect(bits(fused.xn, d)).toEqual(bits(plain.xn, d));
    expect(bits(fused.s.coeffs.buffer, M)).toEqual(bits(plain.s.coeffs.buffer, M));
    // Not a vacuous equality: the outputs were written.
    expect(bits(fused.xn, d).some((v) => v !== 0)).toBe(true);
    expect(bits(fused.ys[0]!, ws[0]!.shape[0]!).some((v) => v !== 0)).toBe(true);
  });
});

describe("steps the fused dispatch does not take encode the read, then the projections", () => {
  test("a row wider than the staging (4,096), a batch of rows, bf16 alone in the rows form, narrow q4 on a GPU, and CHERENKOV_HC_READ_FUSED=0", () => {
    const names = (n: number, d: number, nb: number, weights: [DType, number][], env = "1") => {
      const site = siteCase(dev, n, d, 1, 70 + d + nb);
      const ws = weights.map(([dt, out], i) => uploadWeight(dev, dt, [out, d], 80 + i).ref);
      const got: string[] = [];
      process.env.CHERENKOV_HC_READ_FUSED = env;
      const xn = outputF32(dev, nb * d);
      const s = site.scratch();
      run(dev, (ctx) =>
        encodeSiteProjections(
          recordingNames(ctx, got),
          ws.map((w) => ({ w, y: rows(outputF32(dev, nb * w.shape[0]!), w.shape[0]!) })),
          site.read(s, xn),
          rows(xn, d),
          nb,
        ),
      );
      return got[0];
    };
    expect(names(4, 4096, 1, [["q4", 8]])).toBe("hc_coeffs_read_norm_f32");
    // bf16 alone on the CPU backend (the rows form there), unless forced: the read kernel first.
    expect(names(4, 64, 1, [["bf16", 8], ["bf16", 8]], "")).toBe(dev.backend === "cpu" ? "hc_coeffs_read_norm_f32" : r1ReadKernel(4));
    // A batch of rows staged together reads first; a GPU's 3-row batch runs one row a
    // threadgroup (defaultRowsPerGroup), each row's read folded into its one-row kernel.
    withEnvVar("CHERENKOV_MATVEC_GROUP_ROWS", "3", () => expect(names(4, 64, 3, [["q4", 3072]])).toBe("hc_coeffs_read_norm_f32"));
    expect(names(4, 64, 3, [["q4", 3072]])).toBe(dev.backend === "cpu" ? "hc_coeffs_read_norm_f32" : r1ReadKernel(4));
    expect(names(4, 64, 1, [["q4", 3072]], "0")).toBe("hc_coeffs_read_norm_f32");
    expect(names(4, 64, 1, [["q4", 3072]])).toBe(r1ReadKernel(4));
    // A GPU computes a group of 8 q4 rows in the split form (prefersSplit): fused there only
    // where the split form is one simdgroup (d <= 1,024), whose sums the r1 kernel's are
    // (spec/kernels/site-read-rows.test.ts); at d = 2,048 two simdgroups split a row: not fused.
    expect(names(4, 64, 1, [["q4", 8]])).toBe(r1ReadKernel(4));
    expect(names(4, 2048, 1, [["q4", 8]])).toBe(dev.backend === "cpu" ? r1ReadKernel(4) : "hc_coeffs_read_norm_f32");
  });
});
