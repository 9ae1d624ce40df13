// metal-shim/gen-bindings.ts: signature parsing and the threadgroup rewrite that
// let the CPU backend compile kernels/*.metal as C++.
import { describe, expect, test } from "bun:test";

import { readFileSync } from "node:fs";
import { join } from "node:path";

import { blankHostNames, cppSource, findKernels, parseKernelTable, rewriteThreadgroup, stripComments } from "../../metal-shim/gen-bindings.ts";

describe("rewriteThreadgroup", () => {
  test.each([
    ["threadgroup float partial[32];", "static thread_local float partial[32];"],
    ["threadgroup atomic_uint n;", "static thread_local atomic_uint n;"],
    ["threadgroup float* p = partial + 1;", " float* p = partial + 1;"],
    ["threadgroup const half& r = x;", " const half& r = x;"],
    ["void f(threadgroup float* buf, int n);", "void f( float* buf, int n);"],
    ["auto q = (threadgroup float*)p;", "auto q = ( float*)p;"],
    ["threadgroup_barrier(mem_flags::mem_threadgroup);", "threadgroup_barrier(mem_flags::mem_threadgroup);"],
    ["/* threadgroup memory */ float a;", "/* threadgroup memory */ float a;"],
  ])("%s", (source, expected) => {
    expect(rewriteThreadgroup(source)).toBe(expected);
  });
});

test("stripComments keeps offsets and strings", () => {
  const src = 'a /* x\ny */ b // z\n"//not" c';
  const out = stripComments(src);
  expect(out.length).toBe(src.length);
  expect(out.split("\n").length).toBe(3);
  expect(out).toContain('"//not" c');
  expect(out).not.toContain("z");
});

