// Server scenarios under a seeded mix of hostile and ordinary clients (issue 22): slow bodies,
// bodies shorter than their Content-Length, megabyte prompts, malformed paths and a flood of
// ordinary requests past the queue's size, all at once. Every client must get an answer of the
// kind its request calls for (never a hang, a 500 or another client's text), and /health must
// answer during the flood. Bounded by size (a fixed number of clients with short deadlines);
// nothing asserts a duration.
import { afterAll, beforeAll, expect, test } from "bun:test";
import type { Model } from "../../lib/index.ts";
import { loadModel, startServer, type TestServer } from "../server/harness.ts";
import { Rng } from "./cases.ts";

const CLIENTS = 48;
let model: Model;
let server: TestServer;
let expected: string;
beforeAll(async () => {
  model = await loadModel();
  // The body deadline must be far above what an honest megabyte upload takes on a loaded
  // machine (at 400 ms a huge client's body was cut off at 223 KB beside a busy test run, a 408
  // where the test expects its 400): the dripping and short clients still meet it, just later.
  server = startServer(model, { bodyTimeoutMs: 2500, maxQueue: 6 });
  expected = (await model.generate("import os\n", { maxTokens: 3 })).text;
});
afterAll(async () => {
  await server.stop();
  await model.close();
});

/** Sends raw bytes, optionally dripping the rest; resolves with everything the server sent before it closed. */
async function raw(port: number, head: string, drip: boolean): Promise<string> {
  let text = "";
  let closed = false;
  let done = () => {};
  const ended = new Promise<void>((r) => (done = r));
  const socket = await Bun.connect({
    hostname: "127.0.0.1",
    port,
    socket: {
      data: (_s, d) => void (text += new TextDecoder().decode(d)),
      close: () => ((closed = true), done()),
      error: () => ((closed = true), done()),
    },
  });
  socket.write(head);
  while (drip && !closed) {
    socket.write(" ");
    await Promise.race([Bun.sleep(25), ended]);
  }
  await ended;
  return text;
}

const status = (httpText: string) => Number(/^HTTP\/1\.1 (\d{3})/.exec(httpText)?.[1] ?? 0);
const KINDS = ["ok", "ok", "ok", "drip", "short", "huge", "huge-chat", "bad-uri"] as const;

test(`${CLIENTS} mixed clients each get the answer their request calls for, and /health answers meanwhile`, async () => {
  const r = new Rng(2222);
  const huge = " ".repeat(1 << 20);
  const clients = Array.from({ length: CLIENTS }, () => r.pick(KINDS));
  const runs = clients.map(async (kind): Promise<{ kind: string; ok: boolean; detail: string }> => {
    switch (kind) {
      case "ok": {
        const res = await server.post("/v1/completions", { prompt: "import os\n", max_tokens: 3 });
        const body = (await res.json()) as { choices?: { text: string }[]; error?: { code: string } };
        // served with its own text, or refused because the queue was full
        const ok = res.status === 200 ? body.choices![0]!.text === expected : res.status === 503 && body.error!.code === "queue_full";
        return { kind, ok, detail: `${res.status} ${JSON.stringify(body).slice(0, 120)}` };
      }
      case "drip":
      case "short": {
        const head = `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${kind === "drip" ? 100000 : 100}\r\n\r\n{"prompt":`;
        const text = await raw(server.port, head, kind === "drip");
        return { kind, ok: status(text) === 408 && text.includes("body_timeout"), detail: text.slice(0, 120) };
      }
      case "huge":
      case "huge-chat": {
        const res =
          kind === "huge"
            ? await server.post("/v1/completions", { prompt: huge, max_tokens: 1 })
            : await server.post("/v1/chat/completions", { messages: [{ role: "user", content: huge }], max_tokens: 1 });
        const body = (await res.json()) as { error?: { code: string } };
        return { kind, ok: res.status === 400 && body.error?.code === "context_length_exceeded", detail: `${res.status} ${JSON.stringify(body).slice(0, 120)}` };
      }
      case "bad-uri": {
        const res = await server.get("/v1/models/%E0%A4%A");
        return { kind, ok: res.status === 400, detail: String(res.status) };
      }
    }
  });
  const health = await server.get("/health");
  expect(health.status).toBe(200);
  const results = await Promise.all(runs);
  const wrong = results.filter((x) => !x.ok);
  expect(wrong).toEqual([]);
  // the mix had every kind, and some ordinary requests were served
  expect(new Set(results.map((x) => x.kind)).size).toBe(new Set(KINDS).size);
  const served = await Promise.all([server.post("/v1/completions", { prompt: "import os\n", max_tokens: 3 })]);
  expect(served[0]!.status).toBe(200);
});
