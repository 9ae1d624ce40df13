// The params ABI: kernels/params.h is what lib/gpu/params.ts generates, a C
// compiler lays the structs out as the TypeScript does, and packParams writes
// the bytes a kernel reads.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { paramsHeaderIsStale, PARAMS_HEADER, renderParamsHeader } from "../../lib/gpu/params-gen.ts";
import { defineParams, packParams, Params } from "../../lib/gpu/params.ts";

const ROOT = join(import.meta.dir, "..", "..");

describe("kernels/params.h", () => {
  test("is up to date (params-gen --check)", () => {
    const proc = Bun.spawnSync([process.execPath, join(ROOT, "lib/gpu/params-gen.ts"), "--check"], { stderr: "pipe" });
    expect(proc.stderr.toString()).toBe("");
    expect(proc.exitCode).toBe(0);
  });

  test("--check notices a header that differs", () => {
    const dir = mkdtempSync(join(tmpdir(), "cherenkov-params-"));
    try {
      const stale = join(dir, "params.h");
      writeFileSync(stale, renderParamsHeader().replace("uint32_t cols;", "uint32_t columns;"));
      expect(paramsHeaderIsStale(stale)).toBe(true);
      writeFileSync(stale, renderParamsHeader());
      expect(paramsHeaderIsStale(stale)).toBe(false);
      expect(paramsHeaderIsStale(join(dir, "missing.h"))).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a C compiler agrees with the TypeScript layout of every struct", () => {
    const dir = mkdtempSync(join(tmpdir(), "cherenkov-params-"));
    try {
      const structs = Object.values(Params);
      const lines = structs.flatMap((s) => [
        `  printf("${s.cName} size %zu\\n", sizeof(${s.cName}));`,
        ...s.fields.map((f) => `  printf("${s.cName}.${f.name} %zu %zu\\n", offsetof(${s.cName}, ${f.name}), sizeof(((${s.cName}*)0)->${f.name}));`),
      ]);
      const source = `#include <stddef.h>\n#include <stdio.h>\n#include "${PARAMS_HEADER}"\nint main(void) {\n${lines.join("\n")}\n  return 0;\n}\n`;
      writeFileSync(join(dir, "layout.c"), source);
      const exe = join(dir, "layout");
      const cc = Bun.spawnSync([process.env.CC ?? "cc", "-std=c11", "-Wall", "-o", exe, join(dir, "layout.c")], { stderr: "pipe" });
      expect(cc.stderr.toString()).toBe("");
      const run = Bun.spawnSync([exe]);
      const want = structs.flatMap((s) => [`${s.cName} size ${s.size}`, ...s.fields.map((f) => `${s.cName}.${f.name} ${f.offset} ${f.bytes}`)]);
      expect(run.stdout.toString().trim().split("\n")).toEqual(want);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// Structs local to these tests, so kernel families can reshape theirs freely.
const Mv = defineParams("Mv", "test", [
  { name: "rows", type: "i32" },
  { name: "in_dim", type: "i32" },
  { name: "out_dim", type: "i32" },
  { name: "_pad0", type: "u32" },
  { name: "w_offset", type: "u64" },
  { name: "x_stride", type: "u64" },
  { name: "y_stride", type: "u64" },
] as const);
const Norm = defineParams("RmsNorm", "test", [
  { name: "rows", type: "i32" },
  { name: "cols", type: "i32" },
  { name: "eps", type: "f32" },
  { name: "_pad0", type: "u32" },
  { name: "x_stride", type: "u64" },
  { name: "y_stride", type: "u64" },
] as const);

describe("packParams", () => {
  test("writes every field little-endian at its offset, padding zeroed", () => {
    const out = new Uint8Array(Mv.size).fill(0xff);
    packParams(Mv, { rows: -3, in_dim: 4096, out_dim: 7, w_offset: 2 ** 40 + 5, x_stride: 16n, y_stride: 0 }, out);
    const v = new DataView(out.buffer);
    expect(v.getInt32(0, true)).toBe(-3);
    expect(v.getInt32(4, true)).toBe(4096);
    expect(v.getInt32(8, true)).toBe(7);
    expect(v.getUint32(12, true)).toBe(0);
    expect(v.getBigUint64(16, true)).toBe(2n ** 40n + 5n);
    expect(v.getBigUint64(24, true)).toBe(16n);
    expect(v.getBigUint64(32, true)).toBe(0n);
    const rms = packParams(Norm, { rows: 1, cols: 2, eps: 1e-6, x_stride: 8, y_stride: 8 });
    expect(new DataView(rms.buffer).getFloat32(8, true)).toBe(Math.fround(1e-6));
  });

  test("arrays of values", () => {
    const S = defineParams("Test", "test", [
      { name: "mults", type: "u32", count: 3 },
      { name: "_pad0", type: "u32" },
      { name: "offset", type: "u64" },
    ] as const);
    expect(S.fields.map((f) => [f.name, f.offset])).toEqual([["mults", 0], ["_pad0", 12], ["offset", 16]]);
    const bytes = packParams(S, { mults: [1, 2, 0xffffffff], offset: 9 });
    expect(Array.from(new Uint32Array(bytes.buffer, 0, 3))).toEqual([1, 2, 0xffffffff]);
    expect(() => packParams(S, { mults: [1, 2], offset: 0 })).toThrow("TestParams.mults: expected an array of 3 values");
  });

  test("an f32 table given as a Float32Array packs as the same values in an array do; a wrong length is refused", () => {
    const S = defineParams("Table", "test", [
      { name: "n", type: "u32" },
      { name: "freq", type: "f32", count: 3 },
    ] as const);
    const table = new Float32Array([0.5, Math.fround(1 / 3), -2.25]);
    const fromTyped = packParams(S, { n: 7, freq: table });
    expect(Array.from(fromTyped)).toEqual(Array.from(packParams(S, { n: 7, freq: Array.from(table) })));
    expect(Array.from(new Float32Array(fromTyped.buffer, 4, 3))).toEqual(Array.from(table));
    // A view into a larger buffer: its own elements only.
    const view = new Float32Array([9, 0.5, Math.fround(1 / 3), -2.25, 9]).subarray(1, 4);
    expect(Array.from(packParams(S, { n: 7, freq: view }))).toEqual(Array.from(fromTyped));
    expect(() => packParams(S, { n: 7, freq: new Float32Array(2) })).toThrow("TableParams.freq: expected an array of 3 values");
  });

  test.each([
    ["a missing field", { rows: 1, cols: 2, eps: 0, x_stride: 0 }, "RmsNormParams.y_stride: missing"],
    ["an unknown field", { rows: 1, cols: 2, eps: 0, x_stride: 0, y_stride: 0, colz: 1 }, "RmsNormParams: unknown field colz"],
    ["a fractional i32", { rows: 1.5, cols: 2, eps: 0, x_stride: 0, y_stride: 0 }, "RmsNormParams.rows: 1.5 is not an i32"],
    ["an i32 overflow", { rows: 2 ** 31, cols: 2, eps: 0, x_stride: 0, y_stride: 0 }, "RmsNormParams.rows: 2147483648 is not an i32"],
    ["a negative u64", { rows: 1, cols: 2, eps: 0, x_stride: -1, y_stride: 0 }, "RmsNormParams.x_stride: expected a non-negative safe integer or bigint, got -1"],
    ["a u64 overflow", { rows: 1, cols: 2, eps: 0, x_stride: 2n ** 64n, y_stride: 0 }, "RmsNormParams.x_stride: 18446744073709551616 is outside u64"],
  ])("rejects %s", (_, values, message) => {
    expect(() => packParams(Norm, values as never)).toThrow(message);
  });
});

describe("defineParams enforces explicit padding", () => {
  test("a u64 at an offset that is not a multiple of 8", () => {
    expect(() => defineParams("Bad", "", [{ name: "n", type: "u32" }, { name: "stride", type: "u64" }])).toThrow(
      "BadParams.stride: at offset 4, not a multiple of 8: add a u32 padding field (_padN) before it",
    );
  });
  test("a size that is not a multiple of the largest field", () => {
    expect(() => defineParams("Bad", "", [{ name: "stride", type: "u64" }, { name: "n", type: "u32" }])).toThrow(
      "BadParams: size 12 is not a multiple of 8: add a trailing u32 padding field (_padN)",
    );
  });
  test("duplicate fields", () => {
    expect(() => defineParams("Bad", "", [{ name: "n", type: "u32" }, { name: "n", type: "u32" }])).toThrow("BadParams.n: declared twice");
  });
});
