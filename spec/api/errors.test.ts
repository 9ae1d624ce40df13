// Every error a caller may catch is an exported class (issue 11 item 4).
import { expect, test } from "bun:test";

import * as cherenkov from "../../lib/index.ts";
import { Model, ModelClosedError, SessionClosedError } from "../../lib/index.ts";

test("the error classes are exported, each an Error subclass named as exported", () => {
  for (const name of ["BackendUnavailableError", "BudgetError", "ChatTemplateError", "ConfigError", "ContextFullError", "FootprintError", "GpuStepError", "InvalidArgumentError", "IoCancelledError", "IoReadError", "IoTimeoutError", "ModelClosedError", "ModelFormatError", "NonFiniteError", "PoolTooSmallError", "SessionBusyError", "SessionClosedError", "ShimError"] as const) {
    const Cls = cherenkov[name] as unknown as new (...a: never[]) => Error;
    expect(typeof Cls).toBe("function");
    expect(Cls.prototype).toBeInstanceOf(Error);
    expect(Cls.name).toBe(name);
  }
});

test("a closed session throws SessionClosedError, a closed model ModelClosedError", async () => {
  const model = await Model.load(undefined, { backend: "reference" });
  const chat = model.session();
  chat.close();
  await expect(chat.append("x")).rejects.toBeInstanceOf(SessionClosedError);
  await model.close();
  await expect(model.generate("x", { maxTokens: 1 })).rejects.toBeInstanceOf(ModelClosedError);
  await expect(model.generate("x", { maxTokens: 1 })).rejects.toThrow("the model is closed");
});

test("ContextFullError keeps the tokens generated before the context filled", async () => {
  const model = await Model.load(undefined, { backend: "cpu", engine: { maxContext: 12 } });
  try {
    const prompt = model.encode("def add(a, b):");
    expect(prompt.length).toBeLessThan(10);
    const e = await model.generate(prompt, { maxTokens: 50, stopAtEos: false }).then(() => null, (x: unknown) => x);
    expect(e).toBeInstanceOf(cherenkov.ContextFullError);
    const full = e as InstanceType<typeof cherenkov.ContextFullError>;
    expect(full.tokens.length).toBeGreaterThan(0);
    expect(prompt.length + full.tokens.length).toBeLessThanOrEqual(12 + 1);
    expect(full.text).toBe(model.decode(full.tokens));
    // The same prefix, greedy, as an unbounded generation gives.
    const free = await Model.load(undefined, { backend: "reference" });
    const want = await free.generate(prompt, { maxTokens: full.tokens.length, stopAtEos: false });
    await free.close();
    expect(full.tokens).toEqual(want.tokens);
  } finally {
    await model.close();
  }
}, 60_000);
