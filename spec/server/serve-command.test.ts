// `cherenkov serve` as the CLI starts it: flags reach the server, mistakes are usage errors.
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { UsageError } from "../../lib/cli/args.ts";
import type { CliIO } from "../../lib/cli/io.ts";
import { serveUsage, startServe } from "../../lib/cli/commands/serve.ts";

function bufferIO() {
  const err: string[] = [];
  const io: CliIO = { stdout: () => {}, stderr: (t) => void err.push(t), stderrIsTTY: false };
  return { io, err };
}

describe("cherenkov serve", () => {
  test("starts on a free port with the flags' model id, context, default max tokens and access log", async () => {
    const { io, err } = bufferIO();
    const { server, model } = await startServe(
      ["--port", "0", "--host", "127.0.0.1", "--backend", "reference", "--model-id", "tiny", "--ctx-size", "128", "--max-tokens", "4"],
      io,
    );
    try {
      expect(err.join("")).toContain(`tiny (reference backend, context 128) on ${server.url}/v1`);
      const models = (await (await fetch(server.url + "/v1/models")).json()) as { data: { id: string }[] };
      expect(models.data.map((m) => m.id)).toEqual(["tiny"]);
      const res = await fetch(server.url + "/v1/completions", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: "tiny", prompt: "import os\n" }),
      });
      const body = (await res.json()) as { usage: { completion_tokens: number }; choices: { finish_reason: string }[] };
      expect(body.usage.completion_tokens).toBe(4);
      expect(body.choices[0]!.finish_reason).toBe("length");
      const long = await fetch(server.url + "/v1/completions", {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ prompt: Array(128).fill(5) }),
      });
      expect(long.status).toBe(400);
      await long.arrayBuffer();
      expect(err.join("")).toMatch(/POST \/v1\/completions 200 \d+ms prompt=\d+ completion=4 finish=length/);
    } finally {
      await server.stop();
      await model.close();
    }
  });

  test("bad flags are usage errors that name the flag", async () => {
    const { io } = bufferIO();
    for (const [argv, flag] of [
      [["--port", "http"], "--port"],
      [["--port", "70000"], "--port"],
      [["--backend", "vulkan"], "--backend"],
      [["--ctx-size", "1"], "--ctx-size"],
      [["--nope"], "--nope"],
    ] as const) {
      const e = await startServe([...argv], io).then(() => null, (x: unknown) => x);
      expect(e).toBeInstanceOf(UsageError);
      expect((e as Error).message).toContain(flag);
    }
  });

  test("a port in use is a usage error naming --port", async () => {
    const { io } = bufferIO();
    const taken = Bun.serve({ port: 0, hostname: "127.0.0.1", fetch: () => new Response("") });
    try {
      const e = await startServe(["--port", String(taken.port), "--backend", "reference"], io).then(() => null, (x: unknown) => x);
      expect(e).toBeInstanceOf(UsageError);
      expect((e as Error).message).toContain(`--port: ${taken.port} is already in use`);
    } finally {
      await taken.stop(true);
    }
  });

  test("runs as a process until SIGINT, then stops cleanly with exit code 0", async () => {
    const p = Bun.spawn(["bun", "lib/cli/main.ts", "serve", "--port", "0", "--backend", "reference"], {
      cwd: join(import.meta.dir, "..", ".."),
      stdout: "pipe",
      stderr: "pipe",
    });
    const reader = p.stderr.getReader();
    let err = "";
    while (!/on (http:\/\/\S+)\/v1/.test(err)) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`serve exited early: ${err}`);
      err += new TextDecoder().decode(value);
    }
    const url = /on (http:\/\/\S+)\/v1/.exec(err)![1]!;
    expect(((await (await fetch(url + "/health")).json()) as { status: string }).status).toBe("ok");
    p.kill("SIGINT");
    expect(await p.exited).toBe(0);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      err += new TextDecoder().decode(value);
    }
    expect(err).toContain("SIGINT, stopping");
  }, 20_000);

  test("the usage text lists every flag the command parses", () => {
    for (const flag of ["--port", "--host", "--backend", "--model-id", "--ctx-size", "--max-tokens", "--drafts", "--prefill-chunk", "--max-queue", "--api-key", "--cors", "--pool", "--backing", "--no-lookahead"])
      expect(serveUsage).toContain(flag);
  });
});
