/**
 * Prints a CUDA per-kernel profile (the file CHERENKOV_CUDA_PROFILE=FILE writes, docs/cuda.md)
 * as a table: rows by total GPU time, with count and mean. Rows are kernel name + launch shape
 * (threadgroups x threads), "(wait)" the GPU idling on a host event, "(signal)" its signal.
 *
 *   bun spec/bench/profile.ts FILE [--top N]
 */
import { readFileSync } from "node:fs";

interface Profile {
  commandBuffers: number;
  commands: number;
  spanMs: number;
  kernels: { name: string; count: number; ms: number }[];
}

const [file, ...rest] = process.argv.slice(2);
if (!file) throw new Error("usage: bun spec/bench/profile.ts FILE [--top N]");
const top = rest[0] === "--top" ? Number(rest[1]) : 30;
const p = JSON.parse(readFileSync(file, "utf8")) as Profile;
const total = p.kernels.reduce((s, k) => s + k.ms, 0);
console.log(`${p.commandBuffers} command buffers, ${p.commands} commands, ${p.spanMs.toFixed(1)} ms from first to last command\n`);
console.log("| total ms | share | count | mean us | kernel, threadgroups x threads |");
console.log("| ---: | ---: | ---: | ---: | --- |");
for (const k of [...p.kernels].sort((a, b) => b.ms - a.ms).slice(0, top))
  console.log(`| ${k.ms.toFixed(1)} | ${((100 * k.ms) / total).toFixed(1)}% | ${k.count} | ${((1000 * k.ms) / k.count).toFixed(1)} | ${k.name} |`);
