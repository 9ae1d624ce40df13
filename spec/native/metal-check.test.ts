// The Metal backend's checks that run on Linux (metal-shim/metal/check.ts):
// (a) kernels/*.metal against a strict prelude with distinct address spaces,
// (b) metal-shim/metal/*.m against Apple's API as transcribed in sdk/,
// (c) the .m files define exactly cherenkov.h's functions.
// Each check also meets inputs it must reject, so a check that silently
// stopped checking would fail here.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import {
  HEADER,
  METAL_DIR,
  OBJC_TARGET,
  type SdkGeneration,
  apiSignatures,
  checkAbi,
  checkKernels,
  checkObjc,
  clangPath,
  findClang,
  machOSymbols,
  metalSources,
  objcFlags,
  rewriteForStrict,
} from "../../metal-shim/metal/check.ts";
import { localLibraryPath } from "../../metal-shim/build.ts";
import { optionalTool } from "../optional-tool.ts";

// These checks exist for machines without a Mac. On macOS without clang-19
// the real build of the Metal library (Apple's SDK and compiler) stands in
// for them. Elsewhere they need clang-19: skipped with a message when it is
// missing, required under CI=true (.ci/run installs it for them).
const appleStandsIn = process.platform === "darwin" && !clangPath();
if (appleStandsIn) {
  test("on macOS without clang-19, the Metal library is built by Apple's toolchain instead", () => {
    expect(existsSync(localLibraryPath("metal"))).toBe(true);
  });
}
const runChecks =
  !appleStandsIn &&
  optionalTool({
    tool: "clang-19",
    path: clangPath(),
    checks: "strict Metal checks (spec/native/metal-check.test.ts)",
    enable: "apt-get install clang-19, or set CK_CLANG to a clang 19",
  });
const describeChecks = runChecks ? describe : () => {};

