// `cherenkov serve`: the OpenAI-compatible HTTP server (lib/server) over one loaded model,
// until SIGINT or SIGTERM.
import { DEFAULT_MAX_TOKENS, type Model } from "../../api/model.ts";
import { defaultModelDir } from "../../model/default-model.ts";
import { createServer, type RunningServer } from "../../server/server.ts";
import { draftsFlag, intFlag, maxTokensFlag, parseFlags, stringFlag, UsageError, type FlagSpec } from "../args.ts";
import { ctxSizeFlag, loadModelFromFlags, MODEL_FLAGS, MODEL_FLAGS_USAGE, modelDir } from "../engine-flags.ts";
import type { CliIO } from "../io.ts";

export const serveUsage = `cherenkov serve [DIR] [options]
  OpenAI-compatible HTTP server (one request at a time, queued). DIR defaults to the
  embedded tiny model. Endpoints: /v1/chat/completions, /v1/completions, /v1/responses,
  /v1/models, /v1/stats, /health, and Ollama's /api/chat, /api/generate, /api/tags, /api/show
  (docs/server.md).
    --port N            TCP port (default 8080; 0 picks a free one)
    --host H            interface to listen on (default 127.0.0.1; 0.0.0.0 = every interface)
    --model-id NAME     the name clients pass as "model" (default: DIR's name)
    -n, --max-tokens N  completion tokens when a request sets none (default ${DEFAULT_MAX_TOKENS}), or
                        -1: up to the context (--n-predict)
    --max-queue N       requests that may wait; more get 503 (default 64)
    --api-key KEY       require "Authorization: Bearer KEY" on /v1/* (or set CHERENKOV_API_KEY)
    --cors              allow cross-origin requests from browsers
  -c/--ctx-size is also each request's limit (prompt + completion; default: the model's, else 4096).
${MODEL_FLAGS_USAGE}`;

/** Loads the model and starts the server; the caller stops it. */
/** serve's options (each shown with a description by `cherenkov help serve`). */
export const SERVE_FLAGS: FlagSpec = {
  port: { type: "string" },
  host: { type: "string" },
  "model-id": { type: "string" },
  "max-tokens": { type: "string", short: "n" },
  "max-queue": { type: "string" },
  "api-key": { type: "string" },
  cors: { type: "boolean" },
  ...MODEL_FLAGS,
};

export async function startServe(argv: string[], io: CliIO): Promise<{ server: RunningServer; model: Model }> {
  const { flags, positionals } = parseFlags(
    argv,
    SERVE_FLAGS,
    1,
  );
  const port = intFlag(flags, "port", 8080, 0, 65535);
  const hostname = stringFlag(flags, "host") ?? "127.0.0.1";
  if (hostname === "") throw new UsageError("--host: give an interface address or name");
  const contextFlag = ctxSizeFlag(flags);
  // -1: up to the context (the server never lets a request past it)
  const defaultMaxTokens = maxTokensFlag(flags, DEFAULT_MAX_TOKENS, 1 << 30) ?? 1 << 30;
  const drafts = draftsFlag(flags);
  const maxQueue = intFlag(flags, "max-queue", 64, 0, 1 << 20);
  const apiKey = stringFlag(flags, "api-key") ?? (process.env.CHERENKOV_API_KEY || undefined);
  const modelId = stringFlag(flags, "model-id");
  if (modelId === "") throw new UsageError("--model-id: must not be empty");

  const dir = modelDir(flags, positionals) ?? (await defaultModelDir());
  // the engine sizes its KV caches for the context asked for (--ctx-size)
  const model = await loadModelFromFlags(flags, dir, io);
  try {
    if (drafts !== "auto" && drafts > 0 && model.maxDrafts === 0) throw new UsageError(`--drafts: ${dir} has no MTP head`);
    let server: RunningServer;
    try {
      server = createServer({
        model, port, hostname, modelId, contextLength: contextFlag, defaultMaxTokens, drafts, maxQueue, apiKey,
        cors: Boolean(flags.cors),
        log: (line) => io.stderr(`${new Date().toISOString()} ${line}\n`),
      });
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "EADDRINUSE") throw new UsageError(`--port: ${port} is already in use on ${hostname}`);
      if (code === "EADDRNOTAVAIL" || code === "ENOTFOUND") throw new UsageError(`--host: cannot listen on "${hostname}"`);
      throw e;
    }
    io.stderr(
      `cherenkov serve: ${server.modelId} (${model.backendName} backend, context ${server.contextLength}) on ${server.url}/v1` +
        `${apiKey ? " (API key required)" : ""}\n`,
    );
    return { server, model };
  } catch (e) {
    await model.close();
    throw e;
  }
}

export async function serveCommand(argv: string[], io: CliIO): Promise<number> {
  const { server, model } = await startServe(argv, io);
  const signal = await new Promise<string>((resolve) => {
    process.once("SIGINT", () => resolve("SIGINT"));
    process.once("SIGTERM", () => resolve("SIGTERM"));
  });
  io.stderr(`cherenkov serve: ${signal}, stopping\n`);
  await server.stop();
  await model.close();
  return 0;
}
