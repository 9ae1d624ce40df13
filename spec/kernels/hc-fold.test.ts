// The fold (kernels/hc.h hc_store_lanes; lib/gpu/hc-fold.ts): a write into the streams that
// also leaves the next site's raw products, a partial per (mix, float4 column), which the next
// site's coefficients gather instead of running hc_mix_partials. Pinned here: the write keeps
// its bits; each partial is its column's fn . X' (and sum of squares) to f32 rounding; the
// coefficients, read and final read from folded partials agree with hc_mix_partials' and with
// the reference to the tolerance of hc.test.ts; every writer (hc_write_fold, matvec_hc in both
// forms, the q4 one-row form) leaves the same partials bits; the same bits run to run.
import { afterAll, describe, expect, test } from "bun:test";

import { hcFoldCount } from "../../lib/gpu/hc-fold.ts";
import { encodeHcCoefficients, encodeHcWrite, encodeSiteRead, hcFold, hcMixCount, hcPartialCount, type HcConfig, type HcScratch } from "../../lib/gpu/hyperconnection.ts";
import { encodeMatvec } from "../../lib/gpu/projections.ts";
import { encodeFinalRead } from "../../lib/gpu/sampling.ts";
import type { DType } from "../../lib/model/config.ts";
import { hcCoefficients, hcFinalRead, hcMixes, hcRead } from "../../lib/reference/hyperconnection.ts";
import { rmsNorm } from "../../lib/reference/ops.ts";
import type { Buffer } from "../../lib/shim.ts";
import { bitsOf as bits, expectClose, hostTensor, openDevice, outputF32, randomF32, readF32, rows, run, uploadF32, uploadWeight, uploadWeights } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

const cfg: HcConfig = { streams: 4, eps: 1e-6, sinkhorn_iters: 20 };
const normEps = 1e-6;
// hc.test.ts's tolerances against the reference (the fold changes only the order of the f32
// sums of fn . flat: per column, then over columns, where hc_mix_partials sums chunks of 256).
const COEFF_TOL = { abs: 2e-6, rel: 1e-5 };
const STREAM_TOL = { abs: 1e-5, rel: 1e-5 };
// One partial: 4n products of values up to ~3 in f32 against their f64 sum.
const PARTIAL_TOL = { abs: 1e-5, rel: 1e-5 };


/** The next site's weights (fn in `dtype`) and the host values the reference uses. */
function nextSite(n: number, d: number, dtype: DType, seed: number, head = false) {
  const M = hcMixCount(n, head);
  const tensors = {
    fn: hostTensor(randomF32(M * n * d, seed, 0.2, "fn"), dtype, [M, n * d]),
    base: hostTensor(randomF32(M, seed, 1, "base"), "f32", [M]),
    scale: hostTensor(head ? new Float32Array([0.8]) : new Float32Array([0.7, 1.3, 2.1]), "f32", [head ? 1 : 3]),
    norm: hostTensor(randomF32(d, seed, 0.3, "norm"), "f32", [d]),
  };
  const { refs } = uploadWeights(dev, tensors);
  return { refs, host: { fn: tensors.fn.values, base: tensors.base.values, scale: tensors.scale.values, norm: tensors.norm.values }, M };
}

/** Streams, the current site's coefficients and its sub-layer output y, for nb rows. */
function writeCase(nb: number, n: number, d: number, seed: number) {
  return {
    X: randomF32(nb * n * d, seed, 2, "X"),
    coeffs: uploadF32(dev, randomF32(nb * hcMixCount(n), seed, 1.5, "coeffs")),
    y: uploadF32(dev, randomF32(nb * d, seed, 1, "y")),
  };
}

/** Folded partials [nb][M + 1][d / 4] with room for a site's (the larger count). */
const foldBuffer = (nb: number, n: number, d: number) => outputF32(dev, nb * hcFoldCount(n, d));
const foldRows = (b: Buffer, n: number, d: number) => rows(b, hcFoldCount(n, d));

