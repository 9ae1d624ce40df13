// Hyper-connection kernels (kernels/hc.metal through lib/gpu/hyperconnection.ts and the
// final read in lib/gpu/sampling.ts) against lib/reference/hyperconnection.ts: coefficients
// (with Sinkhorn), a whole residual site (read + norm, write), n = 1, and the final read.
import { afterAll, describe, expect, test } from "bun:test";

import type { RowsRef } from "../../lib/gpu/dispatch.ts";
import { encodeHcCoefficients, encodeHcRead, encodeSiteRead, encodeSiteWrite, hcMixCount, type HcConfig, type HcScratch } from "../../lib/gpu/hyperconnection.ts";
import { encodeFinalRead } from "../../lib/gpu/sampling.ts";
import { hcCoefficients, hcFinalRead, hcMixes, hcRead, residualSite } from "../../lib/reference/hyperconnection.ts";
import { rmsNorm } from "../../lib/reference/ops.ts";
import type { Device } from "../../lib/shim.ts";
import { expectClose, hostTensor, NB_CASES, openDevice, outputF32, randomF32, readF32, rows, run, uploadF32, uploadWeights } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

const cfg: HcConfig = { streams: 4, eps: 1e-6, sinkhorn_iters: 20 };
const normEps = 1e-6;

// Coefficients pass through an f32 dot of n*d terms, sigmoid/exp and 20 Sinkhorn rounds of
// divisions: errors of a few 1e-7 that the rounds do not amplify (comb stays near uniform).
const COEFF_TOL = { abs: 2e-6, rel: 1e-5 };
// Stream values are sums of n products of coefficients and values up to ~3.
const STREAM_TOL = { abs: 1e-5, rel: 1e-5 };

function siteWeights(dev: Device, n: number, d: number, seed: number, head = false) {
  const M = hcMixCount(n, head);
  const tensors = {
    fn: hostTensor(randomF32(M * n * d, seed, 0.2, "fn"), "bf16", [M, n * d]),
    base: hostTensor(randomF32(M, seed, 1, "base"), "f32", [M]),
    scale: hostTensor(head ? new Float32Array([0.8]) : new Float32Array([0.7, 1.3, 2.1]), "f32", [head ? 1 : 3]),
    norm: hostTensor(randomF32(d, seed, 0.3, "norm"), "f32", [d]),
  };
  const { refs } = uploadWeights(dev, tensors);
  // The reference computes with the stored values (fn rounded to bf16).
  const host = { fn: tensors.fn.values, base: tensors.base.values, scale: tensors.scale.values, norm: tensors.norm.values };
  return { refs, host };
}

/** Coefficients [nb][M] and the raw partials of n*d = `flat` stream values ([M + 1][chunks rounded up to 4] a row). */
function scratch(nb: number, M: number, flat: number): HcScratch {
  const P = (M + 1) * Math.ceil(Math.ceil(flat / 256) / 4) * 4;
  return { raw: rows(outputF32(dev, nb * P), P), coeffs: rows(outputF32(dev, nb * M), M) };
}

/** [pre | post | comb] per row of X [nb][n][d], by the reference. */
function referenceCoefficients(host: ReturnType<typeof siteWeights>["host"], X: Float32Array, nb: number, d: number, c: HcConfig): Float32Array {
  const n = c.streams;
  const M = hcMixCount(n);
  const want = new Float32Array(nb * M);
  for (let r = 0; r < nb; r++) {
    const k = hcCoefficients(hcMixes(host.fn, X.subarray(r * n * d, (r + 1) * n * d), M, c.eps), host, c);
    want.set(k.pre, r * M);
    want.set(k.post, r * M + n);
    want.set(k.comb, r * M + 2 * n);
  }
  return want;
}

