// Shared by the engine-step tests: greedy generation straight on a Backend (so the margins
// of every step come back too), golden records, engine option sets, and dispatch counting.
import { afterAll, beforeAll } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Backend } from "../../lib/api/backend.ts";
import { EngineBackend, type EngineOptions } from "../../lib/api/engine-backend.ts";
import type { Engine, EngineSequence } from "../../lib/gpu/engine.ts";
import { StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { Tape } from "../../lib/gpu/tape.ts";
import { openModel, type ModelFiles } from "../../lib/model/format.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { CommandBuffer, type Pipeline } from "../../lib/shim.ts";
import { goldenPath, type GoldenRecord } from "../golden/golden.ts";
import { BACKEND } from "../selected-backend.ts";

export interface Greedy {
  tokens: number[];
  margins: number[];
}

/** Plain greedy decoding of `maxTokens` tokens after `prompt` on a backend sequence. */
export async function greedy(backend: Backend, prompt: number[], maxTokens: number): Promise<Greedy> {
  const seq = backend.newSequence();
  try {
    const first = await seq.forward(prompt);
    const tokens = [first.next[first.next.length - 1]!];
    const margins = [first.margins[first.margins.length - 1]!];
    while (tokens.length < maxTokens) {
      const r = await seq.forward([tokens[tokens.length - 1]!]);
      tokens.push(r.next[0]!);
      margins.push(r.margins[0]!);
    }
    return { tokens, margins };
  } finally {
    seq.dispose();
  }
}

/** Opens `dir` on the engine, on the selected backend (spec/selected-backend.ts). */
export async function openEngine(dir: string, opts: EngineOptions = {}): Promise<EngineBackend> {
  return EngineBackend.open(await openModel(dir), BACKEND, opts);
}

export async function goldenRecord(name: string): Promise<GoldenRecord> {
  return (await Bun.file(goldenPath(name)).json()) as GoldenRecord;
}

/** Largest |engine margin - reference margin| over the steps (a lower bound of the logit error). */
export function marginError(got: number[], want: number[]): number {
  let worst = 0;
  for (let i = 0; i < Math.min(got.length, want.length); i++) worst = Math.max(worst, Math.abs(got[i]! - want[i]!));
  return worst;
}

/** A temporary directory removed by the returned function. */
export function tempDir(tag: string): { dir: string; remove(): void } {
  const dir = mkdtempSync(join(tmpdir(), `cherenkov-${tag}-`));
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** How many dispatches of each kernel `body` encodes (directly or onto a recorded step's tape). */
export async function countDispatches(body: () => Promise<void>): Promise<Map<string, number>> {
  const seen = new Map<string, number>();
  const see = (pipeline: Pipeline | string) => {
    const name = typeof pipeline === "string" ? pipeline : pipeline.name;
    seen.set(name, (seen.get(name) ?? 0) + 1);
  };
  const { dispatch } = CommandBuffer.prototype;
  const tapeDispatch = Tape.prototype.dispatch;
  CommandBuffer.prototype.dispatch = function (this: CommandBuffer, pipeline, ...rest) {
    see(pipeline);
    return dispatch.call(this, pipeline, ...rest);
  };
  Tape.prototype.dispatch = function (this: Tape, pipeline, ...rest) {
    see(pipeline);
    return tapeDispatch.call(this, pipeline, ...rest);
  };
  try {
    await body();
  } finally {
    CommandBuffer.prototype.dispatch = dispatch;
    Tape.prototype.dispatch = tapeDispatch;
  }
  return seen;
}

/**
 * How far a traced router weight may lie from the reference's. A prompt of 16+ rows takes the
 * tiled GEMM, whose split bf16 operands are good to about 2^-16 of |w x| (docs/model.md R7: it
 * moves golden logit margins by up to 7.9e-4), and a GPU sums every layer in other orders than
 * the reference: on the H200 the golden model's traced weights moved by up to 2.6e-4 (the tiny
 * model's: 7.7e-6). The expert ids beside the weights are compared exactly.
 */
export const ROUTER_WEIGHT_TOLERANCE = 1e-3;

/** The largest |a - b| over two traces' router weights ([layer][row][k]). */
export function maxWeightError(a: number[][][], b: number[][][]): number {
  let max = 0;
  a.forEach((rows, l) => rows.forEach((ws, r) => ws.forEach((w, k) => (max = Math.max(max, Math.abs(w - b[l]![r]![k]!))))));
  return max;
}

/** Greedy decoding on `seq` to maxTokens tokens: the tokens, the prompt step's dispatches and the decode steps' (countDispatches). */
export async function decodeCountingDispatches(seq: EngineSequence, promptTokens: number[], maxTokens: number) {
  let first: Awaited<ReturnType<typeof seq.forward>> | undefined;
  const prompt = await countDispatches(async () => {
    first = await seq.forward(promptTokens);
  });
  const tokens = [first!.next[first!.next.length - 1]!];
  const seen = await countDispatches(async () => {
    while (tokens.length < maxTokens) tokens.push((await seq.forward([tokens[tokens.length - 1]!])).next[0]!);
  });
  return { tokens, prompt, seen };
}

/**
 * On `engine`: plain greedy decoding of n tokens after `prompt`, then speculative decoding with
 * `drafts` a cycle to n tokens, with each cycle's accepted drafts and dispatches (countDispatches).
 */
export async function greedyThenSpeculative(engine: Engine, prompt: number[], n: number, drafts: number) {
  const g = engine.newSequence();
  const greedy = [(await g.forward(prompt)).next.at(-1)!];
  while (greedy.length < n) greedy.push((await g.forward([greedy.at(-1)!])).next[0]!);
  g.dispose();
  const seq = engine.newSequence();
  const tokens = [(await seq.forward(prompt)).next.at(-1)!];
  const accepts: number[] = [];
  const cycles: Map<string, number>[] = [];
  while (tokens.length < n) {
    let next: number[] = [];
    cycles.push(await countDispatches(async () => void (next = (await seq.speculate(tokens.at(-1)!, drafts)).next)));
    accepts.push(next.length - 1);
    tokens.push(...next);
  }
  seq.dispose();
  return { greedy, tokens: tokens.slice(0, n), accepts, cycles };
}

/** The shipped tiny model's directory (it has an MTP head). */
export const TINY_DIR = join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny");

/** The tiny model's files and the prompt the speculative tests decode after (close the files). */
export async function openTinyForDrafts(): Promise<{ files: ModelFiles; prompt: number[] }> {
  const prompt = (await loadTokenizer(TINY_DIR)).encode("The cat sat on the mat. The dog sat on the");
  return { files: await openModel(TINY_DIR), prompt };
}

/**
 * A test file's tiny model for speculative runs: opens its files and prompt before the tests,
 * and after them closes the files and puts back the recording switches and `env` (which the
 * tests may set).
 */
export function tinyDraftsFixture(env: readonly string[]): { files(): ModelFiles; prompt(): number[] } {
  const saved = { env: Object.fromEntries(env.map((k) => [k, process.env[k]])), recorded: StepRecordings.enabled, check: StepRecordings.check };
  let opened: { files: ModelFiles; prompt: number[] } | undefined;
  beforeAll(async () => {
    opened = await openTinyForDrafts();
  });
  afterAll(() => {
    opened?.files.close();
    StepRecordings.enabled = saved.recorded;
    StepRecordings.check = saved.check;
    for (const k of env) {
      if (saved.env[k] === undefined) delete process.env[k];
      else process.env[k] = saved.env[k];
    }
  });
  return { files: () => opened!.files, prompt: () => opened!.prompt };
}