/** Every partial against its f64 sum from the written streams Xw and the host fn. */
function expectPartials(part: Float32Array, Xw: Float32Array, fn: Float32Array, nb: number, n: number, d: number, M: number, label: string) {
  const c4s = d / 4;
  const want = new Float32Array(part.length);
  for (let r = 0; r < nb; r++) {
    const X = Xw.subarray(r * n * d, (r + 1) * n * d);
    for (let m = 0; m <= M; m++) {
      for (let c4 = 0; c4 < c4s; c4++) {
        let v = 0;
        for (let j = 0; j < n; j++) {
          for (let k = 0; k < 4; k++) {
            const e = j * d + 4 * c4 + k;
            v += m < M ? fn[m * n * d + e]! * X[e]! : X[e]! * X[e]!;
          }
        }
        want[r * hcFoldCount(n, d) + m * c4s + c4] = v;
      }
    }
  }
  expectClose(part, want, PARTIAL_TOL, label, c4s);
}

function referenceCoefficients(host: ReturnType<typeof nextSite>["host"], X: Float32Array, nb: number, n: number, d: number, M: number): Float32Array {
  const c = { ...cfg, streams: n };
  const want = new Float32Array(nb * M);
  for (let r = 0; r < nb; r++) {
    const k = hcCoefficients(hcMixes(host.fn, X.subarray(r * n * d, (r + 1) * n * d), M, c.eps), host, c);
    want.set(k.pre, r * M);
    want.set(k.post, r * M + n);
    want.set(k.comb, r * M + 2 * n);
  }
  return want;
}

const siteScratch = (nb: number, n: number, d: number, M: number): HcScratch => ({
  raw: rows(outputF32(dev, nb * hcPartialCount(n, d)), hcPartialCount(n, d)),
  coeffs: rows(outputF32(dev, nb * M), M),
});

describe("hc_write_fold_f32: the write of hc_write_f32 and the next site's partials", () => {
  // n = 8: 81 items, more than a simdgroup's lanes (a lane takes items l, l + 32, l + 64).
  const cases: [DType, number, number][] = [
    ...(["bf16", "f16", "f32"] as const).flatMap((dt): [DType, number, number][] => [[dt, 4, 1], [dt, 4, 3]]),
    ["bf16", 2, 2],
    ["bf16", 8, 1],
    ["bf16", 4, 40],
  ];
  test.each(cases)("fn %s, n = %i, nb = %i", (dtype, n, nb) => {
    const d = 64;
    const c = { ...cfg, streams: n };
    const M = hcMixCount(n);
    const w = writeCase(nb, n, d, 3 + n + nb);
    const next = nextSite(n, d, dtype, 20 + n);
    const folded = uploadF32(dev, w.X);
    const plain = uploadF32(dev, w.X);
    const part = foldBuffer(nb, n, d);
    const fold = hcFold(next.refs, foldRows(part, n, d), c, d);
    run(dev, (ctx) => {
      encodeHcWrite(ctx, rows(folded, n * d), rows(w.coeffs, M), rows(w.y, d), nb, n, d, fold);
      encodeHcWrite(ctx, rows(plain, n * d), rows(w.coeffs, M), rows(w.y, d), nb, n, d);
    });
    expect(bits(folded, nb * n * d)).toEqual(bits(plain, nb * n * d));
    const Xw = readF32(plain, nb * n * d);
    expectPartials(readF32(part, nb * hcFoldCount(n, d)), Xw, next.host.fn, nb, n, d, M, `partials fn ${dtype} n=${n} nb=${nb}`);

    // The coefficients from the folded partials, from hc_mix_partials, and the reference's.
    const fromFold = siteScratch(nb, n, d, M);
    const fromMix = siteScratch(nb, n, d, M);
    run(dev, (ctx) => {
      encodeHcCoefficients(ctx, rows(plain, n * d), next.refs, fromFold, nb, c, d, false, fold.raw);
      encodeHcCoefficients(ctx, rows(plain, n * d), next.refs, fromMix, nb, c, d);
    });
    const got = readF32(fromFold.coeffs.buffer, nb * M);
    expectClose(got, readF32(fromMix.coeffs.buffer, nb * M), COEFF_TOL, `folded vs hc_mix_partials coefficients n=${n}`, M);
    expectClose(got, referenceCoefficients(next.host, Xw, nb, n, d, M), COEFF_TOL, `folded coefficients vs reference n=${n}`, M);

    // The same bits run to run: the partials' places and the gather's order are fixed.
    const again = foldBuffer(nb, n, d);
    const againX = uploadF32(dev, w.X);
    const againK = siteScratch(nb, n, d, M);
    run(dev, (ctx) => {
      encodeHcWrite(ctx, rows(againX, n * d), rows(w.coeffs, M), rows(w.y, d), nb, n, d, hcFold(next.refs, foldRows(again, n, d), c, d));
      encodeHcCoefficients(ctx, rows(againX, n * d), next.refs, againK, nb, c, d, false, foldRows(again, n, d));
    });
    expect(bits(again, nb * hcFoldCount(n, d))).toEqual(bits(part, nb * hcFoldCount(n, d)));
    expect(bits(againK.coeffs.buffer, nb * M)).toEqual(bits(fromFold.coeffs.buffer, nb * M));
  });
});

