/**
 * The CUDA emitter of metal-shim/gen-bindings.ts: from the same parse of kernels/*.metal
 * (parseKernelTable), writes what nvcc compiles for the CUDA backend:
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
import { join, relative } from "node:path";

import { binderOf, emitTables, parseKernelTable, stripComments, writeKernelSources, type KernelEntry } from "../gen-bindings.ts";

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

/** Writes the CUDA sources into genDir; returns the .cu files to compile and the kernel count. */
export function generateCuda(root: string, genDir: string): { sources: string[]; kernels: number } {
  const table = parseKernelTable(root);
  writeKernelSources(table, genDir, rewriteForCuda);
  const binders = (k: KernelEntry): string => k.params.map(binderOf).join(", ");
  return emitTables(table, genDir, {
    generator: "metal-shim/cuda/gen.ts",
    ext: ".cu",
    prelude: [
      `#include <metal_stdlib>`,
      `#include "bind.cuh"`,
      `using ckm::half;  // template arguments of instantiations (float4 and co. stay in ckm)`,
      `using ckm::bfloat;`,
    ],
    inNamespace: [`#include "ck/names.h"`],
    after: (ns, entries) =>
      entries.map((k) =>
        [
          // The MSL bound, else the device maximum (64 registers a thread: hot kernels declare theirs).
          `extern "C" __global__ void __launch_bounds__(${k.maxThreads ?? 1024}) ckg_${k.name}(const ck::Launch L) {`,
          // A kernel that calls ck_inputs_ready() (kernels/grid.h) waits there, after its
          // prefetches; it waits here too when it must read the cancel word (a previous command's write).
          k.waitsForInputs ? `  if (L.cancel != nullptr) ck::after_previous_grid();` : `  ck::after_previous_grid();`,
          `  ck::Builtins b;`,
          `  if ((L.cancel != nullptr && *L.cancel) || !ck::setup(L, b)) return;`,
          `  ck::Invoke<&${ns}::${k.fn}>::run<${binders(k)}>(L, b);`,
          // Only in a profiling build (CHERENKOV_CUDA_STAMPS_BUILD=1): the call costs registers.
          `#ifdef CK_STAMPS`,
          `  ck::stamp_end(L.stamp);`,
          `#endif`,
          `}`,
        ].join("\n"),
      ),
    row: (ns, k) =>
      `    ck::describe<${binders(k)}>((decltype(${ns}::${k.fn})*)nullptr, ${JSON.stringify(k.name)}, ` +
      `${JSON.stringify(k.where)}, (const void*)&ckg_${k.name}),`,
  });
}

if (import.meta.main) {
  const root = join(import.meta.dir, "..", "..");
  const out = process.argv[2] ?? join(root, "metal-shim", "build", "gen-cuda");
  const r = generateCuda(root, out);
  console.log(`${r.kernels} kernels, ${r.sources.length} files in ${relative(root, out)}`);
}