const scratch = mkdtempSync(join(tmpdir(), "cherenkov-metal-check-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

let dirCount = 0;
/** A kernel directory holding the given files. */
function kernelDir(files: Record<string, string>): string {
  const dir = join(scratch, `k${dirCount++}`);
  mkdirSync(dir);
  for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
  return dir;
}

const HEADER_OF_KERNEL = "#include <metal_stdlib>\nusing namespace metal;\n";

// Valid MSL using what the project's kernels use: a params struct from a
// quoted include, constant and device arguments, threadgroup arrays and
// atomics, a helper taking a threadgroup pointer, SIMD functions, barriers,
// vector constructors and swizzles, half/bfloat conversions, as_type,
// numeric_limits, precise/fast math, a template instantiated under host names.
const GOOD_PARAMS = `#pragma once
typedef struct {
  int32_t rows;
  int32_t cols;
  float eps;
  uint32_t _pad0;
  uint64_t row_stride;
} NormParams;
static_assert(sizeof(NormParams) == 24, "NormParams");
`;
const GOOD_KERNEL = `${HEADER_OF_KERNEL}#include "params.h"
constant float kHalf = 0.5f;

inline float block_sum(threadgroup float *partial, float v, ushort lane, ushort sg, ushort nsg) {
  v = simd_sum(v);
  if (lane == 0) partial[sg] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return simd_sum(lane < nsg ? partial[lane] : 0.0f);
}

template <typename T>
kernel void norm(constant NormParams &p [[buffer(0)]],
                 device const T *x [[buffer(1)]],
                 device const bfloat *w [[buffer(2)]],
                 device float *y [[buffer(3)]],
                 device atomic_uint *seen [[buffer(4)]],
                 uint row [[threadgroup_position_in_grid]],
                 uint t [[thread_index_in_threadgroup]],
                 uint nt [[threads_per_threadgroup]],
                 ushort lane [[thread_index_in_simdgroup]],
                 ushort sg [[simdgroup_index_in_threadgroup]],
                 ushort nsg [[simdgroups_per_threadgroup]]) {
  threadgroup float partial[32];
  threadgroup atomic_uint arrived;
  threadgroup float4 tiles[4], spare[4];
  device const T *xr = x + row * p.cols;
  float acc = 0.0f;
  for (uint c = t; c < uint(p.cols); c += nt) acc = fma(float(xr[c]), float(xr[c]), acc);
  float inv = rsqrt(block_sum(partial, acc, lane, sg, nsg) / float(p.cols) + p.eps) * kHalf;
  for (uint c = t; c < uint(p.cols); c += nt) y[row * p.cols + c] = float(xr[c]) * inv * float(w[c]);
  float4 a = float4(1.0f, 2.0f, 3.0f, 4.0f);
  float4 b = float4(a.xy, a.zw) + float4(0.5f);
  half4 h = half4(b);
  bool4 less = a < b;
  tiles[0] = select(a, b, less) + clamp(b, 0.0f, 1.0f) + float4(float2(h.xy), 0.0f, 1.0f);
  spare[0] = tiles[0];
  atomic_fetch_add_explicit(&arrived, 1u, memory_order_relaxed);
  atomic_fetch_add_explicit(seen, as_type<uint>(inv) & 1u, memory_order_relaxed);
  y[0] += simd_shuffle_down(acc, ushort(1)) + precise::exp(acc) + fast::tanh(acc) +
          numeric_limits<float>::infinity() * 0.0f;
}

template [[host_name("norm_f32")]] kernel decltype(norm<float>) norm<float>;
#define INSTANTIATE_NORM(T, suffix) \\
  template [[host_name("norm_" #suffix)]] kernel decltype(norm<T>) norm<T>;
INSTANTIATE_NORM(half, f16)

kernel void copy_rows(device const float4 *src [[buffer(1)]], device float4 *dst [[buffer(2)]],
                      uint3 gid [[thread_position_in_grid]]) {
  dst[gid.x] = src[gid.x];
}
`;

describeChecks("(a) kernels: strict syntax check with Metal's address spaces", () => {
  test("every kernels/*.metal passes", async () => {
    const r = await checkKernels();
    expect({ ok: r.ok, output: r.output }).toEqual({ ok: true, output: "" });
    for (const f of r.files) expect(f).toMatch(/^kernels\/[\w-]+\.metal$/);
  });

  test("a representative valid kernel passes without a message", async () => {
    const r = await checkKernels(kernelDir({ "params.h": GOOD_PARAMS, "good.metal": GOOD_KERNEL }));
    expect({ ok: r.ok, output: r.output }).toEqual({ ok: true, output: "" });
    expect(r.files).toHaveLength(1);
  });

  // Each must fail, with the message Metal's own compiler would give in spirit.
  const bad: [string, string, RegExp][] = [
    [
      "a threadgroup pointer assigned to a device pointer",
      `kernel void k(device float *y [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  threadgroup float tile[32];
  device float *p = tile;
  p[i] = y[i];
}`,
      /bad\.metal:5:\d+: error: cannot initialize a variable of type 'device float \*' with an lvalue of type 'threadgroup float\[32\]'/,
    ],
    [
      "a pointer argument without an address space",
      "kernel void k(float *y [[buffer(1)]], uint i [[thread_position_in_grid]]) { y[i] = 0; }",
      /bad\.metal:3:\d+: error: argument 'y' of kernel 'k': a pointer or reference argument needs an address space/,
    ],
    [
      "a device pointer passed where a thread pointer is expected",
      `inline void zero(float *p, uint i) { p[i] = 0; }
kernel void k(device float *y [[buffer(1)]], uint i [[thread_position_in_grid]]) { zero(y, i); }`,
      /bad\.metal:4:\d+: error: no matching function for call to 'zero'[\s\S]*cannot pass pointer to address space/,
    ],
    [
      "a write through a constant pointer",
      "kernel void k(constant float *c [[buffer(1)]], uint i [[thread_position_in_grid]]) { c[i] = 1.0f; }",
      /error: read-only variable is not assignable/,
    ],
    [
      "a vector constructor whose parts do not add up",
      `kernel void k(device float4 *y [[buffer(1)]], uint i [[thread_position_in_grid]]) {
  float2 a = float2(1.0f, 2.0f);
  y[i] = float4(a, 1.0f);
}`,
      /vector constructor: the components given do not add up[\s\S]*bad\.metal:5:\d+: note: in instantiation/,
    ],
    [
      "double, which MSL does not have",
      "kernel void k(device float *y [[buffer(1)]], uint i [[thread_position_in_grid]]) { double d = y[i]; y[i] = float(d); }",
      /bad\.metal:3:\d+: error: attempt to use a poisoned identifier/,
    ],
    [
      "a builtin of the wrong type and a buffer index used twice",
      "kernel void k(device float *y [[buffer(1)]], float i [[thread_position_in_grid]], device float *z [[buffer(1)]]) { y[0] = i; }",
      /\[\[thread_position_in_grid\]\] needs a uint[\s\S]*\[\[buffer\(1\)\]\] is also used by 'y'/,
    ],
    [
      "a [[threadgroup(n)]] argument cherenkov.h cannot size",
      "kernel void k(threadgroup float *t [[threadgroup(0)]], device float *y [[buffer(1)]]) { y[0] = t[0]; }",
      /\[\[threadgroup\(n\)\]\] arguments cannot be sized through cherenkov\.h/,
    ],
  ];
  for (const [what, body, message] of bad) {
    test(`rejects ${what}`, async () => {
      const r = await checkKernels(kernelDir({ "bad.metal": HEADER_OF_KERNEL + body + "\n" }));
      expect(r.ok).toBe(false);
      expect(r.output).toMatch(message);
    });
  }

  test("the rewrite keeps line numbers and only touches threadgroup declarations and host_name", () => {
    const src = `inline void f(threadgroup float *p) {
  threadgroup float a[4];
  threadgroup S s;
  threadgroup uint x[2], y[2];
}
template [[host_name("f_x")]] kernel void g<float>(device float *);
#define INST(T) \\
  template [[host_name("g_" #T)]] kernel void g<T>(device T *);
`;
    const out = rewriteForStrict(src);
    expect(out.split("\n")).toHaveLength(src.split("\n").length);
    expect(out).toContain("inline void f(threadgroup float *p)"); // a parameter stays as written
    expect(out).toContain("static threadgroup float a[4];"); // built-in type: no initializer
    expect(out).toContain("static threadgroup S s = {};"); // a struct is value-initialised
    expect(out).toContain("static threadgroup uint x[2], y[2];");
    expect(out).toMatch(/template\s+kernel void g<float>/);
    expect(out).not.toContain("host_name");
  });

  test("a struct's threadgroup pointer member stays a member (inside a function's struct too)", () => {
    const src = `struct Src {
  threadgroup const float4* xs;
};
inline void f() {
  struct Local { threadgroup float* p; };
  threadgroup float a[4];
}
`;
    const out = rewriteForStrict(src);
    expect(out).toContain("  threadgroup const float4* xs;");
    expect(out).toContain("struct Local { threadgroup float* p; };");
    expect(out).toContain("static threadgroup float a[4];");
  });
});

describeChecks("(b) objc: the Metal backend against Apple's declarations", () => {
  test("every metal-shim/metal/*.m and common/io.c pass, against the macOS 14 and the macOS 15 SDK", async () => {
    const r = await checkObjc();
    expect({ ok: r.ok, output: r.output }).toEqual({ ok: true, output: "" });
    expect(r.files).toEqual(expect.arrayContaining(["metal-shim/metal/commands.m", "metal-shim/metal/device.m", "metal-shim/metal/library.m", "metal-shim/common/io.c"]));
  });

  /** A copy of a real .m with one edit, checked alone. */
  async function checkEdited(file: string, from: string | RegExp, to: string, opts: { sdks?: readonly SdkGeneration[] } = {}) {
    const text = readFileSync(join(METAL_DIR, file), "utf8");
    const edited = text.replace(from, to);
    expect(edited).not.toBe(text); // the edit applied
    const path = join(scratch, `edited-${dirCount++}-${file}`);
    writeFileSync(path, edited);
    return checkObjc([path], { ioSource: null, ...opts });
  }

  // Issue 9 item 2: @available is a run-time check; the names must also exist in the SDK,
  // and the macOS 14 SDK (Xcode 15) has no MTLResidencySet, mathMode, ...
  test("macOS 15 API without the compile-time SDK guard fails against the macOS 14 SDK", async () => {
    const r = await checkEdited("device.m", /#if CK_SDK_HAS_MACOS15/g, "#if 1", { sdks: [14] });
    expect(r.ok).toBe(false);
    expect(r.output).toContain("[macOS 14 SDK]");
    expect(r.output).toMatch(/error: (no type or protocol named 'MTLResidencySet'|use of undeclared identifier 'MTLResidencySetDescriptor')/);
  });

  test("the same file passes against the macOS 15 SDK (the guard is what the 14 SDK needs)", async () => {
    const r = await checkEdited("device.m", /#if CK_SDK_HAS_MACOS15/g, "#if 1", { sdks: [15] });
    expect({ ok: r.ok, output: r.output }).toEqual({ ok: true, output: "" });
  });

  /** Selector names an object file sends (Objective-C method-name strings). */
  function selectorsOf(source: string, sdk: SdkGeneration): string {
    const object = join(scratch, `sel-${dirCount++}.o`);
    const proc = Bun.spawnSync([findClang(), ...objcFlags(OBJC_TARGET, sdk), "-O2", "-c", source, "-o", object]);
    expect(proc.exitCode).toBe(0);
    return readFileSync(object).toString("latin1");
  }

  // Issue 9 item 3: on macOS 15 fast FP32 functions are the default even with mathMode Safe.
  test("built with the macOS 15 SDK, the library asks for Safe math and Precise FP32 functions", () => {
    const sel15 = selectorsOf(join(METAL_DIR, "library.m"), 15);
    expect(sel15).toContain("setMathMode:");
    expect(sel15).toContain("setMathFloatingPointFunctions:");
    expect(readFileSync(join(METAL_DIR, "library.m"), "utf8")).toMatch(/mathFloatingPointFunctions\s*=\s*MTLMathFloatingPointFunctionsPrecise;/);
    const sel14 = selectorsOf(join(METAL_DIR, "library.m"), 14);
    expect(sel14).toContain("setFastMathEnabled:");
    expect(sel14).not.toContain("setMathMode:");
  });

  // Issue 9 item 6, as far as an object file shows it (nothing here runs Metal).
  test("command buffers ask for encoder execution status; dispatches are signposted so a GPU fault names its kernels", () => {
    const sel = selectorsOf(join(METAL_DIR, "commands.m"), 15);
    for (const s of ["commandBufferWithDescriptor:", "setErrorOptions:", "setRetainedReferences:", "insertDebugSignpost:", "debugSignposts", "errorState"]) expect(sel).toContain(s);
    expect(sel).toContain("_MTLCommandBufferEncoderInfoErrorKey");
    expect(sel).not.toMatch(/\bcommandBuffer\0/); // the plain queue call (no error options) is gone
  });

  test("compiled libraries and pipelines are cached per process, not per device", () => {
    const text = readFileSync(join(METAL_DIR, "library.m"), "utf8");
    const device = readFileSync(join(METAL_DIR, "device.m"), "utf8");
    expect(selectorsOf(join(METAL_DIR, "library.m"), 15)).toContain("_dispatch_once");
    expect(text).toMatch(/static NSMutableDictionary<NSString \*, id<MTLLibrary>> \*cached_libraries;/);
    expect(text).toMatch(/static NSMutableDictionary<NSString \*, CherenkovPipeline \*> \*cached_pipelines;/);
    expect(device).not.toContain("libraries"); // no per-device cache emptied at close
  });

  test("a misspelt Metal selector fails", async () => {
    const r = await checkEdited("commands.m", "[enc setBuffer:", "[enc setBufer:");
    expect(r.ok).toBe(false);
    expect(r.output).toMatch(/error: instance method 'setBufer:offset:atIndex:' not found/);
  });

  test("a macOS 15 API used without an availability check fails", async () => {
    const r = await checkEdited("device.m", /if \(@available\(macOS 15\.0, \*\)\) \{/g, "if (1) {");
    expect(r.ok).toBe(false);
    expect(r.output).toMatch(/'MTLResidencySetDescriptor' is only available on macOS 15\.0 or newer/);
  });

  test("an exported function cherenkov.h does not declare fails", async () => {
    const r = await checkEdited(
      "library.m",
      "CK_API void ck_library_release(",
      "CK_API int32_t ck_library_extra(void);\nCK_API int32_t ck_library_extra(void) { return 0; }\nCK_API void ck_library_release(",
    );
    expect(r.ok).toBe(false);
    expect(r.output).toMatch(/exports _ck_library_extra, which cherenkov\.h does not declare/);
  });

  test("a macOS 15 class imported strongly (built for 15, loaded on 14) fails", async () => {
    const r = await checkObjc([join(METAL_DIR, "device.m")], { ioSource: null, target: "arm64-apple-macos15.0", loadsOn: 14 });
    expect(r.ok).toBe(false);
    expect(r.output).toContain("_OBJC_CLASS_$_MTLResidencySetDescriptor is newer than macOS 14 but not weakly imported");
  });

  test("the objects export exactly cherenkov.h's functions and hide the rest", async () => {
    const clang = findClang();
    const object = join(scratch, "commands.o");
    const proc = Bun.spawnSync([clang, ...objcFlags(), "-O2", "-fvisibility=hidden", "-c", join(METAL_DIR, "commands.m"), "-o", object]);
    expect(proc.exitCode).toBe(0);
    const symbols = machOSymbols(readFileSync(object));
    const exported = symbols.filter((x) => x.exported).map((x) => x.name);
    expect(exported).toContain("_ck_encode_dispatch");
    expect(exported).toContain("_ck_event_wait");
    expect(exported.every((n) => n.startsWith("_ck_"))).toBe(true);
    // Internal helpers and the Objective-C classes are defined but hidden.
    expect(symbols.some((x) => x.name === "_ck_cmdbuf_finish" && x.defined && !x.exported)).toBe(true);
    expect(symbols.some((x) => x.name === "_OBJC_CLASS_$_CherenkovCmdbuf" && x.defined && !x.exported)).toBe(true);
  });

  test("a wrong argument type fails", async () => {
    const r = await checkEdited("commands.m", "[enc setBytes:params length:params_len atIndex:0]", "[enc setBytes:params length:@\"params\" atIndex:0]");
    expect(r.ok).toBe(false);
    expect(r.output).toMatch(/error: .*(incompatible pointer to integer|NSString)/);
  });
});

describe("(c) abi: the .m files implement cherenkov.h (text only: runs without clang)", () => {
  test("every CK_API function is defined once with the header's types", () => {
    const r = checkAbi();
    expect({ ok: r.ok, output: r.output }).toEqual({ ok: true, output: "" });
    const declared = apiSignatures(readFileSync(HEADER, "utf8"), false);
    expect(declared.length).toBeGreaterThanOrEqual(35);
    const dispatch = declared.find((d) => d.name === "ck_encode_dispatch")!;
    expect(dispatch.shape).toBe(
      "int32_t (ck_cmdbuf*, ck_pipeline*, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t, const ck_binding*, uint32_t, const void*, uint32_t)",
    );
  });

  test("a function the header gains but no .m defines fails, by name", () => {
    const header = join(scratch, "cherenkov-extra.h");
    writeFileSync(header, readFileSync(HEADER, "utf8").replace("#endif /* CHERENKOV_H */", "CK_API int32_t ck_buffer_set_resident(ck_buffer *buf, int32_t on);\n#endif"));
    const r = checkAbi(header);
    expect(r.ok).toBe(false);
    expect(r.output).toContain("ck_buffer_set_resident: declared in");
  });

  test("a definition whose parameter type differs fails", () => {
    const sources = metalSources().map((f) => {
      if (!f.endsWith("commands.m")) return f;
      const path = join(scratch, "commands-changed.m");
      writeFileSync(path, readFileSync(f, "utf8").replace("ck_event_set(ck_event *ev, double value)", "ck_event_set(ck_event *ev, uint32_t value)"));
      return path;
    });
    const r = checkAbi(HEADER, sources);
    expect(r.ok).toBe(false);
    expect(r.output).toMatch(/ck_event_set: .* defines 'int32_t \(ck_event\*, uint32_t\)', .* declares 'int32_t \(ck_event\*, double\)'/);
  });
});