describe("reads from folded partials", () => {
  test.each([1, 3])("a site's read + norm (hc_coeffs_read_norm_f32), nb = %i", (nb) => {
    const [n, d] = [4, 96];
    const c = { ...cfg, streams: n };
    const M = hcMixCount(n);
    const w = writeCase(nb, n, d, 40 + nb);
    const next = nextSite(n, d, "bf16", 41);
    const X = uploadF32(dev, w.X);
    const part = foldBuffer(nb, n, d);
    const xn = outputF32(dev, nb * d);
    const s = siteScratch(nb, n, d, M);
    run(dev, (ctx) => {
      encodeHcWrite(ctx, rows(X, n * d), rows(w.coeffs, M), rows(w.y, d), nb, n, d, hcFold(next.refs, foldRows(part, n, d), c, d));
      encodeSiteRead(ctx, rows(X, n * d), next.refs, s, rows(xn, d), nb, c, d, { w: next.refs.norm, eps: normEps }, foldRows(part, n, d));
    });
    const Xw = readF32(X, nb * n * d);
    const want = new Float32Array(nb * d);
    const wantK = referenceCoefficients(next.host, Xw, nb, n, d, M);
    for (let r = 0; r < nb; r++) {
      const x = new Float32Array(d);
      hcRead(Xw.subarray(r * n * d, (r + 1) * n * d), wantK.subarray(r * M, r * M + n), n, d, x);
      want.set(rmsNorm(x, next.host.norm, normEps), r * d);
    }
    expectClose(readF32(s.coeffs.buffer, nb * M), wantK, COEFF_TOL, "folded site coefficients", M);
    expectClose(readF32(xn, nb * d), want, STREAM_TOL, "folded site read", d);
  });

  test.each([1, 3])("the final read (head: n mixes), nb = %i", (nb) => {
    const [n, d] = [4, 64];
    const c = { ...cfg, streams: n };
    const w = writeCase(nb, n, d, 50 + nb);
    const head = nextSite(n, d, "bf16", 51, true);
    const X = uploadF32(dev, w.X);
    const part = foldBuffer(nb, n, d);
    const hidden = outputF32(dev, nb * d);
    run(dev, (ctx) => {
      encodeHcWrite(ctx, rows(X, n * d), rows(w.coeffs, hcMixCount(n)), rows(w.y, d), nb, n, d, hcFold(head.refs, foldRows(part, n, d), c, d, true));
      encodeFinalRead(ctx, rows(X, n * d), head.refs, siteScratch(nb, n, d, n), rows(hidden, d), nb, c, d, head.refs.norm, normEps, foldRows(part, n, d));
    });
    const Xw = readF32(X, nb * n * d);
    expectPartials(readF32(part, nb * hcFoldCount(n, d)).map((v, i) => (i % hcFoldCount(n, d) < (n + 1) * (d / 4) ? v : 0)), Xw, head.host.fn, nb, n, d, n, "head partials");
    const want = new Float32Array(nb * d);
    for (let r = 0; r < nb; r++) want.set(rmsNorm(hcFinalRead(Xw.subarray(r * n * d, (r + 1) * n * d), n, d, head.host, cfg.eps), head.host.norm, normEps), r * d);
    expectClose(readF32(hidden, nb * d), want, STREAM_TOL, "folded final read", d);
  });
});

