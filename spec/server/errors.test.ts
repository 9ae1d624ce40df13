// Malformed and refused requests through raw fetch: each gets OpenAI's error object, the right
// status, and a message that names the field.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Model } from "../../lib/index.ts";
import { expectError, loadModel, startServer, type TestServer } from "./harness.ts";

let model: Model;
let server: TestServer;
const chat = "/v1/chat/completions";
const messages = [{ role: "user", content: "hi" }];

beforeAll(async () => {
  model = await loadModel();
  server = startServer(model, { contextLength: 64, maxBodyBytes: 4096 });
});
afterAll(async () => {
  await server.stop();
  await model.close();
});

describe("the body", () => {
  test("invalid JSON is 400", async () => {
    const e = await expectError(await server.post(chat, '{"messages": ['), 400);
    expect(e.message).toContain("not valid JSON");
    expect(e.code).toBe("invalid_json");
  });

  test("a wrong content type is 415 and names the header", async () => {
    const res = await fetch(server.url + chat, { method: "POST", headers: { "content-type": "text/plain" }, body: JSON.stringify({ messages }) });
    const e = await expectError(res, 415);
    expect(e.message).toContain("Content-Type must be application/json");
    expect(e.message).toContain("text/plain");
  });

  test("a body that is not an object, or empty, is 400", async () => {
    expect((await expectError(await server.post(chat, "[1, 2]"), 400)).message).toContain("JSON object");
    expect((await expectError(await server.post(chat, ""), 400)).message).toContain("empty");
  });

  test("a body over the limit is 413, with a length header or chunked", async () => {
    const big = JSON.stringify({ messages: [{ role: "user", content: "x".repeat(5000) }] });
    expect((await expectError(await server.post(chat, big), 413)).message).toContain("4096 bytes");
    const chunked = new ReadableStream({
      start(c) {
        c.enqueue(new TextEncoder().encode(big));
        c.close();
      },
    });
    const res = await fetch(server.url + chat, { method: "POST", headers: { "content-type": "application/json" }, body: chunked });
    await expectError(res, 413);
  });
});

describe("fields", () => {
  const cases: [string, string, Record<string, unknown>, string, string][] = [
    // [what, path, body, param, message part]
    ["missing messages", chat, {}, "messages", "messages: is required"],
    ["empty messages", chat, { messages: [] }, "messages", "at least one message"],
    ["a bad role", chat, { messages: [{ role: "robot", content: "x" }] }, "messages[0].role", "must be one of"],
    ["missing content", chat, { messages: [{ role: "user" }] }, "messages[0].content", "messages[0].content: is required"],
    ["an image part", chat, { messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }, "messages[0].content[0].type", "image_url"],
    ["max_tokens 0", chat, { messages, max_tokens: 0 }, "max_tokens", "at least 1"],
    ["max_tokens 1.5", chat, { messages, max_tokens: 1.5 }, "max_tokens", "integer"],
    ["max_completion_tokens as text", chat, { messages, max_completion_tokens: "8" }, "max_completion_tokens", "expected number"],
    ["temperature out of range", chat, { messages, temperature: 200 }, "temperature", "[0, 100]"],
    ["top_p 0", chat, { messages, top_p: 0 }, "top_p", "(0, 1]"],
    ["top_k -2", chat, { messages, top_k: -2 }, "top_k", ">= -1"],
    ["a negative seed", chat, { messages, seed: -1 }, "seed", ">= 0"],
    ["n = 2", chat, { messages, n: 2 }, "n", "only n = 1"],
    ["a penalty out of range", chat, { messages, presence_penalty: 500 }, "presence_penalty", "[-100, 100]"],
    ["top_logprobs 21", chat, { messages, logprobs: true, top_logprobs: 21 }, "top_logprobs", "[0, 20]"],
    ["top_logprobs without logprobs", chat, { messages, top_logprobs: 2 }, "top_logprobs", "needs logprobs: true"],
    ["completions logprobs 6", "/v1/completions", { prompt: "x", logprobs: 6 }, "logprobs", "[0, 5]"],
    ["an empty stop string", chat, { messages, stop: [""] }, "stop", "must not be empty"],
    ["17 stop strings", chat, { messages, stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }, "stop", "stop: must hold at most 16 stop strings"],
    ["a stop number", chat, { messages, stop: 5 }, "stop", "stop: must be a string or an array of strings"],
    ["stream as text", chat, { messages, stream: "yes" }, "stream", "expected boolean"],
    ["missing prompt", "/v1/completions", {}, "prompt", "prompt: is required"],
    ["an empty prompt", "/v1/completions", { prompt: "" }, "prompt", "must not be empty"],
    ["a prompt of objects", "/v1/completions", { prompt: [{}] }, "prompt", "token ids"],
    ["a batch of prompts", "/v1/completions", { prompt: ["a", "b"] }, "prompt", "batched prompts"],
    ["a token outside the vocabulary", "/v1/completions", { prompt: [1, 2, 99999] }, "prompt", "token 99999 at [2] is outside the vocabulary"],
    ["a negative token", "/v1/completions", { prompt: [1, -2] }, "prompt[1]", ">= 0"],
    ["best_of 3", "/v1/completions", { prompt: "x", best_of: 3 }, "best_of", "best_of = 1"],
  ];
  for (const [what, path, body, param, part] of cases)
    test(`${what} -> 400 naming ${param}`, async () => {
      const e = await expectError(await server.post(path, body), 400);
      expect(e.param).toBe(param);
      expect(e.message.startsWith(param)).toBe(true);
      expect(e.message).toContain(part);
    });

  test("every wrong field is listed, the first is the param", async () => {
    const e = await expectError(await server.post(chat, { messages, temperature: -1, top_p: 1.5 }), 400);
    expect(e.param).toBe("temperature");
    expect(e.message).toContain("temperature:");
    expect(e.message).toContain("top_p:");
  });

  test("a model other than the loaded one is 404 model_not_found", async () => {
    const e = await expectError(await server.post(chat, { model: "gpt-4o", messages }), 404);
    expect(e.param).toBe("model");
    expect(e.code).toBe("model_not_found");
    expect(e.message).toContain("gpt-4o");
    await expectError(await server.get("/v1/models/gpt-4o"), 404);
  });
});

