// lib/reference's hyper-connection functions against transformers' DeepSeek-V4 mHC code
// (fixtures/mhc, made by make_fixtures.py): the site coefficients (pre, post, the Sinkhorn
// comb), the gated read, the write (mixing + injection) and the final read before the head.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { SafetensorsFile, toF32 } from "../../lib/convert/safetensors.ts";
import { hcCoefficients, hcFinalRead, hcMixes, hcRead, hcWrite } from "../../lib/reference/index.ts";

const DIR = join(import.meta.dir, "fixtures", "mhc");
const meta: { cases: { n: number; d: number; rows: number; iters: number; eps: number; prefix: string }[] } = JSON.parse(
  readFileSync(join(DIR, "mhc.json"), "utf8"),
);
const file = new SafetensorsFile(join(DIR, "mhc.safetensors"));
const get = (name: string) => toF32(file.read(name), file.tensors.get(name)!.dtype, name);

/** max |got - want| / max(|want|, 1e-3): relative for large values, absolute near zero. */
function relErr(got: ArrayLike<number>, want: ArrayLike<number>): number {
  expect(got.length).toBe(want.length);
  let diff = 0;
  let scale = 1e-3;
  for (let i = 0; i < want.length; i++) {
    diff = Math.max(diff, Math.abs(got[i]! - want[i]!));
    scale = Math.max(scale, Math.abs(want[i]!));
  }
  return diff / scale;
}

const TOL = 1e-5;

describe("mHC against transformers deepseek_v4", () => {
  for (const c of meta.cases) {
    test(`n=${c.n} d=${c.d} sinkhorn_iters=${c.iters}: pre, post, comb, read, write and the head's read`, () => {
      const p = c.prefix;
      const { n, d } = c;
      const X = get(`${p}X`);
      const y = get(`${p}y`);
      const site = { fn: get(`${p}fn`), base: get(`${p}base`), scale: get(`${p}scale`) };
      const head = { fn: get(`${p}head_fn`), base: get(`${p}head_base`), scale: get(`${p}head_scale`) };
      const cfg = { streams: n, eps: c.eps, sinkhorn_iters: c.iters };
      const [pre, post, comb, read, written, headRead] = ["pre", "post", "comb", "read", "written", "head_read"].map((k) => get(`${p}${k}`));
      for (let r = 0; r < c.rows; r++) {
        const streams = X.slice(r * n * d, (r + 1) * n * d);
        const co = hcCoefficients(hcMixes(site.fn, streams, 2 * n + n * n, c.eps), site, cfg);
        expect(relErr(co.pre, pre!.subarray(r * n, (r + 1) * n))).toBeLessThan(TOL);
        expect(relErr(co.post, post!.subarray(r * n, (r + 1) * n))).toBeLessThan(TOL);
        expect(relErr(co.comb, comb!.subarray(r * n * n, (r + 1) * n * n))).toBeLessThan(TOL);
        expect(relErr(hcRead(streams, co.pre, n, d), read!.subarray(r * d, (r + 1) * d))).toBeLessThan(TOL);
        const out = streams.slice();
        hcWrite(out, y.subarray(r * d, (r + 1) * d), co.post, co.comb, n, d);
        expect(relErr(out, written!.subarray(r * n * d, (r + 1) * n * d))).toBeLessThan(TOL);
        expect(relErr(hcFinalRead(streams, n, d, head, c.eps), headRead!.subarray(r * d, (r + 1) * d))).toBeLessThan(TOL);
      }
    });
  }

  test("the fixture's 20-iteration comb matrices are near doubly stochastic and far from the identity (not trivial data)", () => {
    const c = meta.cases.find((x) => x.iters === 20)!;
    const comb = get(`${c.prefix}comb`);
    const n = c.n;
    let offDiagonalMass = 0;
    for (let r = 0; r < c.rows; r++)
      for (let i = 0; i < n; i++) {
        let row = 0;
        let col = 0;
        for (let j = 0; j < n; j++) {
          row += comb[r * n * n + i * n + j]!;
          col += comb[r * n * n + j * n + i]!;
          if (i !== j) offDiagonalMass += comb[r * n * n + i * n + j]!;
        }
        expect(Math.abs(col - 1)).toBeLessThan(1e-4);
        expect(Math.abs(row - 1)).toBeLessThan(0.05); // Sinkhorn ends on a column step
      }
    expect(offDiagonalMass).toBeGreaterThan(0.5);
  });
});