describe("hc_coeffs_f32 (site)", () => {
  test.each(NB_CASES)("nb = %i", (nb) => {
    const n = cfg.streams;
    const d = nb === 1024 ? 32 : 64;
    const M = hcMixCount(n);
    const { refs, host } = siteWeights(dev, n, d, 5);
    const X = randomF32(nb * n * d, nb, 2, "X");
    const Xb = uploadF32(dev, X);
    const s = scratch(nb, M, n * d);
    run(dev, (ctx) => encodeHcCoefficients(ctx, rows(Xb, n * d), refs, s, nb, cfg, d));
    const want = referenceCoefficients(host, X, nb, d, cfg);
    expectClose(readF32(s.coeffs.buffer, nb * M), want, COEFF_TOL, `hc_coeffs_f32 nb=${nb}`, M);
  });

  // n * n <= 32: one simdgroup's lanes hold comb; above: thread 0 serially (n = 6, 8).
  test.each([2, 3, 5, 6, 8])("n = %i", (n) => {
    const c = { ...cfg, streams: n };
    const nb = 3;
    const d = 32;
    const M = hcMixCount(n);
    const { refs, host } = siteWeights(dev, n, d, 11 + n);
    const X = randomF32(nb * n * d, 40 + n, 2, "X");
    const s = scratch(nb, M, n * d);
    run(dev, (ctx) => encodeHcCoefficients(ctx, rows(uploadF32(dev, X), n * d), refs, s, nb, c, d));
    const want = referenceCoefficients(host, X, nb, d, c);
    expectClose(readF32(s.coeffs.buffer, nb * M), want, COEFF_TOL, `hc_coeffs_f32 n=${n}`, M);
  });
});

describe("residual site: read (hc_coeffs_read_norm_f32), write (hc_write_f32)", () => {
  // n = 6: the coefficients' serial form hands pre to the read through threadgroup memory too.
  test.each([...NB_CASES.flatMap((nb) => [[nb, 4], [nb, 1]] as const), [2, 6] as const])("nb = %i, n = %i", (nb, n) => {
    const c = { ...cfg, streams: n };
    const d = nb === 1024 ? 32 : 96;
    const M = hcMixCount(n);
    const { refs, host } = siteWeights(dev, n, d, 9);
    const X = randomF32(nb * n * d, nb + n, 2, "X");
    const Y = randomF32(nb * d, nb + n, 1, "Y");
    const Xb = uploadF32(dev, X);
    const Yb = uploadF32(dev, Y);
    const xn = outputF32(dev, nb * d);
    const s = scratch(nb, M, n * d);
    const site = n === 1 ? null : refs;
    run(dev, (ctx) => {
      encodeSiteRead(ctx, rows(Xb, n * d), site, s, rows(xn, d), nb, c, d, { w: refs.norm, eps: normEps });
      encodeSiteWrite(ctx, rows(Xb, n * d), site, s, rows(Yb, d), nb, c, d);
    });
    const want = X.slice();
    let read = new Float32Array(0);
    residualSite(want, nb, d, c, n === 1 ? null : host, host.norm, normEps, (xs) => ((read = xs.slice()), Y));
    expectClose(readF32(xn, nb * d), read, STREAM_TOL, `hc_coeffs_read_norm_f32 nb=${nb} n=${n}`, d);
    expectClose(readF32(Xb, nb * n * d), want, STREAM_TOL, `hc_write_f32 nb=${nb} n=${n}`, n * d);
  });

  // d = 2112: more float4 columns (528) than a read threadgroup has threads (512), and more
  // chunks of the flat streams (33) than a simdgroup has lanes, so both loops take a second turn.
  test("wide rows: d = 2112, n = 4", () => {
    const n = 4;
    const d = 2112;
    const nb = 2;
    const c = { ...cfg, streams: n };
    const M = hcMixCount(n);
    const { refs, host } = siteWeights(dev, n, d, 21);
    const X = randomF32(nb * n * d, 77, 2, "X");
    const Y = randomF32(nb * d, 78, 1, "Y");
    const Xb = uploadF32(dev, X);
    const xn = outputF32(dev, nb * d);
    const s = scratch(nb, M, n * d);
    run(dev, (ctx) => {
      encodeSiteRead(ctx, rows(Xb, n * d), refs, s, rows(xn, d), nb, c, d, { w: refs.norm, eps: normEps });
      encodeSiteWrite(ctx, rows(Xb, n * d), refs, s, rows(uploadF32(dev, Y), d), nb, c, d);
    });
    const want = X.slice();
    let read = new Float32Array(0);
    residualSite(want, nb, d, c, host, host.norm, normEps, (xs) => ((read = xs.slice()), Y));
    expectClose(readF32(s.coeffs.buffer, nb * M), referenceCoefficients(host, X, nb, d, c), COEFF_TOL, "coefficients d=2112", M);
    expectClose(readF32(xn, nb * d), read, STREAM_TOL, "read d=2112", d);
    expectClose(readF32(Xb, nb * n * d), want, STREAM_TOL, "write d=2112", n * d);
  });

  test("rows the hc kernels cannot hold are refused by name, before anything is encoded", () => {
    // d = 30: not whole float4 columns.
    const n = 4;
    const odd = siteWeights(dev, n, 30, 3);
    const Xo = rows(outputF32(dev, n * 32), n * 32);
    const yo = rows(outputF32(dev, 32), 32);
    expect(() => run(dev, (ctx) => encodeSiteRead(ctx, Xo, odd.refs, scratch(1, hcMixCount(n), n * 30), yo, 1, cfg, 30, { w: odd.refs.norm, eps: normEps }))).toThrow(
      "hidden size 30 is not a multiple of 4",
    );
    expect(() => run(dev, (ctx) => encodeSiteWrite(ctx, Xo, odd.refs, scratch(1, hcMixCount(n), n * 30), yo, 1, cfg, 30))).toThrow("hc_write: hidden size 30");
    // n * d = 4 * 4352 = 17408 flat values: more than 64 chunks of 256.
    const wide = siteWeights(dev, n, 4352, 4);
    const Xw = rows(outputF32(dev, n * 4352), n * 4352);
    const yw = rows(outputF32(dev, 4352), 4352);
    expect(() => run(dev, (ctx) => encodeSiteRead(ctx, Xw, wide.refs, scratch(1, hcMixCount(n), n * 4352), yw, 1, cfg, 4352, { w: wide.refs.norm, eps: normEps }))).toThrow(
      "the hc kernels hold at most 16384 per row",
    );
  });

  test("needs site weights with n > 1", () => {
    const b: RowsRef = rows(dev.buffer(4096), 64);
    const { refs } = siteWeights(dev, 1, 16, 1);
    expect(() => run(dev, (ctx) => encodeSiteRead(ctx, b, null, scratch(1, 24, 64), b, 1, cfg, 16, { w: refs.norm, eps: normEps }))).toThrow(
      "hc site weights are required with 4 streams",
    );
  });
});

