// The speculative cycle (docs/engine.md "The speculative cycle"): a cycle is one command
// buffer (the last cycle's pending rollback, the MTP drafts copied into the token buffer on the
// GPU, the verify batch), recorded once per (rollback row, catch-up rows, drafts), prepared
// while the cycle before it runs and replayed; every replay here is compared word for word with
// a fresh encode (StepRecordings.check). The tokens are greedy's token for token (also over a
// streamed pool, with handshakes, and a catch-up in chunks), sampled drafts draw what a direct
// encode draws, and a pending rollback runs before anything else reads the state (a plain
// step, a checkpoint, another sequence's verify, which overwrites the shared planes).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import type { SampleRequest } from "../../lib/api/backend.ts";
import { Engine, preparedCyclesLimit, warmPositions, warmReplayRounds, type EngineSequence } from "../../lib/gpu/engine.ts";
import { ATTN_DECODE_SPLIT } from "../../lib/gpu/attention.ts";
import { MAX_RECORDINGS, StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { foldsSiteRead } from "../../lib/gpu/site-read.ts";
import { openModel, type ModelFiles } from "../../lib/model/format.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { samplingParams } from "../../lib/reference/sampling.ts";
import { BACKEND } from "../selected-backend.ts";
import { withEnvVarAsync } from "../env-var.ts";

const DIR = join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny");
const N = 24;

let files: ModelFiles;
let engine: Engine;
let plain: number[];
/** A plain text prompt: the trained MTP head's drafts are often, not always, accepted. */
let PROMPT: number[];

beforeAll(async () => {
  StepRecordings.check = true;
  PROMPT = (await loadTokenizer(DIR)).encode("The cat sat on the mat. The dog sat on the");
  files = await openModel(DIR);
  engine = await Engine.load(files, BACKEND); // pool 100%, preloaded: every layer resident
  plain = await greedy(engine.newSequence(), N);
});
afterAll(async () => {
  StepRecordings.check = false;
  StepRecordings.enabled = true;
  await engine.close();
  files.close();
});

/** Plain greedy decoding (one row a step) of n tokens after PROMPT. */
async function greedy(seq: EngineSequence, n: number): Promise<number[]> {
  const first = await seq.forward(PROMPT);
  const tokens = [first.next[first.next.length - 1]!];
  while (tokens.length < n) tokens.push((await seq.forward([tokens[tokens.length - 1]!])).next[0]!);
  seq.dispose();
  return tokens;
}

/** Speculative decoding with `drafts` a cycle until n tokens, counting command buffers per cycle and accepts. */
async function speculative(seq: EngineSequence, drafts: number, n: number, sample?: SampleRequest | ((cycle: number) => SampleRequest)) {
  const request = (cycle: number) => (typeof sample === "function" ? sample(cycle) : sample);
  const device = engine.gpu.device;
  const first = await seq.forward(PROMPT, sample ? { sample: request(0) } : {});
  const tokens = [first.next[first.next.length - 1]!];
  const buffers: number[] = [];
  const accepts: number[] = [];
  const commands: number[] = [];
  const events: number[] = [];
  while (tokens.length < n) {
    const before = { buffers: device.commandBuffersCommitted, commands: device.commandsCommitted, events: device.eventsCommitted };
    const r = await seq.speculate(tokens[tokens.length - 1]!, drafts, undefined, request(buffers.length));
    buffers.push(device.commandBuffersCommitted - before.buffers);
    commands.push(device.commandsCommitted - before.commands);
    events.push(device.eventsCommitted - before.events);
    accepts.push(r.next.length - 1);
    tokens.push(...r.next);
  }
  return { tokens: tokens.slice(0, n), buffers, accepts, commands, events };
}

/**
 * How many of a run's cycles after the first were prepared (replayed into a buffer while the
 * cycle before ran): the likeliest accept count's cycle always is, the others only while that
 * cycle still runs (lib/gpu/engine.ts prepareCyclesFor), so on a GPU that finishes a tiny
 * model's cycle before the host has replayed every count (the H200) some come unprepared and
 * are replayed when they come. The count depends on that race; that some are prepared does not.
 */
function expectPrepared(prepared: number, later: number): void {
  expect(prepared).toBeGreaterThan(0);
  expect(prepared).toBeLessThanOrEqual(later);
}

for (const drafts of [2, 3]) {
  test(`${drafts} drafts: greedy's tokens, one command buffer a cycle (the first: the prompt's MTP catch-up first), every cycle from a recording (checked)`, async () => {
    const totals = engine.recordedSteps;
    const cycles = engine.speculativeCycles;
    const seq = engine.newSequence();
    const r = await speculative(seq, drafts, N);
    seq.dispose();
    expect(r.tokens).toEqual(plain);
    // Partial accepts (a rollback left pending, run in the next cycle's buffer) and full ones.
    expect(r.accepts.some((a) => a < drafts)).toBe(true);
    expect(r.accepts.some((a) => a > 0)).toBe(true);
    // The draft step, the copy of the drafts, the verify batch and the rollback: one buffer,
    // without a signal or a wait (every expert layer, the MTP head's too, is resident). The
    // first cycle's MTP catch-up of the prompt but its last row runs first, in a buffer of its own.
    expect(r.buffers).toEqual(r.buffers.map((_, i) => (i === 0 ? 2 : 1)));
    expect(r.events).toEqual(r.events.map(() => 0));
    // The rollback a partial accept leaves is one dispatch (the whole fixed-size state at
    // once); the catch-up of 1..drafts + 1 rows is the same dispatches whatever its rows,
    // except that one row's norm is formed by its projections where reads are fused
    // (site-read.ts; spec/engine-step/mtp-norms.test.ts), up to fusedReadRows() rows' with
    // CHERENKOV_HC_READ_FUSED_ROWS (spec/engine-step/verify-read.test.ts), and on a GPU each
    // of up to 4 rows' in its one-row kernel (spec/engine-step/verify-one-row.test.ts).
    const single = (i: number) => (foldsSiteRead(BACKEND, r.accepts[i]! + 1) ? 1 : 0);
    const base = r.commands.slice(1).map((c, i) => c - (r.accepts[i]! < drafts ? 1 : 0) + single(i));
    expect(new Set(base).size).toBe(1);
    const now = engine.speculativeCycles;
    expect(now.cycles - cycles.cycles).toBe(r.buffers.length);
    // The first cycle, its catch-up cut to the prompt's last row, is of a recorded shape too.
    expect(now.recorded - cycles.recorded).toBe(r.buffers.length);
    expectPrepared(now.prepared - cycles.prepared, r.buffers.length - 1);
    // At most drafts + 1 cycle shapes (catch-up rows 1..drafts + 1) are recorded; the rest replay.
    const steps = engine.recordedSteps;
    const recorded = steps.recorded - totals.recorded;
    const replayed = steps.replayed - totals.replayed;
    expect(recorded).toBeLessThanOrEqual(drafts + 1 + 3); // + the first cycle's, the prompt's shape and the decode row prepared after it
    expect(replayed).toBeGreaterThanOrEqual(r.buffers.length - 1 - (drafts + 1));
  }, 120_000);
}

test("a prompt that announces its next step (nextDrafts): the first cycle and its MTP catch-up are encoded while the prompt runs, and the catch-up is not waited for alone; greedy's tokens", async () => {
  for (const announce of [false, true]) {
    const device = engine.gpu.device;
    const seq = engine.newSequence();
    const first = await seq.forward(PROMPT, announce ? { nextDrafts: 2 } : {});
    const tokens = [first.next.at(-1)!];
    const before = { buffers: device.commandBuffersCommitted, cycles: engine.speculativeCycles };
    const r = await seq.speculate(tokens[0]!, 2);
    // The catch-up of the prompt but its last row, then the cycle: two buffers either way.
    expect(device.commandBuffersCommitted - before.buffers).toBe(2);
    expect(engine.speculativeCycles.prepared - before.cycles.prepared).toBe(announce ? 1 : 0);
    expect(engine.speculativeCycles.recorded - before.cycles.recorded).toBe(1);
    tokens.push(...r.next);
    while (tokens.length < N) tokens.push(...(await seq.speculate(tokens.at(-1)!, 2)).next);
    seq.dispose();
    expect(tokens.slice(0, N)).toEqual(plain);
  }
}, 120_000);

test("a first cycle announced but not taken (a plain step instead, or other drafts): what was prepared is dropped, the tokens are greedy's", async () => {
  for (const then of ["plain", "3 drafts"] as const) {
    const seq = engine.newSequence();
    const first = await seq.forward(PROMPT, { nextDrafts: 2 });
    const tokens = [first.next.at(-1)!];
    if (then === "plain") tokens.push((await seq.forward([tokens[0]!])).next[0]!);
    const before = engine.speculativeCycles.prepared;
    tokens.push(...(await seq.speculate(tokens.at(-1)!, 3)).next);
    expect(engine.speculativeCycles.prepared - before).toBe(0); // the 2-draft cycle prepared is not this one
    while (tokens.length < N) tokens.push(...(await seq.speculate(tokens.at(-1)!, 3)).next);
    seq.dispose();
    expect(tokens.slice(0, N)).toEqual(plain);
  }
}, 120_000);

test("CHERENKOV_PREPARED_CYCLES caps the cycles prepared while one runs: 0 prepares none, 1 only the likeliest accept count; greedy's tokens either way", async () => {
  expect(preparedCyclesLimit(undefined)).toBe(Infinity);
  expect(preparedCyclesLimit("2")).toBe(2);
  for (const bad of ["-1", "1.5", "many"]) expect(() => preparedCyclesLimit(bad)).toThrow(`CHERENKOV_PREPARED_CYCLES: "${bad}"`);
  const saved = process.env.CHERENKOV_PREPARED_CYCLES;
  try {
    process.env.CHERENKOV_PREPARED_CYCLES = "0";
    let before = engine.speculativeCycles;
    const none = await speculative(engine.newSequence(), 2, N);
    expect(none.tokens).toEqual(plain);
    expect(engine.speculativeCycles.prepared - before.prepared).toBe(0);
    process.env.CHERENKOV_PREPARED_CYCLES = "1";
    before = engine.speculativeCycles;
    const one = await speculative(engine.newSequence(), 2, N);
    expect(one.tokens).toEqual(plain);
    const used = engine.speculativeCycles.prepared - before.prepared;
    // Only a cycle whose accept count was the one prepared commits a prepared buffer: some, not all.
    expect(used).toBeGreaterThan(0);
    expect(used).toBeLessThan(one.buffers.length - 1);
    expect(one.buffers).toEqual(one.buffers.map((_, i) => (i === 0 ? 2 : 1)));
  } finally {
    if (saved === undefined) delete process.env.CHERENKOV_PREPARED_CYCLES;
    else process.env.CHERENKOV_PREPARED_CYCLES = saved;
  }
}, 120_000);

test("sampled drafts: a recorded and prepared cycle draws what a direct encode draws (the draw is live), and commits one buffer a cycle", async () => {
  const sample = (): SampleRequest => ({ params: samplingParams({ temperature: 0.8, topK: 20 }), seed: 7, counts: null, logprobs: null });
  const before = engine.speculativeCycles;
  // One request for the whole generation, as Model.generate keeps it: the cycles are prepared with its draws.
  const recorded = await speculative(engine.newSequence(), 3, N, sample());
  const afterRecorded = engine.speculativeCycles;
  expect(afterRecorded.recorded - before.recorded).toBe(recorded.buffers.length);
  expectPrepared(afterRecorded.prepared - before.prepared, recorded.buffers.length - 1);
  StepRecordings.enabled = false;
  try {
    const direct = await speculative(engine.newSequence(), 3, N, sample());
    expect(engine.speculativeCycles.recorded).toBe(afterRecorded.recorded);
    expect(recorded.tokens).toEqual(direct.tokens);
    expect(recorded.accepts).toEqual(direct.accepts);
  } finally {
    StepRecordings.enabled = true;
  }
  expect(recorded.buffers).toEqual(recorded.buffers.map((_, i) => (i === 0 ? 2 : 1)));
  expect(recorded.tokens).not.toEqual(plain);
  // A new request (another seed) every cycle: a cycle prepared with the last one's draws is not used.
  const seeded = (cycle: number): SampleRequest => ({ ...sample(), seed: 100 + cycle });
  const beforeSeeded = engine.speculativeCycles;
  const changing = await speculative(engine.newSequence(), 3, N, seeded);
  expect(engine.speculativeCycles.prepared).toBe(beforeSeeded.prepared);
  StepRecordings.enabled = false;
  try {
    expect(changing.tokens).toEqual((await speculative(engine.newSequence(), 3, N, seeded)).tokens);
  } finally {
    StepRecordings.enabled = true;
  }
}, 120_000);

test("a pending rollback runs before another sequence's cycle, a plain step and a checkpoint read the state", async () => {
  // Two sequences speculating in turns: each cycle's verify overwrites the shared planes, so
  // the other sequence's pending rollback must have run before it.
  const a = engine.newSequence();
  const b = engine.newSequence();
  const ta = [(await a.forward(PROMPT)).next.at(-1)!];
  const tb = [(await b.forward(PROMPT)).next.at(-1)!];
  let rolledBack = 0;
  while (ta.length < N || tb.length < N) {
    for (const [seq, t] of [[a, ta], [b, tb]] as const) {
      if (t.length >= N) continue;
      const r = await seq.speculate(t.at(-1)!, 3);
      if (r.next.length < 4) rolledBack++;
      t.push(...r.next);
    }
  }
  expect(rolledBack).toBeGreaterThan(0);
  expect(ta.slice(0, N)).toEqual(plain);
  expect(tb.slice(0, N)).toEqual(plain);
  a.dispose();
  b.dispose();

  // After a partial accept: a plain step folds the rollback into its buffer; a checkpoint runs
  // it first; both continue as greedy does.
  const s = engine.newSequence();
  const t = [(await s.forward(PROMPT)).next.at(-1)!];
  let partial = false;
  while (!partial && t.length < N - 4) {
    const r = await s.speculate(t.at(-1)!, 3);
    partial = r.next.length < 4;
    t.push(...r.next);
  }
  expect(partial).toBe(true);
  // The plain step commits one buffer: the rollback runs inside it.
  const device = engine.gpu.device;
  const before = device.commandBuffersCommitted;
  t.push((await s.forward([t.at(-1)!])).next[0]!);
  expect(device.commandBuffersCommitted - before).toBe(1);
  expect(t).toEqual(plain.slice(0, t.length));
  // A checkpoint taken with a rollback pending holds the rolled-back state.
  partial = false;
  while (!partial && t.length < N - 4) {
    const r = await s.speculate(t.at(-1)!, 3);
    partial = r.next.length < 4;
    t.push(...r.next);
  }
  expect(partial).toBe(true);
  const resumed = engine.newSequence(s.checkpoint());
  const fromCheckpoint = await resumed.forward([t.at(-1)!]);
  const fromSequence = await s.forward([t.at(-1)!]);
  expect(fromCheckpoint.next).toEqual(fromSequence.next);
  t.push(fromSequence.next[0]!);
  expect(t).toEqual(plain.slice(0, t.length));
  s.dispose();
  resumed.dispose();
}, 120_000);

test("a catch-up longer than the scratch's rows (4-row chunks): the earlier chunks only fill the MTP cache; greedy's tokens", async () => {
  const small = await Engine.load(files, BACKEND, { prefillChunk: 4 });
  try {
    expect(small.gpu.rows).toBe(4);
    const first = await greedy(small.newSequence(), N);
    const seq = small.newSequence();
    const t = [(await seq.forward(PROMPT)).next.at(-1)!];
    let accepted = 0;
    while (t.length < N) {
      const r = await seq.speculate(t.at(-1)!, 3);
      accepted += r.next.length - 1;
      t.push(...r.next);
    }
    seq.dispose();
    expect(t.slice(0, N)).toEqual(first);
    expect(accepted).toBeGreaterThan(0);
    expect(PROMPT.length).toBeGreaterThan(2 * small.gpu.rows);
  } finally {
    await small.close();
  }
}, 120_000);

test("a streamed pool (50%): the cycle's MTP and trunk sites are served at handshakes in its one buffer; greedy's tokens", async () => {
  const streamed = await Engine.load(files, BACKEND, { pool: "50%" });
  try {
    const want = await greedy(streamed.newSequence(), N);
    const before = streamed.speculativeCycles;
    const handshakes = () => (streamed.stats() as { handshake: { all: { count: number } } }).handshake.all.count;
    // Announced or not (nextDrafts), the same: no cycle shape is recorded here, nothing prepared.
    for (const announce of [false, true]) {
      const seq = streamed.newSequence();
      const t = [(await seq.forward(PROMPT, announce ? { nextDrafts: 2 } : {})).next.at(-1)!];
      const device = streamed.gpu.device;
      const h0 = handshakes();
      while (t.length < N) {
        const b = device.commandBuffersCommitted;
        const r = await seq.speculate(t.at(-1)!, 2);
        expect(device.commandBuffersCommitted - b).toBe(1);
        t.push(...r.next);
      }
      seq.dispose();
      expect(t.slice(0, N)).toEqual(want);
      expect(handshakes()).toBeGreaterThan(h0);
    }
    // Not every layer is held: nothing is recorded.
    expect(streamed.speculativeCycles.recorded).toBe(before.recorded);
  } finally {
    await streamed.close();
  }
}, 120_000);

test("a cycle after plain steps runs the long part of its MTP catch-up first, in a buffer of its own, and keeps a recorded shape (CHERENKOV_MTP_CATCHUP_SPLIT=0: inside the cycle, encoded directly); greedy's tokens either way", async () => {
  const GAP = 4; // plain steps before each cycle: a catch-up of GAP + 1 rows, more than any cycle's (drafts + 1)
  const run = async () => {
    const device = engine.gpu.device;
    const seq = engine.newSequence();
    const t = [(await seq.forward(PROMPT)).next.at(-1)!];
    const before = engine.speculativeCycles;
    const buffers: number[] = [];
    let accepted = 0;
    while (t.length < N) {
      for (let i = 0; i < GAP && t.length < N; i++) t.push((await seq.forward([t.at(-1)!])).next[0]!);
      if (t.length >= N) break;
      const b = device.commandBuffersCommitted;
      const r = await seq.speculate(t.at(-1)!, 2);
      buffers.push(device.commandBuffersCommitted - b);
      accepted += r.next.length - 1;
      t.push(...r.next);
    }
    seq.dispose();
    const after = engine.speculativeCycles;
    return { tokens: t.slice(0, N), buffers, accepted, cycles: after.cycles - before.cycles, recorded: after.recorded - before.recorded };
  };
  const split = await withEnvVarAsync("CHERENKOV_MTP_CATCHUP_SPLIT", undefined, run);
  const whole = await withEnvVarAsync("CHERENKOV_MTP_CATCHUP_SPLIT", "0", run);
  for (const r of [split, whole]) {
    expect(r.tokens).toEqual(plain);
    expect(r.accepted).toBeGreaterThan(0);
    expect(r.cycles).toBeGreaterThanOrEqual(3);
  }
  // Every cycle follows plain steps: split, two buffers each, every cycle recorded (after the
  // first, replayed); whole, one buffer each, none recorded.
  expect(split.buffers).toEqual(split.buffers.map(() => 2));
  expect(split.recorded).toBe(split.cycles);
  expect(whole.buffers).toEqual(whole.buffers.map(() => 1));
  expect(whole.recorded).toBe(0);
}, 120_000);

test("a new engine records its decode row and every cycle shape at load (warmSteps): its first sequence's cycles replay, none is recorded then (CHERENKOV_WARM_STEPS=0: recorded as they come); greedy's tokens", async () => {
  const run = async () => {
    const fresh = await Engine.load(files, BACKEND);
    try {
      const { recorded: atLoad, replayed: replayedAtLoad } = fresh.recordedSteps;
      const committedAtLoad = fresh.gpu.device.commandBuffersCommitted;
      const seq = fresh.newSequence();
      const t = [(await seq.forward(PROMPT)).next.at(-1)!];
      const afterPrompt = fresh.recordedSteps.recorded;
      while (t.length < SHORT) t.push(...(await seq.speculate(t.at(-1)!, 2)).next);
      seq.dispose();
      const cycles = fresh.recordedSteps.recorded - afterPrompt;
      return { tokens: t.slice(0, SHORT), atLoad, replayedAtLoad, committedAtLoad, prompt: afterPrompt - atLoad, cycles };
    } finally {
      await fresh.close();
    }
  };
  const SHORT = 12; // a few cycles: enough to see each one recorded or not
  const warm = await withEnvVarAsync("CHERENKOV_WARM_REPLAYS", "0", () => withEnvVarAsync("CHERENKOV_WARM_STEPS", undefined, run));
  const cold = await withEnvVarAsync("CHERENKOV_WARM_STEPS", "0", run);
  // The warm replays at load (GPU backends' default): host work on command buffers never
  // committed, not counted as replays; the same recordings and tokens.
  const replays = await withEnvVarAsync("CHERENKOV_WARM_REPLAYS", "2", () => withEnvVarAsync("CHERENKOV_WARM_STEPS", undefined, run));
  expect(replays).toEqual(warm);
  expect(warm.replayedAtLoad).toBe(0);
  expect(warm.tokens).toEqual(plain.slice(0, SHORT));
  expect(cold.tokens).toEqual(plain.slice(0, SHORT));
  // At load: the decode row, and for each draft count k the cycle after plain steps and one per accept count.
  const maxDrafts = engine.gpu.maxDrafts;
  let shapes = 1;
  for (let k = 1; k <= maxDrafts; k++) shapes += k + 2;
  expect(warm.atLoad).toBe(shapes);
  expect(warm.atLoad).toBeLessThan(MAX_RECORDINGS); // room left for the prompts' shapes
  expect(cold.atLoad).toBe(0);
  expect(warm.prompt).toBe(1); // the prompt's own shape
  expect(warm.cycles).toBe(0);
  expect(cold.cycles).toBeGreaterThan(1);
}, 120_000);

test("warm replay rounds at load: 48 on a GPU backend, none on the CPU backend; CHERENKOV_WARM_REPLAYS sets them, anything but a count refused by name", () => {
  expect(warmReplayRounds("cuda", undefined)).toBe(48);
  expect(warmReplayRounds("metal", "")).toBe(48);
  expect(warmReplayRounds("cpu", undefined)).toBe(0);
  expect(warmReplayRounds("cpu", "5")).toBe(5);
  expect(warmReplayRounds("cuda", "0")).toBe(0);
  for (const bad of ["-1", "1.5", "many"]) expect(() => warmReplayRounds("cuda", bad)).toThrow(`CHERENKOV_WARM_REPLAYS: "${bad}" is not a count of rounds`);
});

test("warmSteps' positions: past every catch-up's rows, then past each length where attention takes other kernels (split past 64 positions, QSA scoring past topk), within the capacity", () => {
  const c = files.config;
  const topk = c.attention.qsa?.topk ?? null;
  const base = engine.gpu.maxDrafts + 1;
  const expected = [...new Set([base, ATTN_DECODE_SPLIT + base, ...(topk === null ? [] : [topk + base])])].sort((a, b) => a - b);
  expect(warmPositions(engine.gpu, 4096)).toEqual(expected);
  expect(warmPositions(engine.gpu, 4096).length).toBeGreaterThan(1);
  // A step at each position must fit: with room for the base only, only the base.
  expect(warmPositions(engine.gpu, base + 1 + engine.gpu.maxDrafts)).toEqual([base]);
  expect(warmPositions({ maxDrafts: 2, config: { ...c, attention: { ...c.attention, qsa: { heads: 1, head_dim: 32, topk: 2048 } } } }, 1 << 16)).toEqual([3, ATTN_DECODE_SPLIT + 3, 2051]);
  expect(warmPositions({ maxDrafts: 0, config: { ...c, attention: { ...c.attention, qsa: null } } }, 1 << 16)).toEqual([1, ATTN_DECODE_SPLIT + 1]);
});
