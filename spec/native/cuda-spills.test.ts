// Every generated CUDA kernel compiles without register spills on the H200's architecture:
// ptxas (nvcc -Xptxas -v, sm_90, the build's flags) reports 0 bytes of spill stores and loads
// for each entry point. A spill is local-memory traffic inside a kernel's hot loop: on the
// H200 it made the q4 kernels 5-8x slower (docs/performance.md). Needs nvcc, not a GPU; it
// compiles device code only (-cubin), two files at a time.
import { expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";

import { cudaCompileFlags, cudaIncludes, findNvcc } from "../../metal-shim/cuda/build.ts";
import { generateCuda } from "../../metal-shim/cuda/gen.ts";

const ROOT = join(import.meta.dir, "..", "..");
const nvcc = findNvcc();
if (!nvcc) console.warn("CUDA spill check: skipped, nvcc not found (install the CUDA toolkit to run it)");

/** Per entry point: [kernel, spill store bytes, spill load bytes, stack frame bytes], from ptxas -v output. */
export function parsePtxasReport(text: string): { kernel: string; spillStores: number; spillLoads: number; stack: number }[] {
  const out: { kernel: string; spillStores: number; spillLoads: number; stack: number }[] = [];
  let current: string | null = null;
  for (const line of text.split("\n")) {
    const entry = /Compiling entry function '(\w+)'/.exec(line);
    if (entry) current = entry[1]!;
    const spill = /(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads/.exec(line);
    if (spill && current) {
      out.push({ kernel: current.replace(/^ckg_/, ""), stack: Number(spill[1]), spillStores: Number(spill[2]), spillLoads: Number(spill[3]) });
      current = null;
    }
  }
  return out;
}

test("parsePtxasReport reads ptxas -v lines", () => {
  const text = [
    "ptxas info    : Compiling entry function 'ckg_matvec_q4_f32' for 'sm_90'",
    "ptxas info    : Function properties for ckg_matvec_q4_f32",
    "    448 bytes stack frame, 864 bytes spill stores, 1788 bytes spill loads",
    "ptxas info    : Used 32 registers",
  ].join("\n");
  expect(parsePtxasReport(text)).toEqual([{ kernel: "matvec_q4_f32", stack: 448, spillStores: 864, spillLoads: 1788 }]);
});

test.skipIf(!nvcc)(
  "ptxas: 0 spill bytes in every generated kernel (sm_90)",
  async () => {
    const dir = mkdtempSync(join(tmpdir(), "cherenkov-ptxas-"));
    try {
      const gen = generateCuda(ROOT, join(dir, "gen"));
      const sources = gen.sources.filter((s) => basename(s) !== "registry.cu");
      const include = cudaIncludes(join(dir, "gen"));
      const reports: string[] = [];
      let next = 0;
      const worker = async () => {
        while (next < sources.length) {
          const src = sources[next++]!;
          const cmd = [nvcc!, ...cudaCompileFlags(), "-Xptxas", "-v", ...include, "-cubin", src, "-o", join(dir, `${basename(src, ".cu")}.cubin`)];
          const p = Bun.spawn(cmd, { stdout: "pipe", stderr: "pipe" });
          const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
          if (code !== 0) throw new Error(`nvcc ${basename(src)} failed (exit ${code}):\n${err}`);
          reports.push(out + err);
        }
      };
      await Promise.all([worker(), worker()]);
      const rows = parsePtxasReport(reports.join("\n"));
      expect(rows.length).toBe(gen.kernels);
      const spilling = rows.filter((r) => r.spillStores > 0 || r.spillLoads > 0).map((r) => `${r.kernel}: ${r.spillStores} B stores, ${r.spillLoads} B loads`);
      expect(spilling).toEqual([]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
  600_000,
);