describe("matvec_hc with a fold: the write's bits, and the partials of hc_write_fold", () => {
  // rowsPerGroup 1: the q4 one-row (decode) kernels.
  const cases = (["q4", "bf16"] as const).flatMap((dt) => (["rows", "split"] as const).flatMap((f) => [[dt, f, 1, 1], [dt, f, 3, undefined]] as const));
  test.each(cases)("%s weights, %s form, nb = %i, rowsPerGroup %p", (dtype, form, nb, rowsPerGroup) => {
    const [n, d, inDim] = [4, 48, 96];
    const c = { ...cfg, streams: n };
    const M = hcMixCount(n);
    const { ref } = uploadWeight(dev, dtype, [d, inDim], 61);
    const x = rows(uploadF32(dev, randomF32(nb * inDim, nb, 1, "x")), inDim);
    const w = writeCase(nb, n, d, 62 + nb);
    const next = nextSite(n, d, "bf16", 63);
    const fusedX = uploadF32(dev, w.X);
    const plainX = uploadF32(dev, w.X);
    const writeX = uploadF32(dev, w.X);
    const fusedP = foldBuffer(nb, n, d);
    const writeP = foldBuffer(nb, n, d);
    const y = outputF32(dev, nb * d);
    run(dev, (ctx) => {
      const fold = hcFold(next.refs, foldRows(fusedP, n, d), c, d);
      encodeMatvec(ctx, ref, x, rows(y, d), nb, { form, rowsPerGroup, hc: { X: rows(fusedX, n * d), coeffs: rows(w.coeffs, M), streams: n, fold } });
      encodeMatvec(ctx, ref, x, rows(y, d), nb, { form, rowsPerGroup, hc: { X: rows(plainX, n * d), coeffs: rows(w.coeffs, M), streams: n } });
      encodeMatvec(ctx, ref, x, rows(y, d), nb, { form, rowsPerGroup });
      encodeHcWrite(ctx, rows(writeX, n * d), rows(w.coeffs, M), rows(y, d), nb, n, d, hcFold(next.refs, foldRows(writeP, n, d), c, d));
    });
    expect(bits(fusedX, nb * n * d)).toEqual(bits(plainX, nb * n * d));
    expect(bits(fusedX, nb * n * d)).toEqual(bits(writeX, nb * n * d));
    expect(bits(fusedP, nb * hcFoldCount(n, d))).toEqual(bits(writeP, nb * hcFoldCount(n, d)));
  });
});

describe("what cannot fold is refused by name", () => {
  test("hidden sizes that are not whole float4s of partials a mix, partials rows too short", () => {
    const n = 4;
    const odd = nextSite(n, 40, "bf16", 3);
    expect(() => hcFold(odd.refs, rows(outputF32(dev, hcFoldCount(n, 40)), hcFoldCount(n, 40)), cfg, 40)).toThrow("hidden size 40 is not a multiple of 16");
    const X = rows(outputF32(dev, n * 40), n * 40);
    expect(() => run(dev, (ctx) => encodeHcCoefficients(ctx, X, odd.refs, siteScratch(1, n, 40, hcMixCount(n)), 1, cfg, 40, false, rows(outputF32(dev, 1024), 1024)))).toThrow(
      "hidden size 40 cannot have folded partials",
    );
    const d = 32;
    const site = nextSite(n, d, "bf16", 4);
    expect(() => hcFold(site.refs, rows(outputF32(dev, 8), 8), cfg, d)).toThrow("hc fold: partials rows of stride 32");
  });
});
