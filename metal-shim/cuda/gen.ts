/**
 * The CUDA emitter of metal-shim/gen-bindings.ts: from the same parse of kernels/*.metal
 * (collectKernels), writes what nvcc compiles for the CUDA backend:
 *  - a copy of every kernels/ source rewritten for CUDA C++ (offsets of lines kept):
 *    `threadgroup` storage becomes `__shared__` (pointer and reference qualifiers are
 *    dropped), helper functions (`inline`, `static` member functions) become `__device__`,
 *    [[...]] attributes are blanked and explicit instantiations removed (the entry points
 *    instantiate what they call); `kernel` becomes `__device__`, `constant` `const`, and
 *    `device` and `thread` are dropped,
 *  - one .cu per .metal with an `extern "C" __global__` entry point per pipeline that
 *    computes the Metal builtins from blockIdx/threadIdx and calls the kernel, and the
 *    table of its kernels,
 *  - registry.cu listing every table.
 * No kernel is written twice: every body is the .metal source.
 */
import { existsSync, mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { basename, dirname, join, relative } from "node:path";

import { collectKernels, stripComments, type ParamBinding } from "../gen-bindings.ts";

/** Replaces [start, end) of `code` with spaces, newlines kept (offsets stay). */
function blank(text: string, start: number, end: number): string {
  return text.slice(0, start) + text.slice(start, end).replace(/[^\n]/g, " ") + text.slice(end);
}

/** Rewrites one kernels/ source for nvcc (see the file comment). */
export function rewriteForCuda(source: string): string {
  let out = source;
  let code = stripComments(source);
  const edits: [number, number, string][] = [];
  // Explicit instantiations `template [[host_name("x")]] kernel ... ;`: removed whole.
  for (const m of code.matchAll(/\btemplate\s*\[\[\s*host_name\s*\([^)]*\)\s*\]\]/g)) {
    const end = code.indexOf(";", m.index!);
    out = blank(out, m.index!, end + 1);
    code = blank(code, m.index!, end + 1);
  }
  // Remaining attributes ([[buffer(0)]], [[host_name(...)]] on plain kernels): blanked.
  for (const m of code.matchAll(/\[\[[^\]]*\]\]/g)) {
    out = blank(out, m.index!, m.index! + m[0].length);
    code = blank(code, m.index!, m.index! + m[0].length);
  }
  for (const m of code.matchAll(/\bthreadgroup\b/g)) {
    const end = m.index! + m[0].length;
    const rest = code.slice(end);
    const stop = rest.search(/[;,)=[{>]/);
    const declarator = stop < 0 ? rest : rest.slice(0, stop);
    edits.push([m.index!, end, /[*&]/.test(declarator) ? "" : "__shared__"]);
  }
  // Address spaces: nvcc's own macros spell `device` (__device__ is __location__(device)), so
  // the words are rewritten here rather than #defined in the prelude.
  for (const m of code.matchAll(/(?<!(?:\.|->)\s*)\b(device|constant|thread|kernel)\b/g)) {
    const word = m[1]!;
    edits.push([m.index!, m.index! + word.length, word === "constant" ? "const" : word === "kernel" ? "__device__" : ""]);
  }
  // Functions: `inline f(...)` and `static T f(...)` (struct members) run on the device.
  for (const m of code.matchAll(/\binline\b/g)) edits.push([m.index!, m.index!, "__device__ "]);
  for (const m of code.matchAll(/\bstatic\b(?=[^;={]*\()/g)) edits.push([m.index!, m.index!, "__device__ "]);
  edits.sort((a, b) => b[0] - a[0]);
  for (const [start, end, text] of edits) out = out.slice(0, start) + text + out.slice(end);
  return out;
}

function listSources(dir: string, exts: string[]): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const name of readdirSync(dir).sort()) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) out.push(...listSources(path, exts));
    else if (exts.some((e) => name.endsWith(e))) out.push(path);
  }
  return out;
}

function writeIfChanged(path: string, text: string): void {
  if (existsSync(path) && readFileSync(path, "utf8") === text) return;
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
}

