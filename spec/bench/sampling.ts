/**
 * `bun run bench:sampling`: what sampling costs per token against greedy, on the selected
 * backend (the CPU backend off macOS).
 *
 *   bun spec/bench/sampling.ts [--json] [--iters N] [--tokens N] [--vocab 4096,151936] [--kernels-only]
 *
 * 1. Kernels: one row of logits through argmax_f32 (greedy) and through sample_f32 with
 *    temperature only, with top-k 40 + top-p 0.95 + min-p 0.05 (the bisections), and with
 *    penalties + 5 logprobs, at each vocabulary size; fastest and median of `iters` runs of
 *    a command buffer holding 8 copies.
 *    For comparison, the host path the kernel avoids: the reference sampler (lib/reference,
 *    plain TypeScript) over the same row already in host memory.
 * 2. Decode: examples/models/qwen4-exp-tiny on the engine, the median time between streamed
 *    tokens (after the first two), median over `iters` interleaved generations. The sampled
 *    cases that use top-k 1 draw exactly greedy's tokens through the whole sampling kernel, so
 *    the experts they route to (and the pool's misses) are greedy's too: the difference is
 *    the sampling path's cost. Free sampling routes elsewhere, so it is shown apart.
 */
import { parseArgs } from "node:util";
import { join } from "node:path";
import { Model, type GenerateOptions } from "../../lib/api/model.ts";
import { encodeArgmax, encodeSample, SamplingScratch, type SampleArgs } from "../../lib/gpu/sampling.ts";
import { runNow } from "../../lib/gpu/dispatch.ts";
import { Rng } from "../../lib/model/rng.ts";
import { PenaltyCounts, sampleToken, samplingParams, tokenLogprobs } from "../../lib/reference/sampling.ts";
import { Device } from "../../lib/shim.ts";

const { values: args } = parseArgs({
  options: {
    json: { type: "boolean", default: false },
    iters: { type: "string", default: "7" },
    tokens: { type: "string", default: "24" },
    vocab: { type: "string", default: "4096,151936" },
    "kernels-only": { type: "boolean", default: false },
  },
});
const iters = Number(args.iters);
const tokens = Number(args.tokens);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

const SETTINGS: [string, GenerateOptions][] = [
  ["temperature 0.8", { temperature: 0.8 }],
  ["T 0.8, top-k 40, top-p 0.95, min-p 0.05", { temperature: 0.8, topK: 40, topP: 0.95, minP: 0.05 }],
  ["T 0.8, penalties, 5 logprobs", { temperature: 0.8, repetitionPenalty: 1.1, presencePenalty: 0.3, frequencyPenalty: 0.1, logprobs: true, topLogprobs: 5 }],
];

interface KernelRow {
  vocab: number;
  case: string;
  fastestMs: number;
  medianMs: number;
}

