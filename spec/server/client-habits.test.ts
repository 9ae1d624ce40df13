// What clients expect of an OpenAI-compatible server beyond the happy path: a body without a
// Content-Type, JSON errors even for huge bodies, system_fingerprint, llama.cpp's timings.
import { describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { expectError, servedModel, startServer } from "./harness.ts";

const fx = servedModel();
const chat = "/v1/chat/completions";
const messages = [{ role: "user" as const, content: "Write a function" }];

describe("the request body", () => {
  test("a JSON body without a Content-Type is accepted (curl --data-binary, scripts)", async () => {
    const body = new TextEncoder().encode(JSON.stringify({ messages, max_tokens: 3 }));
    const res = await fetch(fx.server.url + chat, { method: "POST", body });
    expect(res.headers.get("content-type")).toContain("application/json");
    expect(res.status).toBe(200);
    const r = (await res.json()) as OpenAI.ChatCompletion;
    expect(r.choices[0]!.message.content).toBe((await fx.model.generate(messages, { maxTokens: 3 })).text);
  });

  test("without a Content-Type, a body that is not JSON is 400 and says the header is missing", async () => {
    const e = await expectError(await fetch(fx.server.url + chat, { method: "POST", body: new TextEncoder().encode("messages=hi") }), 400);
    expect(e.code).toBe("invalid_json");
    expect(e.message).toContain("no Content-Type");
  });

  test("a browser page (Origin header) still needs Content-Type: application/json", async () => {
    const body = new TextEncoder().encode(JSON.stringify({ messages, max_tokens: 3 }));
    const res = await fetch(fx.server.url + chat, { method: "POST", body, headers: { origin: "http://evil.example" } });
    expect((await expectError(res, 415)).message).toContain("browser page");
  });

  test("a 50 MB body gets a JSON 413, declared or chunked", async () => {
    const big = JSON.stringify({ messages: [{ role: "user", content: "x".repeat(50 << 20) }] });
    const e = await expectError(await fx.server.post(chat, big), 413);
    expect(e.code).toBe("body_too_large");
    expect(e.message).toContain(`${8 << 20} bytes`);
    const bytes = new TextEncoder().encode(big);
    let at = 0;
    const chunked = new ReadableStream<Uint8Array>({
      pull(c) {
        if (at >= bytes.length) return c.close();
        c.enqueue(bytes.subarray(at, (at += 1 << 20)));
      },
    });
    await expectError(await fetch(fx.server.url + chat, { method: "POST", headers: { "content-type": "application/json" }, body: chunked }), 413);
    // the server is fine afterwards
    expect((await fx.server.post(chat, { messages, max_tokens: 1 })).status).toBe(200);
  });
});

describe("system_fingerprint", () => {
  test("every chat and completion object carries the server's fingerprint, streamed or not", async () => {
    expect(fx.server.systemFingerprint).toMatch(/^fp_[0-9a-f]{12}$/);
    const a = await fx.client.chat.completions.create({ model: fx.server.modelId, messages, max_tokens: 2 });
    expect(a.system_fingerprint).toBe(fx.server.systemFingerprint);
    const stream = await fx.client.chat.completions.create({ model: fx.server.modelId, messages, max_tokens: 2, stream: true });
    for await (const c of stream) expect(c.system_fingerprint).toBe(fx.server.systemFingerprint);
    const b = await fx.client.completions.create({ model: fx.server.modelId, prompt: "def", max_tokens: 2 });
    expect(b.system_fingerprint).toBe(fx.server.systemFingerprint);
  });

  test("it changes with the serving configuration", async () => {
    const other = startServer(fx.model, { contextLength: 1024 });
    try {
      expect(other.systemFingerprint).not.toBe(fx.server.systemFingerprint);
    } finally {
      await other.stop();
    }
    const same = startServer(fx.model);
    try {
      expect(same.systemFingerprint).toBe(fx.server.systemFingerprint);
    } finally {
      await same.stop();
    }
  });
});

describe("timings", () => {
  test("under llama.cpp's names, consistent with usage", async () => {
    const res = await fx.server.post(chat, { messages, max_tokens: 5 });
    const r = (await res.json()) as { usage: OpenAI.CompletionUsage; timings: Record<string, number> };
    const t = r.timings;
    expect(Object.keys(t).sort()).toEqual(
      ["cache_n", "predicted_ms", "predicted_n", "predicted_per_second", "predicted_per_token_ms", "prompt_ms", "prompt_n", "prompt_per_second", "prompt_per_token_ms"].sort(),
    );
    expect(t.prompt_n).toBe(r.usage.prompt_tokens);
    expect(t.predicted_n).toBe(r.usage.completion_tokens);
    expect(t.predicted_per_token_ms).toBeCloseTo(t.predicted_ms! / t.predicted_n!, 6);
    expect(t.predicted_per_second).toBeCloseTo((1000 * t.predicted_n!) / t.predicted_ms!, 6);
    expect(t.prompt_per_second).toBeCloseTo((1000 * t.prompt_n!) / t.prompt_ms!, 6);
  });

  test("with drafts, the draft counts too (draft_n, draft_n_accepted)", async () => {
    const drafting = startServer(fx.model, { drafts: 2 });
    try {
      const r = (await (await drafting.post("/v1/completions", { prompt: "import os\n", max_tokens: 8 })).json()) as { timings: Record<string, number> };
      expect(r.timings.draft_n).toBeGreaterThan(0);
      expect(r.timings.draft_n_accepted).toBeGreaterThanOrEqual(0);
      expect(r.timings.draft_n_accepted).toBeLessThanOrEqual(r.timings.draft_n!);
    } finally {
      await drafting.stop();
    }
  });
});
