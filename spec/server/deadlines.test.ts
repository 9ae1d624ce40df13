// Request deadlines (docs/server.md): a body that arrives too slowly or never completes is cut
// off with 408 and its connection closed; a request that waits too long for the device leaves the queue with 503. The deadlines here are
// short so that the tests wait little; what they assert is the outcome, never a duration.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { Model } from "../../lib/index.ts";
import { expectError, loadModel, sseEvents, startServer, type TestServer } from "./harness.ts";

let model: Model;
let server: TestServer;
beforeAll(async () => {
  model = await loadModel();
  server = startServer(model, { bodyTimeoutMs: 300 });
});
afterAll(async () => {
  await server.stop();
  await model.close();
});

/** A raw TCP client: what it was sent back, and whether the server closed the connection. */
async function rawClient(port: number) {
  let text = "";
  let closed = false;
  let onChange = () => {};
  const socket = await Bun.connect({
    hostname: "127.0.0.1",
    port,
    socket: {
      data(_s, d) {
        text += new TextDecoder().decode(d);
        onChange();
      },
      close() {
        closed = true;
        onChange();
      },
      error() {
        closed = true;
        onChange();
      },
    },
  });
  return {
    write: (s: string) => socket.write(s),
    end: () => socket.end(),
    get text() {
      return text;
    },
    /** Resolves when the server has closed the connection (the test's own timeout bounds it). */
    closed: () =>
      new Promise<string>((resolve) => {
        const check = () => closed && resolve(text);
        onChange = check;
        check();
      }),
  };
}

const head = (length: number) => `POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n`;

describe("the body deadline", () => {
  test("a Content-Length larger than the body gets 408 and the connection closes", async () => {
    const c = await rawClient(server.port);
    c.write(head(100) + '{"prompt": "x"');
    const text = await c.closed();
    expect(text).toStartWith("HTTP/1.1 408");
    expect(text).toContain('"code":"body_timeout"');
    expect(text).toContain("14 bytes of the 100 declared");
  });

  test("a body sent a byte at a time, never finishing in time, gets 408", async () => {
    const c = await rawClient(server.port);
    c.write(head(1000));
    let closed = false;
    const done = c.closed().then((t) => ((closed = true), t));
    // a byte every 20 ms keeps the connection busy forever: the deadline is on the whole body
    while (!closed) {
      c.write(" ");
      await Promise.race([Bun.sleep(20), done]);
    }
    expect(await done).toStartWith("HTTP/1.1 408");
  });

  test("many idle POSTs do not starve /health, and each is answered 408", async () => {
    const clients = await Promise.all(Array.from({ length: 100 }, () => rawClient(server.port)));
    for (const c of clients) c.write(head(10));
    const health = await server.get("/health");
    expect(health.status).toBe(200);
    const answers = await Promise.all(clients.map((c) => c.closed()));
    expect(answers.filter((t) => t.startsWith("HTTP/1.1 408")).length).toBe(100);
  });

  test("a body in time is served as before", async () => {
    const res = await server.post("/v1/completions", { prompt: "x", max_tokens: 1 });
    expect(res.status).toBe(200);
  });
});

describe("bodies received at once", () => {
  test("past maxReceivingBodies, a new upload is refused at once with 503 and /health still answers", async () => {
    const own = startServer(model, { bodyTimeoutMs: 10_000, maxReceivingBodies: 5 });
    const clients = await Promise.all(Array.from({ length: 10 }, () => rawClient(own.port)));
    try {
      const refused: string[] = [];
      for (const c of clients) {
        c.write(head(100));
        void c.closed().then((t) => refused.push(t));
      }
      // five are held until their deadline; the other five are answered and closed at once
      while (refused.length < 5) await Bun.sleep(10);
      expect(refused.every((t) => t.startsWith("HTTP/1.1 503") && t.includes('"code":"too_many_uploads"'))).toBe(true);
      expect((await own.get("/health")).status).toBe(200);
    } finally {
      for (const c of clients) c.end();
      await own.stop();
    }
  });
});

describe("the queue deadline", () => {
  test("a request that waits longer than queueTimeoutMs for the device gets 503 queue_timeout", async () => {
    const own = startServer(model, { queueTimeoutMs: 200 });
    try {
      const running = await own.post("/v1/completions", { prompt: "import os\n", max_tokens: 2000, stream: true });
      const reader = running.body!.getReader();
      await reader.read();
      const e = await expectError(await own.post("/v1/completions", { prompt: "x", max_tokens: 1 }), 503);
      expect(e.code).toBe("queue_timeout");
      await reader.cancel();
    } finally {
      await own.stop();
    }
  });
});

describe("stopping (SIGTERM)", () => {
  test("an open stream ends with an error event and [DONE]; a request waiting for the device gets 503", async () => {
    const own = startServer(model);
    const res = await own.post("/v1/chat/completions", { messages: [{ role: "user", content: "Write a function" }], max_tokens: 2000, stream: true });
    const reader = res.body!.getReader();
    let text = new TextDecoder().decode((await reader.read()).value);
    const waiting = own.post("/v1/completions", { prompt: "x", max_tokens: 1 });
    await Bun.sleep(50); // let the second request reach the queue (either way it must not hang)
    await own.stop();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += new TextDecoder().decode(value);
    }
    const events = sseEvents(text);
    expect(events[events.length - 1]).toBe("[DONE]");
    const error = JSON.parse(events[events.length - 2]!) as { error: { code: string } };
    expect(error.error.code).toBe("server_stopping");
    const w = await waiting.catch((e) => e);
    // refused while waiting (503), or its connection closed as the server stopped: never a hang or a 200
    if (w instanceof Response) expect((await expectError(w, 503)).code).toBe("server_stopping");
    else expect(w).toBeInstanceOf(Error);
  });
});