describe("the context", () => {
  test("a prompt as long as the context is 400 context_length_exceeded", async () => {
    const e = await expectError(await server.post("/v1/completions", { prompt: Array(64).fill(5) }), 400);
    expect(e.code).toBe("context_length_exceeded");
    expect(e.param).toBe("prompt");
    expect(e.message).toContain("64 tokens");
    const long = [{ role: "user", content: "def f(x):\n    return x\n".repeat(20) }];
    const c = await expectError(await server.post(chat, { messages: long }), 400);
    expect(c.param).toBe("messages");
    expect(c.code).toBe("context_length_exceeded");
  });

  test("max_tokens past the context is 400 naming max_tokens; without it the completion fits the context", async () => {
    const e = await expectError(await server.post("/v1/completions", { prompt: Array(60).fill(5), max_tokens: 5 }), 400);
    expect(e.param).toBe("max_tokens");
    expect(e.code).toBe("context_length_exceeded");
    const ok = await server.post("/v1/completions", { prompt: Array(60).fill(5) });
    expect(ok.status).toBe(200);
    const body = (await ok.json()) as { usage: { completion_tokens: number } };
    expect(body.usage.completion_tokens).toBeLessThanOrEqual(4);
  });
});

describe("routes", () => {
  test("an unknown route is 404", async () => {
    const e = await expectError(await server.get("/v1/embeddings"), 404);
    expect(e.message).toContain("/v1/embeddings");
  });

  test("a wrong method is 405 with Allow", async () => {
    const res = await server.get(chat);
    expect(res.headers.get("allow")).toBe("POST");
    expect((await expectError(res, 405)).message).toContain("GET is not allowed on /v1/chat/completions");
    const res2 = await server.post("/v1/models", {});
    expect(res2.headers.get("allow")).toBe("GET");
    await expectError(res2, 405);
  });

  test("a malformed percent escape in a model id is 400, not 500 (issue 22, item 10)", async () => {
    const e = await expectError(await server.get("/v1/models/%E0%A4%A"), 400);
    expect(e.code).toBe("invalid_path");
    expect(e.message).toContain("%E0%A4%A");
  });
});

describe("an API key", () => {
  test("is required on /v1/* when set, and /health stays open", async () => {
    const locked = startServer(model, { apiKey: "s3cret" });
    try {
      const e = await expectError(await locked.get("/v1/models"), 401);
      expect(e.code).toBe("invalid_api_key");
      await expectError(await locked.post("/v1/completions", { prompt: "x" }, { authorization: "Bearer wrong" }), 401);
      const ok = await fetch(locked.url + "/v1/models", { headers: { authorization: "Bearer s3cret" } });
      expect(ok.status).toBe(200);
      expect((await locked.get("/health")).status).toBe(200);
    } finally {
      await locked.stop();
    }
  });
});

describe("CORS", () => {
  test("off by default; with cors, preflight is 204 and responses allow any origin", async () => {
    expect((await server.get("/health")).headers.get("access-control-allow-origin")).toBeNull();
    const open = startServer(model, { cors: true });
    try {
      const pre = await fetch(open.url + "/v1/chat/completions", { method: "OPTIONS" });
      expect(pre.status).toBe(204);
      expect(pre.headers.get("access-control-allow-headers")).toContain("authorization");
      const res = await open.post("/v1/completions", { prompt: "x", max_tokens: 1 });
      expect(res.headers.get("access-control-allow-origin")).toBe("*");
      expect(res.status).toBe(200);
      const bad = await open.post("/v1/completions", {});
      expect(bad.headers.get("access-control-allow-origin")).toBe("*");
      await expectError(bad, 400);
    } finally {
      await open.stop();
    }
  });
});
