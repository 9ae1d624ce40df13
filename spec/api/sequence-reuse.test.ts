// Consecutive model.generate() calls on one Model run on one sequence state (lib/gpu/engine.ts
// Engine.retire): each call's sequence is disposed before generate() returns, and the engine
// hands its state, reset, to the next call's sequence. Before, every call allocated a state of
// its own (19 buffers, 6.5 MB on qwen4-exp-tiny) and recorded its steps again, and the last
// call's state was released only after the next call's was allocated: consecutive calls
// alternated between two sets of buffers (on the H200 every second bench:decode --auto run was
// 2-3% slower, whatever it ran).
import { expect, test } from "bun:test";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import type { Engine, EngineSequence } from "../../lib/gpu/engine.ts";
import type { SequenceState } from "../../lib/gpu/state.ts";
import { Device } from "../../lib/shim.ts";
import { BACKEND } from "../selected-backend.ts";

const DIR = join(import.meta.dir, "../../examples/models/qwen4-exp-tiny");
const PROMPT = Array.from({ length: 64 }, (_, i) => (37 * i + 11) % 256);

function engineOf(model: Model): Engine {
  return (model as unknown as { backend: { engine: Engine } }).backend.engine;
}

/** The states of the sequences `engine` makes while `fn` runs, and the device buffers allocated. */
async function watch<T>(engine: Engine, fn: () => Promise<T>): Promise<{ result: T; states: SequenceState[]; allocated: number }> {
  const states: SequenceState[] = [];
  let allocated = 0;
  const newSequence = engine.newSequence;
  const buffer = Device.prototype.buffer;
  engine.newSequence = function (this: Engine, ...args: Parameters<Engine["newSequence"]>): EngineSequence {
    const s = newSequence.apply(this, args);
    states.push(s.state);
    return s;
  };
  Device.prototype.buffer = function (this: Device, ...args: Parameters<Device["buffer"]>) {
    allocated++;
    return buffer.apply(this, args);
  };
  try {
    return { result: await fn(), states, allocated };
  } finally {
    engine.newSequence = newSequence;
    Device.prototype.buffer = buffer;
  }
}

test("consecutive generate() calls reuse the first call's sequence state: no buffer allocated, no step recorded again, the same tokens", async () => {
  await using model = await Model.load(DIR, { backend: BACKEND, prefillChunk: PROMPT.length });
  const engine = engineOf(model);
  const run = (drafts?: "auto") => model.generate(PROMPT, { maxTokens: 16, stopAtEos: false, ...(drafts ? { drafts } : {}) });
  const first = await watch(engine, () => run());
  expect(first.states).toHaveLength(1);
  const state = first.states[0]!;
  const addresses = [state.tokens.contents, state.fixed.contents];
  for (const drafts of [undefined, "auto", "auto", undefined, undefined] as const) {
    const recorded = engine.recordedSteps.recorded;
    const later = await watch(engine, () => run(drafts));
    expect(later.result.tokens).toEqual(first.result.tokens);
    expect(later.states).toEqual([state]);
    expect([state.tokens.contents, state.fixed.contents]).toEqual(addresses);
    expect(later.allocated).toBe(0);
    // The prompt's chunk and the decode row were recorded by the first call (the state's recordings).
    if (!drafts) expect(engine.recordedSteps.recorded).toBe(recorded);
  }
}, 120_000);

test("a reused state forgets its last sequence: a checkpoint resumed on it samples what a fresh session samples (the logits it held are not reused)", async () => {
  await using model = await Model.load(DIR, { backend: BACKEND, prefillChunk: PROMPT.length });
  const other = PROMPT.map((t) => (t * 7 + 3) % 256);
  const opts = { maxTokens: 8, stopAtEos: false, temperature: 0.8, seed: 11 };
  // The expected draw: a session that appended PROMPT, then sampled from its last row.
  const fresh = model.session();
  await fresh.append(PROMPT);
  const want = await fresh.generate(opts);
  fresh.close();
  const a = model.session();
  await a.append(PROMPT);
  const cp = a.checkpoint();
  a.close();
  // Another prompt of the same length leaves its last row's logits in the engine's scratch.
  const b = model.session();
  await b.append(other);
  b.close();
  const resumed = model.session({ from: cp });
  expect((await resumed.generate(opts)).tokens).toEqual(want.tokens);
  resumed.close();
}, 120_000);
