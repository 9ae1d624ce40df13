/**
 * Prints a CUDA profile (docs/cuda.md "Kernel speed"):
 *  - the per-command file CHERENKOV_CUDA_PROFILE=FILE writes, as a table of rows by total GPU
 *    time with count and mean. Rows are kernel name + launch shape (threadgroups x threads),
 *    "(wait)" the GPU idling on a host event, "(signal)" its signal. Each command is timed
 *    alone (no graphs, no programmatic launch): a chain of short kernels comes out inflated.
 *  - the stamps file CHERENKOV_CUDA_STAMPS=FILE writes (a library built with
 *    CHERENKOV_CUDA_STAMPS_BUILD=1; metal-shim/cuda/profile.h "Stamps"): per command-buffer
 *    structure replayed from a CUDA graph, each node's mean share of the chain (its end minus
 *    the previous node's end), summed by kernel, and the host's times around it.
 *
 *   bun spec/bench/profile.ts FILE [--top N] [--nodes]   (--nodes: every node of each structure in order)
 */
import { readFileSync } from "node:fs";

interface Profile {
  commandBuffers: number;
  commands: number;
  spanMs: number;
  kernels: { name: string; count: number; ms: number }[];
}

interface Timeline {
  replays: number;
  spanUs: number;
  /** Host times (absent in files from before they were recorded). */
  submitUs?: number;
  launchUs?: number;
  doneUs?: number;
  turnUs?: number;
  nodes: { name: string; us: number }[];
}

const [file, ...rest] = process.argv.slice(2);
if (!file) throw new Error("usage: bun spec/bench/profile.ts FILE [--top N] [--nodes]");
const topAt = rest.indexOf("--top");
const top = topAt >= 0 ? Number(rest[topAt + 1]) : 30;
const data = JSON.parse(readFileSync(file, "utf8")) as Profile | { timelines: Timeline[] };

if ("timelines" in data) printStamps(data.timelines);
else printProfile(data);

function printProfile(p: Profile): void {
  const total = p.kernels.reduce((s, k) => s + k.ms, 0);
  console.log(`${p.commandBuffers} command buffers, ${p.commands} commands, ${p.spanMs.toFixed(1)} ms from first to last command\n`);
  console.log("| total ms | share | count | mean us | kernel, threadgroups x threads |");
  console.log("| ---: | ---: | ---: | ---: | --- |");
  for (const k of [...p.kernels].sort((a, b) => b.ms - a.ms).slice(0, top))
    console.log(`| ${k.ms.toFixed(1)} | ${((100 * k.ms) / total).toFixed(1)}% | ${k.count} | ${((1000 * k.ms) / k.count).toFixed(1)} | ${k.name} |`);
}

function printStamps(timelines: Timeline[]): void {
  const us = (v: number | undefined) => (v === undefined ? "-" : v.toFixed(1));
  for (const t of [...timelines].sort((a, b) => b.replays - a.replays).slice(0, top)) {
    console.log(
      `\n${t.nodes.length} nodes, ${t.replays} replays: chain ${t.spanUs.toFixed(1)} us (first node's end to last's); ` +
        `host: commit -> launched ${us(t.submitUs)}, -> first node's end ${us(t.launchUs)}, last node's end -> seen done ${us(t.doneUs)}, turn before it ${us(t.turnUs)} us`,
    );
    const byKernel = new Map<string, { n: number; us: number }>();
    for (const n of t.nodes) {
      const k = byKernel.get(n.name) ?? { n: 0, us: 0 };
      k.n++;
      k.us += n.us;
      byKernel.set(n.name, k);
    }
    console.log("| us | share | nodes | mean us | kernel |");
    console.log("| ---: | ---: | ---: | ---: | --- |");
    for (const [name, k] of [...byKernel].sort((a, b) => b[1].us - a[1].us))
      console.log(`| ${k.us.toFixed(1)} | ${((100 * k.us) / t.spanUs).toFixed(1)}% | ${k.n} | ${(k.us / k.n).toFixed(2)} | ${name} |`);
    if (rest.includes("--nodes")) t.nodes.forEach((n, i) => console.log(`${String(i).padStart(4)} ${n.us.toFixed(2).padStart(7)} ${n.name}`));
  }
}
