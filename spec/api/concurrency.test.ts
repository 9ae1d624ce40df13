// Sessions and models used concurrently, on the reference and on the engine (the selected
// backend: cpu here, metal on a Mac): one operation per session at a time (a second one is
// refused with SessionBusyError, never interleaved), close() stops a running generation, and
// separate sessions do not disturb each other.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Model, SessionBusyError, SessionClosedError } from "../../lib/index.ts";
import { BACKEND } from "../selected-backend.ts";

const prompt = "def add(a, b):\n";
/** Tokens per generation (few: the emulated engine is slow on a loaded 2-core machine). */
const N = 6;

for (const backend of ["reference", BACKEND] as const) {
  describe(`${backend} backend`, () => {
    let model: Model;
    let want: number[];
    beforeAll(async () => {
      // small prefill chunks: close() can stop a prefill between them
      model = await Model.load(undefined, { backend, prefillChunk: 8 });
      want = (await model.generate(prompt, { maxTokens: N, stopAtEos: false })).tokens;
    });
    afterAll(async () => {
      await model.close();
    });

    test("a second generate() on a busy session is refused; the first one's tokens are intact", async () => {
      const s = model.session();
      await s.append(prompt);
      const first = s.generate({ maxTokens: N, stopAtEos: false });
      const second = s.generate({ maxTokens: N, stopAtEos: false });
      await expect(second).rejects.toBeInstanceOf(SessionBusyError);
      await expect(second).rejects.toThrow("generate: the session is busy with generate");
      expect((await first).tokens).toEqual(want);
      expect(s.tokens.slice(model.encode(prompt).length)).toEqual(want);
      // once it is done, the session takes the next operation
      await s.append("\n");
      expect((await s.generate({ maxTokens: 2, stopAtEos: false })).tokens).toHaveLength(2);
      s.close();
    });

    test("append() during a stream is refused, so no tokens interleave; checkpoint and reset too", async () => {
      const s = model.session();
      await s.append(prompt);
      const it = s.stream({ maxTokens: N, stopAtEos: false });
      const got: number[] = [((await it.next()).value as { token: number }).token];
      await expect(s.append("x = 1")).rejects.toBeInstanceOf(SessionBusyError);
      expect(() => s.checkpoint()).toThrow(SessionBusyError);
      expect(() => s.reset()).toThrow(SessionBusyError);
      for (;;) {
        const r = await it.next();
        if (r.done) break;
        got.push(r.value.token);
      }
      expect(got).toEqual(want);
      expect(s.tokens).toEqual([...model.encode(prompt), ...want]);
      s.close();
    });

    test("close() during a generate stops it at its next step with SessionClosedError", async () => {
      const s = model.session();
      await s.append(prompt);
      const tokens: number[] = [];
      const run = (async () => {
        for await (const c of s.stream({ maxTokens: 500, stopAtEos: false })) {
          tokens.push(c.token);
          if (tokens.length === 3) setTimeout(() => s.close(), 0);
        }
      })();
      await expect(run).rejects.toBeInstanceOf(SessionClosedError);
      await expect(run).rejects.toThrow("the session was closed");
      expect(tokens.length).toBeGreaterThanOrEqual(3);
      expect(tokens.length).toBeLessThan(10);
      await expect(s.append("more")).rejects.toBeInstanceOf(SessionClosedError);
    });

    test("close() during a prompt's prefill stops it too", async () => {
      const s = model.session();
      const long = Array.from({ length: 40 }, (_, i) => 40 + (i % 50));
      const run = s.append(long);
      setTimeout(() => s.close(), 0);
      await expect(run).rejects.toBeInstanceOf(SessionClosedError);
    });

    test("concurrent generations on separate sessions each get their own greedy tokens", async () => {
      const other = "import os\n";
      const wantOther = (await model.generate(other, { maxTokens: 4, stopAtEos: false })).tokens;
      const [a, b] = await Promise.all([model.generate(prompt, { maxTokens: N, stopAtEos: false }), model.generate(other, { maxTokens: 4, stopAtEos: false })]);
      expect(a.tokens).toEqual(want);
      expect(b.tokens).toEqual(wantOther);
    });
  });
}

test("Model.close() stops every running generation (reference and engine)", async () => {
  for (const backend of ["reference", BACKEND] as const) {
    const model = await Model.load(undefined, { backend });
    const tokens: number[] = [];
    const run = (async () => {
      for await (const c of model.stream(prompt, { maxTokens: 500, stopAtEos: false })) {
        tokens.push(c.token);
        if (tokens.length === 2) setTimeout(() => void model.close(), 0);
      }
    })();
    await expect(run).rejects.toBeInstanceOf(SessionClosedError);
    await expect(run).rejects.toThrow("the model was closed");
    expect(tokens.length).toBeLessThan(10);
    expect(() => model.session()).toThrow();
  }
});