const binder = (p: ParamBinding): string => (p.kind === "buffer" ? `ck::Buf<${p.index}>` : `ck::${p.attr}`);

/** Writes the CUDA sources into genDir; returns the .cu files to compile and the kernel count. */
export function generateCuda(root: string, genDir: string): { sources: string[]; kernels: number } {
  const kernelsDir = join(root, "kernels");
  const byFile = collectKernels(root, kernelsDir);
  for (const path of listSources(kernelsDir, [".metal", ".h"])) {
    const rel = relative(root, path);
    writeIfChanged(join(genDir, rel), `#line 1 "${rel}"\n` + rewriteForCuda(readFileSync(path, "utf8")));
  }
  const sources: string[] = [];
  const tables: string[] = [];
  let kernels = 0;
  for (const [path, entries] of byFile) {
    if (entries.length === 0) continue;
    const id = basename(path, ".metal").replace(/\W/g, "_");
    const rel = relative(root, path);
    const ns = `ckk_${id}`;
    const globals = entries.map((k) => {
      const binders = k.params.map(binder).join(", ");
      return [
        `extern "C" __global__ void __launch_bounds__(1024) ckg_${k.name}(const ck::Launch L) {`,
        `  ck::Builtins b;`,
        `  if (*L.cancel || !ck::setup(L, b)) return;`,
        `  ck::Invoke<&${ns}::${k.fn}>::run<${binders}>(L, b);`,
        `}`,
      ].join("\n");
    });
    const rows = entries.map(
      (k) =>
        `    ck::describe<${k.params.map(binder).join(", ")}>((decltype(${ns}::${k.fn})*)nullptr, ${JSON.stringify(k.name)}, ` +
        `${JSON.stringify(k.where)}, (const void*)&ckg_${k.name}),`,
    );
    const text = [
      `// Generated by metal-shim/cuda/gen.ts from ${rel}. Do not edit.`,
      `#include <metal_stdlib>`,
      `#include "bind.cuh"`,
      `using ckm::half;  // template arguments of instantiations (float4 and co. stay in ckm)`,
      `using ckm::bfloat;`,
      ``,
      `namespace ${ns} {`,
      `#include "ck/names.h"`,
      `#include "${rel}"`,
      `}  // namespace ${ns}`,
      ``,
      ...globals,
      ``,
      `extern const ck::KernelInfo ck_kernels_${id}[];`,
      `const ck::KernelInfo ck_kernels_${id}[] = {`,
      ...rows,
      `};`,
      `extern const uint32_t ck_kernels_${id}_count;`,
      `const uint32_t ck_kernels_${id}_count = ${entries.length};`,
      ``,
    ].join("\n");
    const out = join(genDir, `${id}.cu`);
    writeIfChanged(out, text);
    sources.push(out);
    tables.push(id);
    kernels += entries.length;
  }
  const registry = [
    `// Generated by metal-shim/cuda/gen.ts. Do not edit.`,
    `#include "abi.h"`,
    ``,
    ...tables.flatMap((id) => [`extern const ck::KernelInfo ck_kernels_${id}[];`, `extern const uint32_t ck_kernels_${id}_count;`]),
    ``,
    `namespace ck {`,
    `const KernelTable kAllTables[] = {`,
    ...(tables.length ? tables.map((id) => `    {ck_kernels_${id}, ck_kernels_${id}_count},`) : [`    {nullptr, 0},`]),
    `};`,
    `const uint32_t kAllTablesCount = ${tables.length};`,
    `}  // namespace ck`,
    ``,
  ].join("\n");
  const registryPath = join(genDir, "registry.cu");
  writeIfChanged(registryPath, registry);
  sources.push(registryPath);
  return { sources, kernels };
}

if (import.meta.main) {
  const root = join(import.meta.dir, "..", "..");
  const out = process.argv[2] ?? join(root, "metal-shim", "build", "gen-cuda");
  const r = generateCuda(root, out);
  console.log(`${r.kernels} kernels, ${r.sources.length} files in ${relative(root, out)}`);
}
