// The request context: what the operator asks for, else what the model declares, never more
// than the backend holds; a prompt that cannot run is refused before any work.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Model } from "../../lib/index.ts";
import { DEFAULT_CONTEXT, declaredContextLength, resolveContextLength } from "../../lib/server/context.ts";
import { expectError, startServer, type TestServer } from "./harness.ts";
import { BACKEND } from "../selected-backend.ts";

/** Just what the context rules read of a model: its directory and the backend's limit. */
function fakeModel(dir: string, maxContext: number | null) {
  return { dir, backendName: maxContext === null ? "reference" : "cpu", maxContext };
}

describe("context length", () => {
  const dir = mkdtempSync(join(tmpdir(), "cherenkov-ctx-"));
  const declare = (v: unknown) => writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ model_max_length: v }));

  test("the model directory's model_max_length, unless it is Hugging Face's 'unknown'", () => {
    declare(2048);
    expect(declaredContextLength(dir)).toBe(2048);
    declare(1e30);
    expect(declaredContextLength(dir)).toBeNull();
    expect(declaredContextLength(join(dir, "missing"))).toBeNull();
    expect(resolveContextLength(fakeModel(dir, null), undefined)).toBe(DEFAULT_CONTEXT);
  });

  test("the engine's maxContext caps the declared length, and a larger request is refused", () => {
    declare(32768);
    const engine = fakeModel(dir, 1024);
    expect(resolveContextLength(engine, undefined)).toBe(1024);
    expect(resolveContextLength(engine, 512)).toBe(512);
    expect(() => resolveContextLength(engine, 2048)).toThrow("maxContext: 2048");
    expect(resolveContextLength(fakeModel(dir, null), undefined)).toBe(32768);
    rmSync(dir, { recursive: true, force: true });
  });
});

describe("a server over the engine with a small maxContext", () => {
  let model: Model;
  let server: TestServer;
  beforeAll(async () => {
    model = await Model.load(undefined, { backend: BACKEND, engine: { maxContext: 48 } });
    server = startServer(model);
  });
  afterAll(async () => {
    await server.stop();
    await model.close();
  });

  test("the model reports the engine's limit and the server takes it (not tokenizer_config's 4096)", () => {
    expect(model.maxContext).toBe(48);
    expect(declaredContextLength(model.dir)).toBe(4096);
    expect(server.contextLength).toBe(48);
  });

  test("a prompt longer than the engine holds is 400 before any work; the server stays usable", async () => {
    const prompt = Array.from({ length: 60 }, (_, i) => 100 + i);
    const before = model.stats();
    const e = await expectError(await server.post("/v1/completions", { prompt, max_tokens: 4 }), 400);
    expect(e.code).toBe("context_length_exceeded");
    expect(e.message).toContain("48");
    const chat = await expectError(await server.post("/v1/chat/completions", { messages: [{ role: "user", content: "x ".repeat(60) }] }), 400);
    expect(chat.code).toBe("context_length_exceeded");
    const after = model.stats();
    expect(after.promptTokens).toBe(before.promptTokens);
    expect("phases" in after.engine && after.engine.phases).toEqual("phases" in before.engine && before.engine.phases);
    // a prompt that fits, with no max_tokens: the completion is cut to what the engine holds
    const ok = await server.post("/v1/completions", { prompt: prompt.slice(0, 40) });
    expect(ok.status).toBe(200);
    const r = (await ok.json()) as { usage: { completion_tokens: number }; choices: { finish_reason: string }[] };
    expect(r.usage.completion_tokens).toBeLessThanOrEqual(8);
  });
});
