// kernels/matvec.h has two forms of the q4 group dot: CUDA reads each nibble, masked in place,
// as a denormal float (q * 2^(b - 149)) against x scaled by a power of two; Metal and the CPU
// backend make it a normal float with the 2^23 magic number. Only the H200 runs the first, so
// this test reads both forms' masks and scale factors out of the source and checks, for every
// nibble value, that each slot of each word multiplies the element the prescale put there and
// that every product is q * x times the same power of two (2^-64 for CUDA, 1 for the other):
// a wrong mask, shift or exponent in either form fails here, on any machine.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { cudaCompileFlags } from "../../metal-shim/cuda/build.ts";

const SRC = readFileSync(join(import.meta.dir, "..", "..", "kernels", "matvec.h"), "utf8");

/** The source of one form: the CUDA branch (#if defined(__CUDA_ARCH__)) or the other (#else). */
function form(cuda: boolean): string {
  const start = SRC.indexOf("#if defined(__CUDA_ARCH__)\n// CUDA: a nibble masked in place");
  const mid = SRC.indexOf("#else", start);
  const end = SRC.indexOf("#endif", mid);
  if (start < 0 || mid < 0 || end < 0) throw new Error("kernels/matvec.h: the two q4 dot forms were not found");
  return cuda ? SRC.slice(start, mid) : SRC.slice(mid, end);
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
const asFloat = (bits: number) => ((u32[0] = bits >>> 0), f32[0]!);

/** The prescale's (q4_prescale_word's) eight slots (even 0..3, odd 0..3): which element of the 8 (a.x .. b.w) and its power of two. */
function prescale(src: string): { elem: number; exp: number }[] {
  const lane = { x: 0, y: 1, z: 2, w: 3 } as const;
  const slots: { elem: number; exp: number }[] = [];
  for (const half of ["even", "odd"]) {
    const m = new RegExp(`\\n  ${half} = float4\\(([^;]+)\\);`).exec(src);
    if (!m) throw new Error(`q4_prescale_word: no ${half}`);
    for (const term of m[1]!.split(",").map((t) => t.trim())) {
      const t = /^([ab])\.([xyzw])(?: \* 0x1p(-?\d+)f)?$/.exec(term);
      if (!t) throw new Error(`q4_prescale_word: cannot read "${term}"`);
      slots.push({ elem: (t[1] === "b" ? 4 : 0) + lane[t[2] as keyof typeof lane], exp: Number(t[3] ?? 0) });
    }
  }
  return slots;
}

/** The dot's eight slots as functions of the word: the float each one multiplies. */
function nibbleFloats(src: string, cuda: boolean): ((w: number) => number)[] {
  const words = (w: number): Record<string, number> => ({ w: w >>> 0, l: (w << 12) >>> 0, h: w >>> 12 });
  const out: ((w: number) => number)[] = [];
  for (const half of ["even", "odd"]) {
    const m = cuda
      ? new RegExp(`const float4 ${half} = float4\\(([^;]+)\\);`).exec(src)
      : new RegExp(`const float4 ${half} = q4_masked4\\(([^;]+)\\);`).exec(src);
    if (!m) throw new Error(`q4_group_dot: no ${half}`);
    for (const term of m[1]!.split(/,(?![^(]*\))/).map((t) => t.trim())) {
      const t = cuda ? /^as_type<float>\(([wlh]) & (0x[0-9A-F]+)u\)$/.exec(term) : /^([wh]) & (0x[0-9A-F]+)u$/.exec(term);
      if (!t) throw new Error(`q4_group_dot: cannot read "${term}"`);
      const [src_, mask] = [t[1]!, Number(t[2])];
      out.push(cuda ? (w) => asFloat(words(w)[src_]! & mask) : (w) => asFloat((words(w)[src_]! & mask) | 0x4b000000) - 8388608);
    }
  }
  return out;
}

describe.each([
  ["CUDA (denormal nibbles)", true, -64],
  ["Metal and CPU (2^23 magic number)", false, 0],
] as const)("the q4 group dot, %s", (_name, cuda, scale) => {
  const src = form(cuda);
  const slots = prescale(src);
  const floats = nibbleFloats(src, cuda);
  const back = cuda ? Number(/return q \* 0x1p(\d+)f;/.exec(src)?.[1] ?? NaN) : 0;

  test("eight slots cover the word's eight elements once each", () => {
    expect(slots.map((s) => s.elem).sort()).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(floats.length).toBe(8);
  });

  test("every slot's product is q * x times the same power of two, for every nibble value and position", () => {
    const x = 0.7831421494483948; // an f32 with a full mantissa
    for (let s = 0; s < 8; s++) {
      const { elem, exp } = slots[s]!;
      for (let q = 0; q < 16; q++) {
        // The word holding q at element `elem` and 15 - q elsewhere (the mask must cut them away).
        let w = 0;
        for (let e = 0; e < 8; e++) w |= (e === elem ? q : 15 - q) << (4 * e);
        const product = floats[s]!(w) * Math.fround(x * 2 ** exp); // exact in f64 (24 x 24 bits)
        expect(product).toBe(q * x * 2 ** scale);
      }
    }
    expect(back).toBe(cuda ? -scale : 0); // the sum is scaled back to q * x
  });

});

test("the CUDA form's range: x up to 2^55 stays finite once scaled; below the normal range a sum is off by at most 2^-85", () => {
  const slots = prescale(form(true));
  const maxExp = Math.max(...slots.map((s) => s.exp));
  expect(Number.isFinite(Math.fround(2 ** 55 * (1 - 2 ** -24) * 2 ** maxExp))).toBe(true);
  expect(Math.fround(2 ** 55 * 2 ** maxExp)).toBe(Infinity);
  // The denormal spacing (2^-149) scaled back by the form's 2^64.
  const back = Number(/return q \* 0x1p(\d+)f;/.exec(form(true))?.[1] ?? NaN);
  expect(2 ** -149 * 2 ** back).toBe(2 ** -85);
});

test("the CUDA build keeps IEEE denormals, which the CUDA form needs (no -ftz=true, no fast math)", () => {
  const flags = cudaCompileFlags("sm_90").join(" ");
  const build = readFileSync(join(import.meta.dir, "..", "..", "metal-shim", "cuda", "build.ts"), "utf8");
  for (const text of [flags, build]) expect(text).not.toMatch(/ftz=true|use_fast_math|-ftz\b/);
});
