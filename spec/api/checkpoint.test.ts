// Prefix checkpoints on both backends: a session resumed from a checkpoint generates exactly
// what a session that ran the whole prefix generates (plain and with MTP drafts, whose
// acceptance shows the draft head's state came along too); a checkpoint outlives its source
// session; checkpoints of another model are refused.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import type { Checkpoint } from "../../lib/api/checkpoint.ts";
import { Model } from "../../lib/api/model.ts";
import { BACKEND } from "../selected-backend.ts";

/** The backend's copy of the state, without the reference to the model or engine that made it. */
function stateOf(cp: Checkpoint): Record<string, unknown> {
  const { model: _m, engine: _e, ...rest } = cp.state as unknown as Record<string, unknown>;
  return rest;
}

const DIR = join(import.meta.dir, "..", "..", "examples", "models", "qwen4-exp-tiny");
const PREFIX = "The cat sat on the mat. The dog";
const MORE = " ran to the park and";

let other: Model;
beforeAll(async () => {
  other = await Model.load(DIR, { backend: "reference" });
});
afterAll(() => other.close());

describe.each(["reference", BACKEND] as const)("checkpoints on %s", (backend) => {
  let model: Model;
  beforeAll(async () => {
    model = await Model.load(DIR, { backend });
  });
  afterAll(() => model.close());

  test("resuming a prompt's checkpoint = running the whole prefix (then more prompt, then generation)", async () => {
    const full = model.session();
    await full.append(PREFIX);
    await full.append(MORE);
    const want = await full.generate({ maxTokens: 8, stopAtEos: false });
    full.close();

    const source = model.session();
    await source.append(PREFIX);
    const cp = source.checkpoint();
    expect(cp.tokens).toEqual(model.encode(PREFIX));
    source.close();

    const resumed = model.session({ from: cp });
    expect(resumed.tokens).toEqual(cp.tokens as number[]);
    await resumed.append(MORE);
    const got = await resumed.generate({ maxTokens: 8, stopAtEos: false });
    expect(got.tokens).toEqual(want.tokens);
    expect(got.usage.promptTokens).toBe(model.encode(MORE).length); // the prefix was not run again
    resumed.close();

    // Straight to generation from the checkpoint (the kept prediction).
    const direct = model.session({ from: cp });
    const g = await direct.generate({ maxTokens: 6, stopAtEos: false });
    expect(g.tokens).toEqual((await model.generate(PREFIX, { maxTokens: 6, stopAtEos: false })).tokens);
    direct.close();
  });

  test("a checkpoint taken mid-generation with drafts survives its source going on and closing; drafting resumes exactly", async () => {
    const source = model.session();
    await source.append(PREFIX);
    await source.generate({ maxTokens: 5, stopAtEos: false, drafts: 2 });
    const cp = source.checkpoint();
    const want = await source.generate({ maxTokens: 10, stopAtEos: false, drafts: 2 });
    const wantState = stateOf(source.checkpoint());
    source.close();

    const resumed = model.session({ from: cp });
    const got = await resumed.generate({ maxTokens: 10, stopAtEos: false, drafts: 2 });
    expect(got.tokens).toEqual(want.tokens);
    expect(got.drafts).toEqual(want.drafts!);
    expect(got.drafts!.accepted).toBeGreaterThan(0);
    // Every value of the state is the same as the source's (trunk, MTP cache, pending hidden rows).
    expect(stateOf(resumed.checkpoint())).toEqual(wantState);
    // Two sessions from one checkpoint are independent.
    const again = model.session({ from: cp });
    expect((await again.generate({ maxTokens: 10, stopAtEos: false })).tokens).toEqual(want.tokens);
    again.close();
    resumed.close();
  });

  test("bytes: the used state only, growing with the prefix", async () => {
    const s = model.session();
    await s.append(PREFIX);
    const short = s.checkpoint();
    await s.append(MORE);
    const long = s.checkpoint();
    s.close();
    expect(short.bytes).toBeGreaterThan(0);
    expect(long.bytes).toBeGreaterThan(short.bytes);
    expect(long.length).toBe(short.length + model.encode(MORE).length);
    if (backend !== "reference") {
      // Far below one sequence's device state (sized for maxContext positions).
      const setup = (model.stats().engine as { setup: { maxContext: number } }).setup;
      expect(setup.maxContext).toBeGreaterThan(1000);
      expect(long.bytes).toBeLessThan(4 * 1024 * 1024);
    }
  });

  test("a checkpoint of another model (or anything else) is refused with a clear error", async () => {
    const s = other.session();
    await s.append(PREFIX);
    const foreign = s.checkpoint();
    s.close();
    expect(() => model.session({ from: foreign })).toThrow(/checkpoint was made by another model/);
    expect(() => model.session({ from: {} as never })).toThrow(/must be a Checkpoint/);
  });
});
