// Recorded steps (lib/gpu/recorded-step.ts): a resident step is recorded once and replayed
// with only its position-dependent dispatches encoded again. Every replay here is compared
// word for word with a fresh encode (StepRecordings.check) across positions where the
// attention's splits and QSA's score rows change shape; the tokens equal those of direct
// encoding; a dispatch that depends on the position outside live() is caught by name; a
// malformed tape fails in the shim with a clear error.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { bind, live } from "../../lib/gpu/dispatch.ts";
import { encodeEmbed } from "../../lib/gpu/embed.ts";
import { Engine } from "../../lib/gpu/engine.ts";
import { SitePlan } from "../../lib/gpu/handshake.ts";
import { MAX_RECORDINGS, StepRecordings } from "../../lib/gpu/recorded-step.ts";
import type { SequenceState } from "../../lib/gpu/state.ts";
import { openModel } from "../../lib/model/format.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { BACKEND } from "../selected-backend.ts";

const c = goldenCases.find((x) => x.name === "tiny-all-s1")!;
let dir: string;

beforeAll(async () => {
  dir = await buildGoldenModel(c);
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
  StepRecordings.check = false;
  StepRecordings.enabled = true;
});

type Counts = { recorded: number; replayed: number; preparedUsed: number };

/** Greedy tokens after the golden prompt; the engine's recorded/replayed counts at load and since. */
async function decode(n: number, recorded: boolean): Promise<{ tokens: number[]; atLoad: Counts; counts: Counts }> {
  StepRecordings.enabled = recorded;
  const files = await openModel(dir);
  const engine = await Engine.load(files, BACKEND, {}); // pool 100%, preloaded: every layer resident
  try {
    const atLoad = engine.recordedSteps;
    const seq = engine.newSequence();
    const first = await seq.forward(c.prompt);
    const tokens = [first.next[first.next.length - 1]!];
    while (tokens.length < n) tokens.push((await seq.forward([tokens[tokens.length - 1]!])).next[0]!);
    const now = engine.recordedSteps;
    return { tokens, atLoad, counts: { recorded: now.recorded - atLoad.recorded, replayed: now.replayed - atLoad.replayed, preparedUsed: now.preparedUsed - atLoad.preparedUsed } };
  } finally {
    await engine.close();
    files.close();
  }
}

test(
  "a resident decode is recorded once and replayed; every replay equals a fresh encode word for word; the tokens equal direct encoding's",
  async () => {
    StepRecordings.check = true;
    // Past 130 positions: the decode attention's splits (64 positions each) grow twice, and
    // QSA's score rows with every 4 positions.
    const n = 140 - c.prompt.length;
    const replayed = await decode(n, true);
    const direct = await decode(n, false);
    expect(replayed.tokens).toEqual(direct.tokens);
    expect(direct.counts).toEqual({ recorded: 0, replayed: 0, preparedUsed: 0 });
    expect(direct.atLoad.recorded).toBe(0);
    // The decode row was recorded at load (Engine.warmSteps, with the MTP head's cycles), on the
    // state the sequence took; then one recording for the prompt's shape. Every decode row
    // commits a step prepared while the one before it ran, replayed (the one prepared while the
    // prompt ran too; the last one prepared is never used).
    expect(replayed.atLoad.recorded).toBeGreaterThanOrEqual(1);
    expect(replayed.counts).toEqual({ recorded: 1, replayed: n, preparedUsed: n - 1 });
  },
  240_000,
);

test("the check names a position-dependent dispatch outside live(); inside live() it replays; a sequence keeps at most MAX_RECORDINGS shapes", async () => {
  StepRecordings.enabled = true;
  StepRecordings.check = true;
  const files = await openModel(dir);
  const engine = await Engine.load(files, BACKEND, {});
  try {
    const gpu = engine.gpu;
    const seq = (engine.newSequence() as unknown as { state: SequenceState }).state;
    const recordings = new StepRecordings();
    const d = gpu.config.hidden_size;
    const X = { buffer: gpu.scratch.X.buffer, offset: gpu.scratch.X.offset, stride: gpu.scratch.X.stride };
    const step = (pos0: number, inLive: boolean) => {
      const cb = gpu.device.commandBuffer();
      try {
        recordings.encode({ device: gpu.device, cb }, new SitePlan(gpu.event, 0), inLive ? "live" : "outside", { pos0 }, (ctx, _plan, vars) => {
          if (inLive) live(ctx, vars, (ctx, { pos0 }) => encodeEmbed(ctx, gpu.refs.embed, bind(seq.tokens, pos0 * 4), X, 1, 1));
          else encodeEmbed(ctx, gpu.refs.embed, bind(seq.tokens, vars.pos0 * 4), X, 1, 1);
        });
        cb.commit().waitUntilCompleted();
      } finally {
        cb.release();
      }
    };
    expect(d).toBeGreaterThan(0);
    step(3, true);
    step(4, true); // replayed, checked
    expect(recordings.counts).toEqual({ recorded: 1, replayed: 1 });
    step(3, false);
    expect(() => step(4, false)).toThrow(/position 4: command 0 \(embed_\w+\) differs from a fresh encode.*outside live\(\)/);
    // At most MAX_RECORDINGS shapes are kept, the least recently used dropped first.
    const keyed = (key: string) => {
      const cb = gpu.device.commandBuffer();
      try {
        recordings.encode({ device: gpu.device, cb }, new SitePlan(gpu.event, 0), key, { pos0: 3 }, (ctx, _plan, vars) =>
          live(ctx, vars, (ctx, { pos0 }) => encodeEmbed(ctx, gpu.refs.embed, bind(seq.tokens, pos0 * 4), X, 1, 1)),
        );
      } finally {
        cb.release();
      }
    };
    for (let i = 0; i < MAX_RECORDINGS + 3; i++) {
      keyed(`shape ${i}`);
      keyed("live"); // used again each time: never the least recent
    }
    expect(recordings.keys().length).toBe(MAX_RECORDINGS);
    expect(recordings.keys()).toContain("live");
    expect(recordings.keys()).not.toContain("shape 0");
    expect(recordings.keys()).toContain(`shape ${MAX_RECORDINGS + 2}`);
  } finally {
    await engine.close();
    files.close();
  }
});

test("a malformed tape fails in the shim naming ck_encode_tape, and encodes nothing", async () => {
  const files = await openModel(dir);
  const engine = await Engine.load(files, BACKEND, {});
  try {
    const device = engine.gpu.device;
    const cb = device.commandBuffer();
    try {
      expect(() => cb.encodeTape(new Uint32Array([0, 0, 0, 0, 0]), 1)).toThrow(/ck_encode_tape: a command's header runs past the end of the tape/);
      expect(() => cb.encodeTape(new Uint32Array([7, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]), 1)).toThrow(/ck_encode_tape: a command's kind/);
      expect(() => cb.encodeTape(new Uint32Array([0, 2, 0, 0, 0, 1, 1, 1, 1, 1, 1]), 1)).toThrow(/ck_encode_tape: a command's bindings or params run past/);
      // A well-formed command naming no pipeline fails as ck_encode_dispatch would.
      expect(() => cb.encodeTape(new Uint32Array([0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]), 1)).toThrow(/pipeline/i);
      cb.commit().waitUntilCompleted();
    } finally {
      cb.release();
    }
  } finally {
    await engine.close();
    files.close();
  }
});
