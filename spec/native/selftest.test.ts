// The self-test kernels (kernels/selftest.metal) against TypeScript computations,
// on the selected backend (CHERENKOV_BACKEND).
import { afterAll, describe, expect, test } from "bun:test";

import { Device } from "../../lib/shim.ts";
import { random, runOnce, runThreads, selftestParams } from "./util.ts";

const dev = Device.open();
afterAll(() => dev.close());

describe("plain threads", () => {
  test.each([
    ["dispatch, grid a multiple of the threadgroup", false, 4096, 64],
    ["dispatch, last threadgroup has idle threads", false, 100_003, 256],
    ["dispatchThreads, partial last threadgroup", true, 100_003, 256],
    ["one thread", true, 1, 1],
  ] as const)("selftest_add_f32: %s", (_, byThreads, n, tg) => {
    const rand = random(n);
    const a = dev.buffer(n * 4), b = dev.buffer(n * 4), c = dev.buffer(n * 4 + 64);
    for (let i = 0; i < n; i++) {
      a.f32[i] = rand() * 100 - 50;
      b.f32[i] = rand() * 100 - 50;
    }
    c.f32.fill(-1);
    const params = selftestParams({ n });
    if (byThreads) runThreads(dev, "selftest_add_f32", n, tg, [null, a, b, c], params);
    else runOnce(dev, "selftest_add_f32", Math.ceil(n / tg), tg, [null, a, b, c], params);
    let wrong = 0;
    for (let i = 0; i < n; i++) if (c.f32[i] !== Math.fround(a.f32[i]! + b.f32[i]!)) wrong++;
    expect(wrong).toBe(0);
    expect(c.f32[n]).toBe(-1); // nothing written past n
    for (const buf of [a, b, c]) buf.release();
  });
});

describe("threadgroup memory and barriers", () => {
  const rows = 37;
  const cols = 1000;
  const x = dev.buffer(rows * cols * 4);
  const rand = random(7);
  for (let i = 0; i < rows * cols; i++) x.f32[i] = Math.round(rand() * 200 - 100) / 8; // exact sums
  const expected = Array.from({ length: rows }, (_, r) => {
    let s = 0;
    for (let c = 0; c < cols; c++) s += x.f32[r * cols + c]!;
    return 0.5 * s;
  });

  test.each([
    ["selftest_row_sum_tree_f32", 256],
    ["selftest_row_sum_tree_f32", 1024],
    ["selftest_row_sum_tree_f32", 1],
    ["selftest_row_sum_simd_f32", 256],
    ["selftest_row_sum_simd_f32", 96],
    ["selftest_row_sum_simd_f32", 1024],
  ] as const)("%s with %i threads per row", (kernel, tg) => {
    const out = dev.buffer(rows * 4);
    runOnce(dev, kernel, rows, tg, [null, x, out], selftestParams({ cols, scale: 0.5 }));
    expect(Array.from(out.f32.subarray(0, rows))).toEqual(expected);
    out.release();
  });

  test("atomics: device and threadgroup counters over many threadgroups", () => {
    const groups = 50, tg = 96;
    const counts = dev.buffer((1 + groups) * 4);
    runOnce(dev, "selftest_atomic_count", groups, tg, [null, counts]);
    expect(counts.u32[0]).toBe(groups * tg);
    expect(Array.from(counts.u32.subarray(1, 1 + groups))).toEqual(new Array(groups).fill(tg));
    counts.release();
  });
});

/** What each of the 12 outputs of selftest_simd should be; undefined where Metal leaves it undefined. */
function simdExpected(x: ArrayLike<number>, n: number, tg: number, round: (v: number) => number): (number | undefined)[] {
  const out: (number | undefined)[] = new Array(n * 12);
  for (let i = 0; i < n; i++) {
    const t = i % tg;
    const lane = t % 32;
    const base = i - lane;
    const active = (l: number) => l < 32 && base + l < n && Math.floor((base + l) / tg) === Math.floor(i / tg);
    const v = (l: number) => x[base + l]!;
    const lanes = Array.from({ length: 32 }, (_, l) => l).filter(active);
    const sumOf = (ls: number[]) => ls.reduce((s, l) => round(s + v(l)), 0);
    const o = (k: number, value: number | undefined) => (out[i * 12 + k] = value);
    o(0, sumOf(lanes));
    o(1, Math.max(...lanes.map(v)));
    o(2, Math.min(...lanes.map(v)));
    const src = (lane * 7 + 3) % 32;
    o(3, active(src) ? v(src) : undefined);
    o(4, active(lane ^ 5) ? v(lane ^ 5) : undefined);
    o(5, active(11) ? v(11) : undefined);
    o(6, sumOf(lanes.filter((l) => l < lane)));
    o(7, sumOf(lanes.filter((l) => l <= lane)));
    o(8, lane + 3 >= 32 ? v(lane) : active(lane + 3) ? v(lane + 3) : undefined);
    o(9, lane < 2 ? v(lane) : v(lane - 2));
    o(10, v(lanes[0]!));
    o(11, lane === lanes[0] ? 1 : 0);
  }
  return out;
}

