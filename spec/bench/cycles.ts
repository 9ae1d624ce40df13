/**
 * `bun spec/bench/cycles.ts`: a fresh engine's speculative cycles one by one, to see what the
 * first ones cost (recording each accept count's cycle, building its CUDA graph) against the
 * steady state. Plain decoding runs first (`--plain N` tokens, as bench:decode does, so the
 * code both share is warm), then `--cycles N` cycles of `--drafts K` on a new sequence; each
 * cycle prints its index, tokens made, recordings made during it (its own and those prepared
 * ahead), wall ms and the engine's phases (encode, step, gpu, prepare; phases.ts). Starts with
 * the engine's load time, ends with the totals and the ratio to plain decoding. On CUDA,
 * CHERENKOV_CUDA_GRAPHS_VERBOSE=1 adds the graph counters and each graph's replay stages at the
 * end (docs/cuda.md).
 *
 * Options: --model DIR (default examples/models/qwen4-exp-tiny), --drafts K (2), --cycles N
 * (60), --plain N (64), --prompt N (16), --gap N (0: N plain steps before each cycle after the
 * first, so each is a transition into drafting, as drafts "auto" makes when it re-tries drafts;
 * their time is left out of the cycles'), --announce 0|1 (1: the prompt's forward says a cycle
 * follows, `nextDrafts`, so the first cycle is encoded while the prompt runs; 0 for A/B).
 */
import { join } from "node:path";
import { parseArgs } from "node:util";
import { Engine } from "../../lib/gpu/engine.ts";
import { openModel } from "../../lib/model/format.ts";
import { defaultBackend } from "../../lib/shim.ts";
import { median } from "./stats.ts";

const { values: opts } = parseArgs({
  options: {
    model: { type: "string", default: join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny") },
    drafts: { type: "string", default: "2" },
    cycles: { type: "string", default: "60" },
    plain: { type: "string", default: "64" },
    prompt: { type: "string", default: "16" },
    gap: { type: "string", default: "0" },
    announce: { type: "string", default: "1" },
  },
});
const count = (name: string, v: string, least: number) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < least) throw new Error(`--${name} ${v}: expected a whole number >= ${least}`);
  return n;
};
const drafts = count("drafts", opts.drafts, 1);
const cycles = count("cycles", opts.cycles, 1);
const plainTokens = count("plain", opts.plain, 1);
const promptLen = count("prompt", opts.prompt, 1);
const gap = count("gap", opts.gap, 0);
if (opts.announce !== "0" && opts.announce !== "1") throw new Error(`--announce ${opts.announce}: expected 0 or 1`);
const announce = opts.announce === "1";

const files = await openModel(opts.model);
const loadStart = performance.now();
const engine = await Engine.load(files, defaultBackend(), { prefillChunk: promptLen });
console.log(`load: ${(performance.now() - loadStart).toFixed(1)} ms (steps recorded at load: ${engine.recordedSteps.recorded})`);
try {
  if (engine.gpu.maxDrafts < drafts) throw new Error(`${opts.model}: ${drafts} drafts asked, the engine takes ${engine.gpu.maxDrafts} (no MTP head: 0)`);
  const vocab = files.config.vocab_size;
  const prompt = Array.from({ length: promptLen }, (_, i) => (37 * i + 11) % Math.min(vocab, 256));

  const plainSeq = engine.newSequence();
  let next = (await plainSeq.forward(prompt)).next.at(-1)!;
  const plainMs: number[] = [];
  for (let i = 0; i < plainTokens; i++) {
    const t0 = performance.now();
    next = (await plainSeq.forward([next])).next[0]!;
    plainMs.push(performance.now() - t0);
  }
  plainSeq.dispose();

  const spec = engine.newSequence();
  next = (await spec.forward(prompt, { nextDrafts: announce ? drafts : 0 })).next.at(-1)!;
  console.log("cycle\ttokens\trecorded\tms\tphases (ms)");
  let made = 0;
  let specMs = 0;
  for (let c = 0; c < cycles; c++) {
    if (c > 0) for (let i = 0; i < gap; i++) next = (await spec.forward([next])).next[0]!;
    engine.resetTimings();
    const recorded = engine.recordedSteps.recorded;
    const t0 = performance.now();
    const x = await spec.speculate(next, drafts);
    const ms = performance.now() - t0;
    specMs += ms;
    made += x.next.length;
    next = x.next.at(-1)!;
    const phases = (engine.stats() as { phases: Record<string, { totalMs: number }> }).phases;
    const shown = Object.entries(phases).map(([k, v]) => `${k} ${v.totalMs.toFixed(3)}`).join(", ");
    console.log(`${c}\t${x.next.length}\t${engine.recordedSteps.recorded - recorded}\t${ms.toFixed(3)}\t${shown}`);
  }
  spec.dispose();
  const plainTotal = plainMs.reduce((a, b) => a + b, 0);
  console.log(
    `plain: ${plainTokens} tokens in ${plainTotal.toFixed(1)} ms (the first three ${plainMs.slice(0, 3).map((x) => x.toFixed(2)).join(", ")} ms; median ${median(plainMs).toFixed(3)} ms)`,
  );
  console.log(
    `speculative, ${drafts} drafts: ${made} tokens in ${cycles} cycles, ${specMs.toFixed(1)} ms: ${(made / specMs / (plainTokens / plainTotal)).toFixed(2)}x plain; ` +
      `cycles ${JSON.stringify(engine.speculativeCycles)}`,
  );
} finally {
  await engine.close();
  files.close();
}
