// One generation at a time: concurrent requests queue and both finish correctly; a client that
// disconnects aborts its own generation (running or waiting) and the next request is unharmed;
// /health and /v1/stats report what happened.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Model, ModelStats } from "../../lib/index.ts";
import { expectError, loadModel, sseEvents, startServer, waitFor, type TestServer } from "./harness.ts";

let model: Model;
let server: TestServer;
const messages = [{ role: "user", content: "Write a function" }];

interface Stats extends ModelStats {
  server: {
    requests: number;
    generations: { completed: number; aborted: number; failed: number };
    rejected: number;
    queue: { running: number; waiting: number };
  };
}

const stats = async () => (await (await server.get("/v1/stats")).json()) as Stats;
const health = async () => (await (await server.get("/health")).json()) as { status: string; queue: { running: number; waiting: number } };
const idle = async () => {
  const q = (await health()).queue;
  return q.running === 0 && q.waiting === 0;
};

beforeAll(async () => {
  model = await loadModel();
  server = startServer(model);
});
afterAll(async () => {
  await server.stop();
  await model.close();
});

/** Opens a chat stream of up to 2000 tokens (about 20 s of work) and reads its first events. */
async function openLongStream(signal?: AbortSignal) {
  const res = await fetch(server.url + "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ messages, max_tokens: 2000, stream: true }),
    signal,
  });
  expect(res.status).toBe(200);
  const reader = res.body!.getReader();
  let seen = "";
  while (sseEvents(seen).length < 3) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the stream ended early");
    seen += new TextDecoder().decode(value);
  }
  return reader;
}

describe("the queue", () => {
  test("two concurrent requests wait their turn and both get their own correct text", async () => {
    const chatBody = { messages, max_tokens: 12 };
    const complBody = { prompt: "import os\n", max_tokens: 12 };
    const expectChat = (await model.generate(messages, { maxTokens: 12 })).text;
    const expectCompl = (await model.generate("import os\n", { maxTokens: 12 })).text;
    // A long stream holds the device, so both requests are certainly waiting at once (no race
    // with how fast 12 tokens are on a loaded machine); cancelling it lets them run in turn.
    const holder = await openLongStream();
    const a = server.post("/v1/chat/completions", chatBody);
    const b = server.post("/v1/completions", complBody);
    await waitFor("both requests to wait behind the stream", async () => (await health()).queue.waiting === 2);
    await holder.cancel();
    const [ra, rb] = await Promise.all([a, b]);
    expect(ra.status).toBe(200);
    expect(rb.status).toBe(200);
    expect(((await ra.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content).toBe(expectChat);
    expect(((await rb.json()) as { choices: { text: string }[] }).choices[0]!.text).toBe(expectCompl);
  });
});

describe("a full queue", () => {
  test("refuses with 503 queue_full, streaming or not, while the device is busy", async () => {
    const own = startServer(model, { maxQueue: 0 });
    try {
      const running = await own.post("/v1/completions", { prompt: "import os\n", max_tokens: 2000, stream: true });
      const reader = running.body!.getReader();
      await reader.read();
      for (const stream of [false, true]) {
        const e = await expectError(await own.post("/v1/completions", { prompt: "x", max_tokens: 1, stream }), 503);
        expect(e.code).toBe("queue_full");
      }
      await reader.cancel();
      await waitFor("the device to be free", async () => (await (await own.get("/health")).json() as { queue: { running: number } }).queue.running === 0);
      expect((await own.post("/v1/completions", { prompt: "x", max_tokens: 1 })).status).toBe(200);
    } finally {
      await own.stop();
    }
  });
});

describe("client disconnects", () => {
  test("mid-stream: the generation stops at once, is not counted, and the next request works", async () => {
    await waitFor("the server to be idle", idle);
    const before = await stats();
    const abort = new AbortController();
    await openLongStream(abort.signal);
    abort.abort();
    // Counted as aborted (never completed), and no tokens of it reach the model's counters: it
    // stopped, rather than running its 2000 tokens out.
    await waitFor("the aborted generation to end", async () => (await stats()).server.generations.aborted === before.server.generations.aborted + 1);
    await waitFor("the server to be idle", idle);
    const after = await stats();
    expect(after.generations).toBe(before.generations); // the model counts finished generations only
    expect(after.completionTokens).toBe(before.completionTokens);

    const next = await server.post("/v1/chat/completions", { messages, max_tokens: 8 });
    expect(next.status).toBe(200);
    const body = (await next.json()) as { choices: { message: { content: string } }[] };
    expect(body.choices[0]!.message.content).toBe((await model.generate(messages, { maxTokens: 8 })).text);
  });

  test("while waiting in the queue: the request leaves the queue without running", async () => {
    await waitFor("the server to be idle", idle);
    const before = await stats();
    const first = await openLongStream();
    const waiterAbort = new AbortController();
    const waiter = fetch(server.url + "/v1/completions", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: "import os\n", max_tokens: 4 }),
      signal: waiterAbort.signal,
    }).catch((e: Error) => e.name);
    await waitFor("the second request to wait", async () => (await health()).queue.waiting === 1);
    waiterAbort.abort();
    expect(await waiter).toBe("AbortError");
    await waitFor("the waiting request to leave the queue", async () => (await health()).queue.waiting === 0);
    expect((await health()).queue.running).toBe(1); // the stream still runs
    await first.cancel();
    await waitFor("the server to be idle", idle);
    const after = await stats();
    expect(after.server.generations.aborted).toBe(before.server.generations.aborted + 2);
    expect(after.generations).toBe(before.generations);
  });
});