describe("findKernels", () => {
  test("plain, template and instantiated kernels", () => {
    const src = `
kernel void plain(device float* x [[buffer(1)]], uint i [[thread_position_in_grid]]) { x[i] = 0; }
template <typename T>
kernel void tmpl(constant P& p [[buffer(0)]], device T* y [[ buffer(2) ]]) {}
template [[host_name("tmpl_f32")]] kernel decltype(tmpl<float>) tmpl<float>;
template [[host_name("tmpl_f16")]] kernel void tmpl<half>(constant P& p [[buffer(0)]], device half* y [[buffer(2)]]);
[[host_name("renamed")]] kernel void original(device int* z [[buffer(3)]]) {}
`;
    const found = findKernels(src, "k.metal");
    expect(found.map((f) => [f.kind, f.name, f.templateArgs, f.hostName, f.line])).toEqual([
      ["definition", "plain", null, null, 2],
      ["template", "tmpl", null, null, 4],
      ["instantiation", "tmpl", "<float>", "tmpl_f32", 5],
      ["instantiation", "tmpl", "<half>", "tmpl_f16", 6],
      ["definition", "original", null, "renamed", 7],
    ]);
    expect(found[0]!.params).toEqual(["device float* x [[buffer(1)]]", "uint i [[thread_position_in_grid]]"]);
    expect(found[2]!.params).toBeNull();
  });

  test("[[max_total_threads_per_threadgroup(N)]] is read before `kernel` (instantiations take their template's in collectKernels: spec/native/cuda.test.ts)", () => {
    const src = `
[[max_total_threads_per_threadgroup(128)]] kernel void bounded(device float* x [[buffer(1)]]) {}
kernel void free(device float* x [[buffer(1)]]) {}
template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void tmpl(device T* y [[buffer(2)]]) {}
template [[host_name("tmpl_f32")]] kernel decltype(tmpl<float>) tmpl<float>;
`;
    expect(findKernels(src, "k.metal").map((f) => [f.name, f.maxThreads])).toEqual([
      ["bounded", 128],
      ["free", null],
      ["tmpl", 256],
      ["tmpl", null],
    ]);
  });

  test("a kernel whose body calls ck_inputs_ready() waits for its inputs itself; an instantiation takes its template's", () => {
    const src = `
inline void helper() { ck_inputs_ready(); }
kernel void waits(device float* x [[buffer(1)]]) { prefetch(); ck_inputs_ready (); x[0] = 1; }
kernel void through_helper(device float* x [[buffer(1)]]) { helper(); }
// ck_inputs_ready() in a comment
kernel void plain(device float* x [[buffer(1)]]) { x[0] = 2; }
template <typename T>
kernel void tmpl(device T* y [[buffer(2)]]) { ck_inputs_ready(); }
template [[host_name("tmpl_f32")]] kernel decltype(tmpl<float>) tmpl<float>;
`;
    expect(findKernels(src, "k.metal").map((f) => [f.name, f.waitsForInputs])).toEqual([
      ["waits", true],
      ["through_helper", false], // only the kernel's own body counts: the entry then waits first (harmless)
      ["plain", false],
      ["tmpl", true],
      ["tmpl", false],
    ]);
  });

  test("a field named kernel (p.kernel, p->kernel) is not a declaration", () => {
    const src = `kernel void k(constant P& p [[buffer(0)]], device float* y [[buffer(1)]]) { y[0] = p.kernel + q->kernel; }`;
    expect(findKernels(src, "k.metal").map((f) => f.name)).toEqual(["k"]);
  });

  test.each([
    ["[[kernel]] void k() {}", /k.metal:1: write `kernel void name\(...\)`, not \[\[kernel\]\]/],
    ['template kernel void t<float>(device float* x [[buffer(1)]]);', /k.metal:1: explicit instantiation of t needs \[\[host_name/],
    ["kernel void k(device float* x [[buffer(1)]]", /unbalanced \(\.\.\.\) in kernel k/],
    ["[[max_total_threads_per_threadgroup(MV_SG * 32)]] kernel void k() {}", /k.metal:1: \[\[max_total_threads_per_threadgroup\(MV_SG \* 32\)\]\]: write a literal thread count/],
    ["[[max_total_threads_per_threadgroup(100)]] kernel void k() {}", /must be a multiple of 32, at most 1024/],
  ])("rejects %s", (src, message) => {
    expect(() => findKernels(src, "k.metal")).toThrow(message);
  });
});

describe("cppSource: kernels/ as C++ every compiler accepts", () => {
  // clang rejects an attribute list after `template` ("an attribute list cannot appear
  // here"); g++ ignored it, so the CPU backend built with g++ only.
  test("blanks [[host_name]] on explicit instantiations, keeping columns", () => {
    const src = 'template [[host_name("ew_add_f32")]] kernel decltype(ew<EW_ADD>) ew<EW_ADD>;';
    const out = blankHostNames(src);
    expect(out.length).toBe(src.length);
    expect(out).not.toContain("host_name");
    expect(out).toMatch(/^template\s+kernel decltype\(ew<EW_ADD>\) ew<EW_ADD>;$/);
    expect(out.indexOf("kernel")).toBe(src.indexOf("kernel"));
  });

  test("also inside a macro, and leaves comments and strings alone", () => {
    const src = '#define I(T) template [[ host_name( "m_" #T ) ]] kernel decltype(m<T>) m<T>;\n// [[host_name("x")]]\nconst char* s = "[[host_name(\\"y\\")]]";';
    const out = cppSource(src);
    expect(out.split("\n")[0]).not.toContain("host_name");
    expect(out.split("\n")[1]).toBe('// [[host_name("x")]]');
    expect(out.split("\n")[2]).toContain("host_name");
  });

  test("the real kernels keep no [[host_name]] after the rewrite", () => {
    const table = parseKernelTable(join(import.meta.dir, "..", ".."));
    for (const path of table.sources) {
      const code = stripComments(cppSource(readFileSync(path, "utf8")));
      expect({ path, hostName: /host_name/.test(code) }).toEqual({ path, hostName: false });
    }
  });
});

test("parseKernelTable: every pipeline once, per file, with its bindings (what each backend emits from)", () => {
  const table = parseKernelTable(join(import.meta.dir, "..", ".."));
  const names = table.files.flatMap((f) => f.entries.map((k) => k.name));
  expect(new Set(names).size).toBe(names.length);
  expect(names).toEqual(expect.arrayContaining(["ew_add_f32", "matvec_q4_f32", "attn_rows_q8"]));
  const ew = table.files.find((f) => f.rel === "kernels/elementwise.metal")!;
  expect(ew.id).toBe("elementwise");
  const add = ew.entries.find((k) => k.name === "ew_add_f32")!;
  expect(add.fn).toBe("ew<EW_ADD>");
  expect(add.params[0]).toEqual({ kind: "buffer", index: 0 });
  expect(add.where).toMatch(/^kernels\/elementwise\.metal:\d+$/);
});
