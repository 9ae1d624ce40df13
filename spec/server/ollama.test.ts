// Ollama's API (issue 21 item 10), through the `ollama` npm client as Open WebUI, Continue and
// LangChain's Ollama classes use it: /api/chat and /api/generate streamed (NDJSON) and not,
// /api/tags, /api/show. Answers are what the library generates for the same request.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { Ollama } from "ollama";

import type { Model } from "../../lib/index.ts";
import { loadModel, startServer, type TestServer } from "./harness.ts";

let model: Model;
let server: TestServer;
let ollama: Ollama;
let name = "";
beforeAll(async () => {
  model = await loadModel();
  server = startServer(model);
  ollama = new Ollama({ host: server.url });
  name = `${server.modelId}:latest`;
});
afterAll(async () => {
  await server.stop();
  await model.close();
});

const messages = [{ role: "user", content: "Write a function" }];

describe("the ollama client", () => {
  test("/api/tags lists the model; /api/show describes it", async () => {
    const tags = await ollama.list();
    expect(tags.models.map((m) => m.name)).toEqual([name]);
    expect(tags.models[0]!.size).toBeGreaterThan(1_000_000);
    expect(tags.models[0]!.details.family).toBe(model.config.architecture);
    const show = await ollama.show({ model: name });
    const info = show.model_info as unknown as Record<string, unknown>; // typed as a Map, sent (by Ollama too) as a JSON object
    expect(info[`${model.config.architecture}.context_length`]).toBe(server.contextLength);
    expect(show.capabilities).toContain("completion");
  });

  test("/api/chat: the answer the library gives, with counts; streamed, the same text in pieces", async () => {
    const want = await model.generate(messages as never, { maxTokens: 8 });
    const r = await ollama.chat({ model: name, messages, options: { num_predict: 8 } });
    expect(r.message).toMatchObject({ role: "assistant", content: want.text });
    expect(r.done).toBe(true);
    expect(r.done_reason).toBe(want.finishReason === "length" ? "length" : "stop");
    expect(r.eval_count).toBe(want.tokens.length);
    expect(r.prompt_eval_count).toBeGreaterThan(0);
    const pieces: string[] = [];
    let last: { done: boolean; eval_count?: number } | null = null;
    for await (const part of await ollama.chat({ model: name, messages, options: { num_predict: 8 }, stream: true })) {
      pieces.push(part.message.content);
      last = part;
    }
    expect(pieces.join("")).toBe(want.text);
    expect(pieces.length).toBeGreaterThan(2);
    expect(last).toMatchObject({ done: true, eval_count: want.tokens.length });
  }, 60_000);

  test("sampling options reach the model: a seeded answer is the library's seeded answer", async () => {
    const want = await model.generate(messages as never, { maxTokens: 6, temperature: 0.8, topP: 0.9, seed: 3 });
    const r = await ollama.chat({ model: name, messages, options: { num_predict: 6, temperature: 0.8, top_p: 0.9, seed: 3 } });
    expect(r.message.content).toBe(want.text);
  }, 60_000);

  test("/api/generate: the prompt through the chat template (with system), or raw; streamed and not", async () => {
    const chatWant = await model.generate([{ role: "system", content: "Be brief." }, { role: "user", content: "hi" }], { maxTokens: 5 });
    const g = await ollama.generate({ model: name, prompt: "hi", system: "Be brief.", options: { num_predict: 5 } });
    expect(g.response).toBe(chatWant.text);
    expect(g.done).toBe(true);
    const rawWant = await model.generate("def add(a, b):", { maxTokens: 5 });
    let text = "";
    for await (const part of await ollama.generate({ model: name, prompt: "def add(a, b):", raw: true, stream: true, options: { num_predict: 5 } })) text += part.response;
    expect(text).toBe(rawWant.text);
    const load = await ollama.generate({ model: name, prompt: "" });
    expect(load).toMatchObject({ response: "", done: true, done_reason: "load" });
  }, 60_000);

  test("errors are Ollama's {error}: an unknown model, an image, a bad option", async () => {
    await expect(ollama.chat({ model: "llama3:8b", messages })).rejects.toThrow('model "llama3:8b" not found');
    await expect(ollama.chat({ model: name, messages: [{ role: "user", content: "x", images: ["aGk="] }] })).rejects.toThrow("images are not supported");
    const res = await server.post("/api/chat", { model: name, messages, options: { temperature: -3 }, stream: false });
    expect(res.status).toBe(400);
    const body = (await res.json()) as Record<string, unknown>;
    expect(Object.keys(body)).toEqual(["error"]);
    expect(body.error).toContain("temperature");
  });

  test("without stream, /api/chat streams NDJSON as Ollama does by default", async () => {
    const res = await server.post("/api/chat", { model: name, messages, options: { num_predict: 3 } });
    expect(res.headers.get("content-type")).toContain("application/x-ndjson");
    const lines = (await res.text()).trim().split("\n").map((l) => JSON.parse(l) as { done: boolean });
    expect(lines.length).toBeGreaterThan(1);
    expect(lines.at(-1)!.done).toBe(true);
    expect(lines.slice(0, -1).every((l) => l.done === false)).toBe(true);
  });
});
