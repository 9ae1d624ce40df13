// Prompts and options are checked before use (issue 22, item 7): a value of the wrong shape is
// refused with InvalidArgumentError naming it, never reinterpreted or silently ignored; a
// checkpoint's tokens cannot be changed; token ids outside the vocabulary are refused.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { InvalidArgumentError, Model } from "../../lib/index.ts";

let model: Model;
beforeAll(async () => {
  model = await Model.load(undefined, { backend: "reference" });
});
afterAll(() => model.close());

const refused = async (f: () => Promise<unknown>, message: RegExp) => {
  const e = await f().then(
    () => null,
    (err) => err,
  );
  expect(e).toBeInstanceOf(InvalidArgumentError);
  expect((e as Error).message).toMatch(message);
};

describe("stop", () => {
  test("a string is refused (it was split into characters), with the array to write instead", async () => {
    await refused(() => model.generate("x", { maxTokens: 1, stop: "xyz!" as never }), /^options\.stop: must be an array of strings: write \["xyz!"\]/);
  });
  test("an empty string, a number or null is refused by position", async () => {
    await refused(() => model.generate("x", { maxTokens: 1, stop: [""] }), /^options\.stop\[0\]: must not be empty/);
    await refused(() => model.generate("x", { maxTokens: 1, stop: ["a", 5 as never] }), /^options\.stop\[1\]: must be a string/);
    await refused(() => model.generate("x", { maxTokens: 1, stop: null as never }), /^options\.stop: must be an array of strings/);
  });
  test("a misspelt option is refused, not ignored", async () => {
    await refused(() => model.generate("x", { max_tokens: 1 } as never), /max_tokens/);
  });
  test("a session's generate checks its options too", async () => {
    const s = model.session();
    await s.append("x");
    await refused(() => s.generate({ maxTokens: 1, stop: "x" as never }), /options\.stop/);
    s.close();
  });
});

describe("prompts", () => {
  test("an object, a message without string content, a fractional id are refused", async () => {
    await refused(() => model.generate({} as never, { maxTokens: 1 }), /^prompt: expected a string, an array of token ids or an array of chat messages, got an object/);
    await refused(() => model.generate([{ role: "user", content: 5 }] as never, { maxTokens: 1 }), /^prompt\[0\]\.content: must be a string/);
    await refused(() => model.generate([{ role: "", content: "hi" }], { maxTokens: 1 }), /^prompt\[0\]\.role/);
    await refused(() => model.generate([1, 2.5], { maxTokens: 1 }), /^prompt\[1\]: must be an integer token id/);
    await refused(() => model.generate([1, "a"] as never, { maxTokens: 1 }), /only token ids .* or only chat messages/);
  });
  test("an id outside the vocabulary is refused by position", async () => {
    const v = model.config.vocab_size;
    await refused(() => model.generate([1, v], { maxTokens: 1 }), new RegExp(`^prompt\\[1\\]: token id ${v} is outside the vocabulary`));
    expect(() => model.encode([-1])).toThrow(InvalidArgumentError);
  });
  test("valid prompts of each kind still generate", async () => {
    for (const p of ["def f", [1, 2, 3], [{ role: "user", content: "hi" }]] as const)
      expect((await model.generate(p as never, { maxTokens: 2, stop: ["\n"] })).usage.promptTokens).toBeGreaterThan(0);
  });
});

describe("checkpoints", () => {
  test("a checkpoint's tokens are a frozen copy; a resumed session refuses out-of-vocabulary ids", async () => {
    const s = model.session();
    await s.append("def add(a, b):");
    const cp = s.checkpoint();
    const before = [...cp.tokens];
    expect(() => (cp.tokens as number[]).push(7)).toThrow(TypeError);
    expect(() => ((cp.tokens as number[])[0] = 9)).toThrow(TypeError);
    s.tokens.push(1234); // the session's own array is not the checkpoint's
    expect([...cp.tokens]).toEqual(before);
    s.close();
    const resumed = model.session({ from: cp });
    expect(resumed.tokens).toEqual(before);
    await refused(() => resumed.append([model.config.vocab_size + 5]), /outside the vocabulary/);
    resumed.close();
  });
});
