// A hyper-connection site for the fused-read kernel tests (site-read, site-read-rows): nb rows
// of n streams after a folded write (so their partials exist), the site's weights and its norm.
import { hcFoldCount } from "../../lib/gpu/hc-fold.ts";
import { encodeHcWrite, hcFold, hcMixCount, hcPartialCount, type HcConfig, type HcScratch } from "../../lib/gpu/hyperconnection.ts";
import type { SiteRead } from "../../lib/gpu/site-read.ts";
import type { Buffer, Device } from "../../lib/shim.ts";
import { hostTensor, outputF32, randomF32, rows, run, uploadF32, uploadWeights } from "./harness.ts";

export function siteCase(dev: Device, n: number, d: number, nb: number, seed: number) {
  const cfg: HcConfig = { streams: n, eps: 1e-6, sinkhorn_iters: 20 };
  const M = hcMixCount(n);
  const { refs } = uploadWeights(dev, {
    fn: hostTensor(randomF32(M * n * d, seed, 0.2, "fn"), "bf16", [M, n * d]),
    base: hostTensor(randomF32(M, seed, 1, "base"), "f32", [M]),
    scale: hostTensor(new Float32Array([0.7, 1.3, 2.1]), "f32", [3]),
    norm: hostTensor(randomF32(d, seed, 0.3, "norm"), "f32", [d]),
  });
  const X = uploadF32(dev, randomF32(nb * n * d, seed, 2, "X"));
  const folded = rows(outputF32(dev, nb * hcFoldCount(n, d)), hcFoldCount(n, d));
  const k = rows(uploadF32(dev, randomF32(nb * M, seed, 1.5, "k")), M);
  run(dev, (ctx) => encodeHcWrite(ctx, rows(X, n * d), k, rows(uploadF32(dev, randomF32(nb * d, seed, 1, "y")), d), nb, n, d, hcFold(refs, folded, cfg, d)));
  const scratch = (): HcScratch => ({ raw: rows(outputF32(dev, nb * hcPartialCount(n, d)), hcPartialCount(n, d)), coeffs: rows(outputF32(dev, nb * M), M) });
  const read = (s: HcScratch, xn: Buffer): SiteRead => ({ X: rows(X, n * d), site: refs, scratch: s, xn: rows(xn, d), cfg, d, norm: { w: refs.norm, eps: 1e-6 }, folded });
  return { cfg, M, refs, X, folded, scratch, read };
}