function benchKernels(dev: Device): KernelRow[] {
  const out: KernelRow[] = [];
  const COPIES = 8;
  for (const vocab of args.vocab.split(",").map(Number)) {
    const r = new Rng(vocab, "bench-logits");
    const logits = dev.buffer(vocab * 4);
    for (let i = 0; i < vocab; i++) logits.f32[i] = r.normal() * 3;
    const ids = dev.buffer(16);
    const margin = dev.buffer(16);
    const counts = dev.buffer(2 * vocab * 4);
    for (let i = 0; i < 200; i++) counts.i32[r.int(vocab)]!++;
    const scratch = new SamplingScratch(dev, vocab, 1, 1);
    const x = { buffer: logits, offset: 0, stride: vocab * 4 };
    const time = (name: string, encode: (ctx: Parameters<Parameters<typeof runNow>[1]>[0], copy: number) => void) => {
      const runs: number[] = [];
      for (let it = 0; it <= iters; it++) {
        const t0 = performance.now();
        runNow(dev, (ctx) => {
          for (let c = 0; c < COPIES; c++) encode(ctx, it * COPIES + c);
        });
        if (it > 0) runs.push((performance.now() - t0) / COPIES); // the first run warms up
      }
      out.push({ vocab, case: name, fastestMs: Math.min(...runs), medianMs: median(runs) });
    };
    time("argmax_f32 (greedy)", (ctx) => encodeArgmax(ctx, x, ids, margin, 1, vocab));
    for (const [name, o] of SETTINGS) {
      const params = samplingParams(o);
      time(`sample_f32, ${name}`, (ctx, copy) => {
        const a: SampleArgs = {
          params, seed: 1, rows: 1, position: copy, draw: 0, counts: o.repetitionPenalty ? counts : null, extras: null, extrasBase: 0,
          verify: null, qRow: null, topLogprobs: o.logprobs ? (o.topLogprobs ?? 0) : null,
        };
        encodeSample(ctx, x, scratch, a);
      });
    }
    const z = logits.f32.slice(0, vocab);
    const hostCounts = new PenaltyCounts(vocab, counts.i32.slice(0, 2 * vocab));
    for (const [name, o] of SETTINGS) {
      const params = samplingParams(o);
      const runs: number[] = [];
      for (let it = 0; it <= Math.min(iters, 3); it++) {
        const t0 = performance.now();
        const id = sampleToken(z, { params, seed: 1, position: it, counts: o.repetitionPenalty ? hostCounts : null });
        if (o.logprobs) tokenLogprobs(z, id, o.topLogprobs ?? 0);
        if (it > 0) runs.push(performance.now() - t0);
      }
      out.push({ vocab, case: `host reference sampler, ${name}`, fastestMs: Math.min(...runs), medianMs: median(runs) });
    }
    scratch.release();
    for (const b of [logits, ids, margin, counts]) b.release();
  }
  return out;
}

interface DecodeRow {
  case: string;
  msPerToken: number;
  runs: number[];
}

async function benchDecode(): Promise<DecodeRow[]> {
  const dir = join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny");
  const model = await Model.load(dir, { backend: "cpu" });
  const prompt = "The cat sat on the mat. The dog";
  const cases: [string, GenerateOptions][] = [
    ["greedy", {}],
    ["T 0.8, top-k 1 (greedy's tokens)", { temperature: 0.8, topK: 1 }],
    ["T 0.8, top-k 1, top-p 0.95, min-p 0.05, 5 logprobs (greedy's tokens)", { temperature: 0.8, topK: 1, topP: 0.95, minP: 0.05, logprobs: true, topLogprobs: 5 }],
    ...SETTINGS.map(([n, o]): [string, GenerateOptions] => [`${n} (other tokens, other experts)`, o]),
  ];
  const runs = cases.map(() => [] as number[]);
  try {
    for (let it = 0; it <= iters; it++) {
      for (let c = 0; c < cases.length; c++) {
        const times: number[] = [];
        for await (const _ of model.stream(prompt, { maxTokens: tokens, stopAtEos: false, seed: it, ...cases[c]![1] })) times.push(performance.now());
        const gaps = times.slice(2).map((t, i) => t - times[i + 1]!);
        if (it > 0) runs[c]!.push(median(gaps));
      }
    }
  } finally {
    await model.close();
  }
  return cases.map(([name], c) => ({ case: name, msPerToken: median(runs[c]!), runs: runs[c]! }));
}

const dev = Device.open();
const kernels = benchKernels(dev);
dev.close();
const decode = args["kernels-only"] ? [] : await benchDecode();
if (args.json) console.log(JSON.stringify({ backend: process.env.CHERENKOV_BACKEND ?? "default", kernels, decode }, null, 2));
else {
  console.log(`kernels (one row, ms per dispatch: fastest / median of ${iters})`);
  for (const k of kernels) console.log(`  vocab ${String(k.vocab).padStart(6)}  ${k.case.padEnd(68)} ${k.fastestMs.toFixed(3)} / ${k.medianMs.toFixed(3)}`);
  if (decode.length) console.log(`decode, examples/models/qwen4-exp-tiny, ${tokens} tokens (ms per token, median of ${iters})`);
  for (const d of decode) console.log(`  ${d.case.padEnd(76)} ${d.msPerToken.toFixed(2)}`);
}
