// metal-shim/gen-bindings.ts: signature parsing and the threadgroup rewrite that
// let the CPU backend compile kernels/*.metal as C++.
import { describe, expect, test } from "bun:test";

import { findKernels, rewriteThreadgroup, stripComments } from "../../metal-shim/gen-bindings.ts";

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

  test("a field named kernel (p.kernel, p->kernel) is not a declaration", () => {
    const src = `kernel void k(constant P& p [[buffer(0)]], device float* y [[buffer(1)]]) { y[0] = p.kernel + q->kernel; }`;
    expect(findKernels(src, "k.metal").map((f) => f.name)).toEqual(["k"]);
  });

  test.each([
    ["[[kernel]] void k() {}", /k.metal:1: write `kernel void name\(...\)`, not \[\[kernel\]\]/],
    ['template kernel void t<float>(device float* x [[buffer(1)]]);', /k.metal:1: explicit instantiation of t needs \[\[host_name/],
    ["kernel void k(device float* x [[buffer(1)]]", /unbalanced \(\.\.\.\) in kernel k/],
  ])("rejects %s", (src, message) => {
    expect(() => findKernels(src, "k.metal")).toThrow(message);
  });
});