describe("status endpoints", () => {
  test("/v1/stats counts requests, generations and tokens; /health answers", async () => {
    await waitFor("the server to be idle", idle);
    const before = await stats();
    const r1 = (await (await server.post("/v1/completions", { prompt: "import os\n", max_tokens: 5 })).json()) as { usage: { prompt_tokens: number; completion_tokens: number } };
    const r2 = await server.post("/v1/chat/completions", { messages, max_tokens: 3, stream: true, stream_options: { include_usage: true } });
    const events = sseEvents(await r2.text());
    expect(events[events.length - 1]).toBe("[DONE]");
    const u2 = (JSON.parse(events[events.length - 2]!) as { usage: { prompt_tokens: number; completion_tokens: number } }).usage;
    await expectStatus(await server.post("/v1/completions", { prompt: "x", temperature: -2 }), 400);
    const after = await stats();
    expect(after.backend).toBe("reference");
    expect(after.generations).toBe(before.generations + 2);
    expect(after.promptTokens).toBe(before.promptTokens + r1.usage.prompt_tokens + u2.prompt_tokens);
    expect(after.completionTokens).toBe(before.completionTokens + 5 + 3);
    expect(after.server.generations.completed).toBe(before.server.generations.completed + 2);
    expect(after.server.rejected).toBe(before.server.rejected + 1);
    expect(after.server.requests).toBe(before.server.requests + 4); // three posts and this GET
    const h = await health();
    expect(h.status).toBe("ok");
    expect(h.queue).toEqual({ running: 0, waiting: 0 });
  });

  test("stop() aborts a running stream and refuses new connections", async () => {
    const own = startServer(model);
    const res = await own.post("/v1/completions", { prompt: "import os\n", max_tokens: 2000, stream: true });
    const reader = res.body!.getReader();
    await reader.read();
    const before = model.stats().completionTokens;
    await own.stop();
    expect(model.stats().completionTokens).toBe(before); // aborted: its 2000 tokens were not run out
    expect(await drain(reader)).toBe(true);
    expect(await fetch(own.url + "/health").then(() => "answered", () => "refused")).toBe("refused");
  });
});

async function expectStatus(res: Response, status: number) {
  expect(res.status).toBe(status);
  await res.arrayBuffer();
}

/** Reads a stream to its end (true when it ended). */
async function drain(reader: { read(): Promise<{ done?: boolean }> }): Promise<boolean> {
  for (;;) {
    const r = await reader.read().catch(() => ({ done: true }));
    if (r.done) return true;
  }
}