describe("SIMD functions", () => {
  const cases = [
    // [kernel, n, threads per threadgroup]
    ["selftest_simd_f32", 1000, 64],
    ["selftest_simd_f32", 77, 96],
    ["selftest_simd_i32", 1000, 128],
    ["selftest_simd_i32", 45, 32],
    ["selftest_simd_f16", 300, 64],
  ] as const;

  test.each(cases)("%s, n = %i, %i threads per threadgroup", (kernel, n, tg) => {
    const rand = random(n * 31 + tg);
    const elem = kernel.endsWith("f16") ? 2 : 4;
    const x = dev.buffer(n * elem), out = dev.buffer(n * 12 * elem);
    const input =
      kernel === "selftest_simd_f32"
        ? Float32Array.from({ length: n }, () => rand() * 2 - 1)
        : Float32Array.from({ length: n }, () => Math.floor(rand() * 17) - 8); // exact in i32 and f16
    let read: (i: number) => number;
    if (kernel === "selftest_simd_f32") {
      x.f32.set(input);
      read = (i) => out.f32[i]!;
    } else if (kernel === "selftest_simd_i32") {
      x.i32.set(input);
      read = (i) => out.i32[i]!;
    } else {
      new Float16Array(x.bytes.buffer, 0, n).set(input);
      const o16 = new Float16Array(out.bytes.buffer, 0, n * 12);
      read = (i) => o16[i]!;
    }
    runOnce(dev, kernel, Math.ceil(n / tg), tg, [null, x, out], selftestParams({ n }));
    const round = kernel === "selftest_simd_f32" ? Math.fround : (v: number) => v;
    const expected = simdExpected(input, n, tg, round);
    const bad: string[] = [];
    for (let i = 0; i < n * 12; i++) {
      const want = expected[i];
      if (want === undefined) continue;
      const got = read(i);
      const tol = kernel === "selftest_simd_f32" ? 1e-5 * 32 : 0; // summation order differs
      if (!(Math.abs(got - want) <= tol)) bad.push(`thread ${Math.floor(i / 12)} output ${i % 12}: ${got} != ${want}`);
    }
    expect(bad.slice(0, 5)).toEqual([]);
    x.release();
    out.release();
  });
});

describe("builtins", () => {
  test.each([
    ["dispatchThreads, partial threadgroups on every axis", true, [37, 5, 3], [8, 4, 2]],
    ["dispatch, uniform 3D threadgroups", false, [4, 3, 2], [8, 4, 3]],
    ["dispatch, 1D threadgroups of 100 (partial simdgroup)", false, [3, 1, 1], [100, 1, 1]],
  ] as const)("%s", (_, byThreads, grid, tg) => {
    const threads = byThreads ? [...grid] : grid.map((g, i) => g * tg[i]!);
    const groups = byThreads ? grid.map((g, i) => Math.ceil(g / tg[i]!)) : [...grid];
    const total = threads[0]! * threads[1]! * threads[2]!;
    const out = dev.buffer(total * 20 * 4);
    if (byThreads) runThreads(dev, "selftest_builtins", grid, tg, [null, out]);
    else runOnce(dev, "selftest_builtins", grid, tg, [null, out]);
    const bad: string[] = [];
    for (let z = 0; z < threads[2]!; z++)
      for (let y = 0; y < threads[1]!; y++)
        for (let x = 0; x < threads[0]!; x++) {
          const pos = [x, y, z];
          const tgpig = pos.map((p, i) => Math.floor(p / tg[i]!));
          const tpitg = pos.map((p, i) => p % tg[i]!);
          const ntptg = tgpig.map((g, i) => Math.min(tg[i]!, threads[i]! - g * tg[i]!));
          const index = tpitg[0]! + ntptg[0]! * (tpitg[1]! + ntptg[1]! * tpitg[2]!);
          const want = [...pos, ...tpitg, ...tgpig, ...ntptg, ...groups, index, index % 32, Math.floor(index / 32), 32, 1];
          const at = 20 * (x + threads[0]! * (y + threads[1]! * z));
          const got = Array.from(out.u32.subarray(at, at + 20));
          if (got.join() !== want.join()) bad.push(`(${pos}): ${got} != ${want}`);
        }
    expect(bad.slice(0, 3)).toEqual([]);
    out.release();
  });
});

test("conversions and vector math: half, bfloat, dot, as_type", () => {
  const values = [0, 1, -2.5, 1 / 3, 65504, 70000, 1e-6, -123.456, 3.1415927, 1.00390625, 255.5];
  const n = values.length;
  const x = dev.buffer(n * 4), out = dev.buffer(n * 16);
  x.f32.set(values);
  runOnce(dev, "selftest_convert_f32", 1, 32, [null, x, out], selftestParams({ n }));
  const bfloat = (v: number) => {
    const u = new Uint32Array(new Float32Array([v]).buffer)[0]!;
    const r = ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) << 16;
    return new Float32Array(new Uint32Array([r >>> 0]).buffer)[0]!;
  };
  for (let i = 0; i < n; i++) {
    const v = x.f32[i]!;
    expect(Array.from(out.f32.subarray(4 * i, 4 * i + 4))).toEqual([
      Math.f16round(v),
      bfloat(v),
      Math.fround(2 * v + 12),
      -v,
    ]);
  }
  x.release();
  out.release();
});