describe("final read (hc_coeffs_read_norm_f32, head)", () => {
  test.each(NB_CASES.flatMap((nb) => [[nb, 4], [nb, 1]] as const))("nb = %i, n = %i", (nb, n) => {
    const c = { ...cfg, streams: n };
    const d = nb === 1024 ? 32 : 64;
    const { refs, host } = siteWeights(dev, n, d, 13, true);
    const X = randomF32(nb * n * d, nb * 3 + n, 2, "X");
    const Xb = uploadF32(dev, X);
    const hidden = outputF32(dev, nb * d);
    run(dev, (ctx) =>
      encodeFinalRead(ctx, rows(Xb, n * d), n === 1 ? null : refs, scratch(nb, n, n * d), rows(hidden, d), nb, c, d, refs.norm, normEps),
    );
    const want = new Float32Array(nb * d);
    for (let r = 0; r < nb; r++) {
      const x = hcFinalRead(X.subarray(r * n * d, (r + 1) * n * d), n, d, n === 1 ? null : host, cfg.eps);
      want.set(rmsNorm(x, host.norm, normEps), r * d);
    }
    expectClose(readF32(hidden, nb * d), want, STREAM_TOL, `hc_final_read nb=${nb} n=${n}`, d);
  });
});

describe("hc_read_f32 (no norm)", () => {
  test.each(NB_CASES)("nb = %i", (nb) => {
    const n = 3;
    const d = nb === 1024 ? 32 : 80;
    const X = randomF32(nb * n * d, nb, 2, "X");
    const pre = randomF32(nb * 5, nb, 1, "pre"); // coefficient rows of 5 floats: pre first
    const y = outputF32(dev, nb * d);
    run(dev, (ctx) => encodeHcRead(ctx, rows(uploadF32(dev, X), n * d), rows(uploadF32(dev, pre), 5), rows(y, d), nb, n, d));
    const want = new Float32Array(nb * d);
    for (let r = 0; r < nb; r++) hcRead(X.subarray(r * n * d, (r + 1) * n * d), pre.subarray(r * 5, r * 5 + n), n, d, want.subarray(r * d, (r + 1) * d));
    expectClose(readF32(y, nb * d), want, STREAM_TOL, `hc_read_f32 nb=${nb}`, d); // n products and sums
  });
});
