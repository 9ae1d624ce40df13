// A real server on 127.0.0.1 with an ephemeral port over the embedded tiny model, and raw-fetch
// helpers for the tests that send what the OpenAI client never would.
import { afterAll, beforeAll, expect } from "bun:test";
import OpenAI from "openai";
import { Model } from "../../lib/index.ts";
import { createServer, type RunningServer, type ServerOptions } from "../../lib/server/server.ts";

export interface TestServer extends RunningServer {
  post(path: string, body: unknown, headers?: Record<string, string>): Promise<Response>;
  get(path: string): Promise<Response>;
}

export async function loadModel(): Promise<Model> {
  return Model.load(undefined, { backend: "reference" });
}

export function startServer(model: Model, opts: Omit<ServerOptions, "model"> = {}): TestServer {
  const server = createServer({ model, port: 0, hostname: "127.0.0.1", ...opts });
  return {
    ...server,
    post: (path, body, headers = {}) =>
      fetch(server.url + path, {
        method: "POST",
        headers: { "content-type": "application/json", ...headers },
        body: typeof body === "string" ? body : JSON.stringify(body),
      }),
    get: (path) => fetch(server.url + path),
  };
}

/** The official openai client pointed at `server` (no retries: a failure shows at once). */
export function clientFor(server: { url: string }): OpenAI {
  return new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "unused", maxRetries: 0 });
}

/**
 * A file's shared fixture: the tiny model on the reference backend, a server over it and an
 * openai client for that server, made in beforeAll and closed in afterAll. Read the fields
 * inside tests (they are set once beforeAll has run).
 */
export function servedModel(): { readonly model: Model; readonly server: TestServer; readonly client: OpenAI } {
  const f = {} as { model: Model; server: TestServer; client: OpenAI };
  beforeAll(async () => {
    f.model = await loadModel();
    f.server = startServer(f.model);
    f.client = clientFor(f.server);
  });
  afterAll(async () => {
    await f.server.stop();
    await f.model.close();
  });
  return f;
}

/** Checks OpenAI's error shape and status; returns the error object. */
export async function expectError(res: Response, status: number) {
  expect(res.status).toBe(status);
  expect(res.headers.get("content-type")).toContain("application/json");
  const body = (await res.json()) as { error: { message: string; type: string; param: string | null; code: string | null } };
  expect(Object.keys(body)).toEqual(["error"]);
  expect(typeof body.error.message).toBe("string");
  expect(body.error.type).toBe(status >= 500 ? "server_error" : "invalid_request_error");
  expect(body.error).toHaveProperty("param");
  expect(body.error).toHaveProperty("code");
  return body.error;
}

/** The data payloads of an SSE body, up to and including "[DONE]". */
export function sseEvents(text: string): string[] {
  return text
    .split("\n\n")
    .filter((e) => e.startsWith("data: "))
    .map((e) => e.slice("data: ".length));
}

/**
 * Polls `check` until it holds. The limit only turns a hang into a failure: it is far above
 * what any awaited state takes on a loaded machine, and no test may rely on it to pass.
 */
export async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 60_000): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!(await check())) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await Bun.sleep(5);
  }
}
