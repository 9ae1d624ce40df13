// Model and Session work with `using` / `await using` (issue 11 item 4).
import { expect, test } from "bun:test";

import { Model } from "../../lib/index.ts";

test("await using closes the model at the end of its scope; using closes a session", async () => {
  let outer: Model;
  let session: ReturnType<Model["session"]>;
  {
    await using model = await Model.load(undefined, { backend: "reference" });
    outer = model;
    {
      using chat = model.session();
      session = chat;
      await chat.append("def f(x):");
      expect((await chat.generate({ maxTokens: 2 })).tokens).toHaveLength(2);
    }
    await expect(session.generate({ maxTokens: 1 })).rejects.toThrow(/closed/);
    expect((await model.generate("x", { maxTokens: 1 })).tokens).toHaveLength(1);
  }
  await expect(outer.generate("x", { maxTokens: 1 })).rejects.toThrow(/closed/);
});

test("options are passed the same way everywhere: append takes { signal } like generate", async () => {
  await using model = await Model.load(undefined, { backend: "reference" });
  using chat = model.session();
  await expect(chat.append("def f(x):", { signal: AbortSignal.abort() })).rejects.toThrow(/abort/i);
  await chat.append("def f(x):", { signal: new AbortController().signal });
  expect((await chat.generate({ maxTokens: 1, signal: new AbortController().signal })).tokens).toHaveLength(1);
});
