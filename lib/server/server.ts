// The OpenAI-compatible HTTP server on Bun.serve: /v1/chat/completions, /v1/completions,
// /v1/models, and the status endpoints /health and /v1/stats. Sampling as the library does it; requests
// run one at a time through a queue; a client that goes away aborts its own generation.
import { createHash, timingSafeEqual } from "node:crypto";
import { basename } from "node:path";
import { DEFAULT_MAX_TOKENS, type GenerationResult, type Model, type TokenLogprob } from "../api/model.ts";
import { readJsonBody } from "./body.ts";
import { resolveContextLength } from "./context.ts";
import { ApiError, isAbortError, toApiError } from "./errors.ts";
import { runGeneration } from "./generation.ts";
import { PromptCache } from "./prompt-cache.ts";
import pkg from "../../package.json";
import { loadedAnswer, ollamaAnswer, ollamaShow, ollamaStream, ollamaTags, prepareOllamaChat, prepareOllamaGenerate, type OllamaModelFacts } from "./ollama.ts";
import * as openai from "./openai.ts";
import { systemFingerprint } from "./fingerprint.ts";
import { PromptEncoder } from "./encoder.ts";
import { ToolCallSplitter } from "./tool-calls.ts";
import {
  functionCallItem,
  messageItem,
  outputItems,
  outputText,
  prepareResponse,
  responseHeadOf,
  responseItemId,
  responseLogprobs,
  responseObject,
  responseOutput,
  storeOutput,
} from "./responses.ts";
import { ItemStore } from "./item-store.ts";
import { GenerationQueue } from "./queue.ts";
import { checkModel, prepareChat, prepareCompletion, type Prepared, type RequestLimits } from "./prepare.ts";
import { SSE_DONE, SSE_HEADERS, sseData, sseEvent } from "./sse.ts";

export interface ServerOptions {
  /** The loaded model; the caller owns it (stop() does not close it). */
  model: Model;
  /** TCP port (default 8080); 0 picks a free one. */
  port?: number;
  /** Interface to listen on (default 127.0.0.1: this machine only). */
  hostname?: string;
  /** The name clients pass as `model` (default: the model directory's name). */
  modelId?: string;
  /**
   * Tokens of prompt + completion a request may use (default: tokenizer_config.json model_max_length,
   * else 4096; never more than the backend holds).
   */
  contextLength?: number;
  /** Completion tokens when a request sets no max_tokens (default DEFAULT_MAX_TOKENS, 256, as the API; never past the context). */
  defaultMaxTokens?: number;
  /** MTP drafts per step for every request (speculative decoding: same output, maybe faster). */
  drafts?: number | "auto";
  /** Output items of /v1/responses kept in memory for `item_reference` inputs (default 1024, least recently used dropped). */
  storedItems?: number;
  /** When set, /v1/* requests need `Authorization: Bearer <apiKey>`. */
  apiKey?: string;
  /** Requests that may wait for the device; more get 503 (default 64). */
  maxQueue?: number;
  /** Largest request body in bytes (default 8 MiB); larger ones get 413. */
  maxBodyBytes?: number;
  /** Time for a request's whole body to arrive (ms, default 30 s); later gets 408 and the connection closes. */
  bodyTimeoutMs?: number;
  /** Request bodies received at once (default 256); more are refused with 503 too_many_uploads. */
  maxReceivingBodies?: number;
  /** Longest a request may wait for the device before it starts (ms, default 300 s); then 503 queue_timeout. */
  queueTimeoutMs?: number;

  /** Answer browsers' cross-origin requests (Access-Control-Allow-Origin: *). */
  cors?: boolean;
  /** One line per request (method, path, status, time, tokens); silent when absent. */
  log?: (line: string) => void;
  /**
   * Start each request from the last one's checkpoints when they begin its prompt (a chat's
   * next turn prefills only what is new; the output is the same). Default true.
   */
  cachePrompt?: boolean;
}

export interface RunningServer {
  /** Base URL without a trailing slash, e.g. http://127.0.0.1:8080 (the OpenAI base URL is url + "/v1"). */
  url: string;
  port: number;
  modelId: string;
  contextLength: number;
  /** The system_fingerprint of every response (changes with cherenkov's version, backend, model, context). */
  systemFingerprint: string;
  /** Stops listening, aborts the running generation and refuses waiting requests. */
  stop(): Promise<void>;
}

interface Counters {
  requests: number;
  completed: number;
  aborted: number;
  failed: number;
  rejected: number;
}

/** The abort reason of generations the server stops (distinct from a client that disconnects). */
const STOPPING = new DOMException("the server is stopping", "AbortError");
const stoppingError = () => new ApiError(503, "the server is stopping", null, "server_stopping");
/** Longest stop() waits for answers being written before it closes connections (ms). */
const STOP_GRACE_MS = 2000;

export function createServer(opts: ServerOptions): RunningServer {
  const model = opts.model;
  const modelId = opts.modelId ?? basename(model.dir);
  const contextLength = resolveContextLength(model, opts.contextLength);
  const defaultMaxTokens = opts.defaultMaxTokens ?? DEFAULT_MAX_TOKENS;
  const drafts = opts.drafts ?? 0;
  if (drafts !== "auto" && drafts > 0 && model.maxDrafts === 0) throw new Error(`drafts: ${model.dir} has no MTP head (speculative decoding is unavailable)`);
  const maxBodyBytes = opts.maxBodyBytes ?? 8 << 20;
  const bodyLimits = { maxBytes: maxBodyBytes, timeoutMs: opts.bodyTimeoutMs, receiving: { count: 0, max: opts.maxReceivingBodies ?? 256 } };
  const log = opts.log ?? (() => {});
  const startedAt = Date.now();
  const created = Math.floor(startedAt / 1000);
  const queue = new GenerationQueue(opts.maxQueue ?? 64, opts.queueTimeoutMs ?? 300_000);
  const counters: Counters = { requests: 0, completed: 0, aborted: 0, failed: 0, rejected: 0 };
  /** Generations in flight or waiting, so that stop() can abort them and wait for them to unwind. */
  const inFlight = new Map<AbortController, Promise<unknown>>();
  /** Streams whose last event is not yet written, so that stop() lets them end before closing connections. */
  const openStreams = new Set<Promise<void>>();
  const keyDigest = opts.apiKey === undefined ? null : digest(opts.apiKey);

  const corsHeaders: Record<string, string> = opts.cors
    ? {
        "access-control-allow-origin": "*",
        "access-control-allow-methods": "GET, POST, OPTIONS",
        "access-control-allow-headers": "authorization, content-type",
      }
    : {};

  const json = (body: unknown, status = 200, headers: Record<string, string> = {}) =>
    Response.json(body, { status, headers: { ...corsHeaders, ...headers } });

  const errorResponse = (e: ApiError) => json(e.toBody(), e.status, e.headers);

  /** Output items of recent /v1/responses answers, for item_reference. */
  const items = new ItemStore(opts.storedItems ?? 1024);
  const fingerprint = systemFingerprint(model, { contextLength, drafts });
  const encoder = model.tokenizer ? new PromptEncoder(model.tokenizer, { contextLength }) : null;
  const promptCache = opts.cachePrompt === false ? undefined : new PromptCache(model);
  const limits: RequestLimits = { model, modelId, contextLength, defaultMaxTokens, encoder };

  /** Starts a generation in the queue; `abort` cancels it whether it waits or runs. */
  function startGeneration(job: Prepared, abort: AbortController, onText?: (t: string, lps: TokenLogprob[]) => void): Promise<GenerationResult> {
    const done = queue.run(abort.signal, () =>
      runGeneration(model, { prompt: job.prompt, maxTokens: job.maxTokens, stop: job.stop, drafts, signal: abort.signal, sampling: job.sampling, onText }, promptCache),
    );
    const settled = done.then(
      () => void counters.completed++,
      (e) => {
        if (isAbortError(e) || abort.signal.aborted) counters.aborted++;
        else if (!(e instanceof ApiError)) counters.failed++; // an ApiError is a refusal (queue full, stopping)
      },
    );
    inFlight.set(abort, settled);
    void settled.finally(() => inFlight.delete(abort));
    return done;
  }

  /** The request's signal aborts the generation when the client disconnects. */
  function abortOnDisconnect(req: Request): AbortController {
    const abort = new AbortController();
    req.signal.addEventListener("abort", () => abort.abort(new DOMException("the client disconnected", "AbortError")), { once: true });
    return abort;
  }

  async function complete(req: Request, job: Prepared, respond: (r: GenerationResult) => unknown, tag: string, t0: number) {
    const abort = abortOnDisconnect(req);
    const result = await startGeneration(job, abort);
    log(`${tag} 200 ${ms(t0)} prompt=${result.usage.promptTokens} completion=${result.usage.completionTokens} finish=${result.finishReason}`);
    return json(respond(result));
  }

  /** An SSE response: `first` before any text, `piece` per text, `last` and `usage` after the result. */
  function streamGeneration(
    req: Request,
    job: Prepared,
    shape: {
      /** Events before any text: one or several. */
      first?: unknown;
      /** The events for one piece of text: one, several, or null for none. */
      piece: (text: string, logprobs: TokenLogprob[]) => unknown;
      /** The events after the text: one or several. */
      last: (r: GenerationResult) => unknown | unknown[];
      /** With stream_options.include_usage. */
      usage?: (r: GenerationResult) => unknown;
      /** An error after the stream started (default: the error object). */
      error?: (e: ApiError) => unknown;
      /** Event encoding (default `data: {json}`) and whether `data: [DONE]` ends the stream (default yes). */
      encode?: (event: unknown) => Uint8Array;
      done?: boolean;
      /** Response headers (default: server-sent events'). */
      headers?: Record<string, string>;
    },
    tag: string,
    t0: number,
  ): Response {
    // Refuse with a real status while we still can: once the stream starts it is 200.
    queue.checkRoom();
    const abort = abortOnDisconnect(req);
    let open = true;
    let endStream = () => {};
    const ended: Promise<void> = new Promise((resolve) => {
      endStream = () => {
        openStreams.delete(ended);
        resolve();
      };
    });
    openStreams.add(ended);
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        const encode = shape.encode ?? sseData;
        const send = (chunk: Uint8Array) => {
          if (open) controller.enqueue(chunk);
        };
        const sendAll = (events: unknown) => {
          for (const event of Array.isArray(events) ? events : [events]) send(encode(event));
        };
        if (shape.first !== undefined) sendAll(shape.first);
        startGeneration(job, abort, (text, lps) => {
          const events = shape.piece(text, lps);
          if (events !== null) sendAll(events);
        })
          .then((r) => {
            sendAll(shape.last(r));
            if (job.includeUsage && shape.usage) send(encode(shape.usage(r)));
            if (shape.done !== false) send(SSE_DONE);
            log(`${tag} 200 ${ms(t0)} stream prompt=${r.usage.promptTokens} completion=${r.usage.completionTokens} finish=${r.finishReason}`);
          })
          .catch((e) => {
            if (abort.signal.aborted && abort.signal.reason !== STOPPING) {
              log(`${tag} aborted ${ms(t0)} stream (client disconnected)`);
              return;
            }
            // a failure, or the server stopping: the client reads why, then the end of the stream
            const err = abort.signal.reason === STOPPING ? stoppingError() : toApiError(e);
            log(`${tag} ${err.status} ${ms(t0)} stream ${err.message}`);
            send(encode(shape.error ? shape.error(err) : err.toBody()));
            if (abort.signal.reason === STOPPING && shape.done !== false) send(SSE_DONE);
          })
          .finally(() => {
            if (open) controller.close();
            open = false;
            endStream();
          });
      },
      cancel() {
        open = false;
        abort.abort(new DOMException("the client disconnected", "AbortError"));
      },
    });
    return new Response(body, { headers: { ...corsHeaders, ...(shape.headers ?? SSE_HEADERS) } });
  }

  async function chatCompletions(req: Request, tag: string, t0: number): Promise<Response> {
    const job = await prepareChat(limits, await readJsonBody(req, bodyLimits));
    const head = openai.responseHead("chatcmpl", modelId, fingerprint);
    if (!job.stream) return complete(req, job, (r) => openai.chatCompletion(head, r, job.tools), tag, t0);
    // with tools, text that may be a call waits for the end, where it is parsed
    const splitter = job.tools ? new ToolCallSplitter() : null;
    return streamGeneration(
      req,
      job,
      {
        first: openai.chatChunk(head, { role: "assistant", content: "" }, null),
        piece: (text, lps) => {
          const content = splitter ? splitter.push(text) : text;
          return content === "" && lps.length === 0 ? null : openai.chatChunk(head, { content }, null, lps);
        },
        last: (r) => {
          const events: unknown[] = [];
          const end = splitter?.finish() ?? { content: "", calls: [] };
          if (end.content !== "") events.push(openai.chatChunk(head, { content: end.content }, null));
          if (end.calls.length > 0) events.push(openai.chatChunk(head, { tool_calls: openai.toolCallEntries(end.calls, true) }, null));
          events.push(openai.chatChunk(head, {}, end.calls.length > 0 ? "tool_calls" : openai.finishReason(r.finishReason)));
          return events;
        },
        usage: (r) => openai.chatUsageChunk(head, r),
      },
      tag,
      t0,
    );
  }

  async function completions(req: Request, tag: string, t0: number): Promise<Response> {
    const job = await prepareCompletion(limits, await readJsonBody(req, bodyLimits));
    const head = openai.responseHead("cmpl", modelId, fingerprint);
    if (!job.stream) return complete(req, job, (r) => openai.textCompletion(head, job.echo, r), tag, t0);
    let offset = job.echo.length;
    return streamGeneration(
      req,
      job,
      {
        first: job.echo !== "" ? openai.textChunk(head, job.echo, null) : undefined,
        piece: (text, lps) => {
          const logprobs = lps.length > 0 ? openai.completionLogprobs(lps, offset) : null;
          offset += text.length;
          return openai.textChunk(head, text, null, logprobs);
        },
        last: (r) => openai.textChunk(head, "", openai.finishReason(r.finishReason)),
        usage: (r) => openai.textUsageChunk(head, r),
      },
      tag,
      t0,
    );
  }

  async function responses(req: Request, tag: string, t0: number): Promise<Response> {
    const job = await prepareResponse(limits, await readJsonBody(req, bodyLimits), items);
    const head = responseHeadOf(modelId);
    const messageId = responseItemId("msg");
    const finished = (r: GenerationResult) => {
      const out = responseOutput(r, job.tools, messageId);
      storeOutput(items, job.req, out);
      const status = openai.finishReason(r.finishReason) === "length" ? "incomplete" : "completed";
      return { out, status, response: responseObject(head, job.req, r, outputItems(out, status)) } as const;
    };
    if (!job.stream) return complete(req, job, (r) => finished(r).response, tag, t0);
    // Events as OpenAI streams them: each with its type as the SSE event name and a sequence number.
    let seq = 0;
    const ev = (type: string, body: Record<string, unknown>) => ({ type, sequence_number: seq++, ...body });
    const splitter = job.tools ? new ToolCallSplitter() : null;
    let text = "";
    let opened = false;
    const at = { item_id: messageId, output_index: 0, content_index: 0 };
    const openMessage = () => {
      if (opened) return [];
      opened = true;
      return [
        ev("response.output_item.added", { output_index: 0, item: messageItem(messageId, "", "in_progress") }),
        ev("response.content_part.added", { ...at, part: outputText("") }),
      ];
    };
    const delta = (piece: string, lps: TokenLogprob[]) => {
      text += piece;
      return [...openMessage(), ev("response.output_text.delta", { ...at, delta: piece, logprobs: responseLogprobs(lps) })];
    };
    const inProgress = responseObject(head, job.req, null, []);
    return streamGeneration(
      req,
      job,
      {
        first: [ev("response.created", { response: inProgress }), ev("response.in_progress", { response: inProgress })],
        piece: (piece, lps) => {
          const content = splitter ? splitter.push(piece) : piece;
          return content === "" && lps.length === 0 ? null : delta(content, lps);
        },
        last: (r) => {
          const events: unknown[] = [];
          const end = splitter?.finish() ?? { content: "", calls: [] };
          if (end.content !== "") events.push(...delta(end.content, []));
          const { out, status, response } = finished(r);
          // the message item is there when text came, or when nothing else did
          if (opened || out.calls.length === 0) {
            events.push(...openMessage());
            const part = outputText(text, out.logprobs);
            events.push(ev("response.output_text.done", { ...at, text, logprobs: part.logprobs }));
            events.push(ev("response.content_part.done", { ...at, part }));
            events.push(ev("response.output_item.done", { output_index: 0, item: messageItem(messageId, text, status, out.logprobs) }));
          }
          const base = opened ? 1 : 0;
          out.calls.forEach((c, i) => {
            const item = functionCallItem(c);
            events.push(ev("response.output_item.added", { output_index: base + i, item: { ...item, arguments: "", status: "in_progress" } }));
            events.push(ev("response.function_call_arguments.delta", { item_id: c.itemId, output_index: base + i, delta: c.arguments }));
            events.push(ev("response.function_call_arguments.done", { item_id: c.itemId, output_index: base + i, name: c.name, arguments: c.arguments }));
            events.push(ev("response.output_item.done", { output_index: base + i, item }));
          });
          events.push(ev(status === "completed" ? "response.completed" : "response.incomplete", { response }));
          return events;
        },
        error: (e) => ev("error", { code: e.code, message: e.message, param: e.param }),
        encode: (event) => sseEvent((event as { type: string }).type, event),
        done: false,
      },
      tag,
      t0,
    );
  }

  function stats() {
    return {
      ...model.stats(),
      server: {
        model: modelId,
        uptime_s: (Date.now() - startedAt) / 1000,
        context_length: contextLength,
        requests: counters.requests,
        generations: { completed: counters.completed, aborted: counters.aborted, failed: counters.failed },
        rejected: counters.rejected,
        queue: { running: queue.running, waiting: queue.waiting },
      },
    };
  }

  /** Ollama's /api/chat and /api/generate: one answer, or NDJSON lines with stream (its default). */
  async function ollamaGeneration(req: Request, tag: string, t0: number, prepare: typeof prepareOllamaChat | typeof prepareOllamaGenerate): Promise<Response> {
    const o = await prepare(limits, await readJsonBody(req, maxBodyBytes));
    if ("load" in o) return json(loadedAnswer(o.model));
    if (!o.stream) return complete(req, o.job, (r) => ollamaAnswer(o, r, performance.now() - t0), tag, t0);
    return streamGeneration(req, { ...o.job, includeUsage: false }, ollamaStream(o, t0), tag, t0);
  }

  const ollamaFacts = (): OllamaModelFacts => ({
    modelId,
    dir: model.dir,
    architecture: model.config.architecture,
    contextLength,
    hiddenSize: model.config.hidden_size,
    layers: model.config.num_layers,
    digest: createHash("sha256").update(fingerprint).digest("hex"),
    tools: false,
  });

  type Handler = (req: Request, tag: string, t0: number) => Response | Promise<Response>;
  const routes: Record<string, Partial<Record<string, Handler>>> = {
    "/health": { GET: () => json({ status: "ok", model: modelId, backend: model.backendName, queue: { running: queue.running, waiting: queue.waiting } }) },
    "/v1/models": { GET: () => json({ object: "list", data: [openai.modelObject(modelId, created)] }) },
    "/v1/chat/completions": { POST: chatCompletions },
    "/v1/completions": { POST: completions },
    "/v1/responses": { POST: responses },
    "/v1/stats": { GET: () => json(stats()) },
    "/api/chat": { POST: (req, tag, t0) => ollamaGeneration(req, tag, t0, prepareOllamaChat) },
    "/api/generate": { POST: (req, tag, t0) => ollamaGeneration(req, tag, t0, prepareOllamaGenerate) },
    "/api/tags": { GET: () => json(ollamaTags(ollamaFacts())) },
    "/api/show": {
      POST: async (req) => {
        const facts = { ...ollamaFacts(), tools: encoder ? (await encoder.info()).tools : false };
        return json(ollamaShow(facts, await readJsonBody(req, maxBodyBytes)));
      },
    },
    "/api/version": { GET: () => json({ version: pkg.version }) },
  };

  function authorized(req: Request): boolean {
    if (keyDigest === null) return true;
    const m = /^Bearer\s+(.+)$/i.exec(req.headers.get("authorization") ?? "");
    return m !== null && timingSafeEqual(digest(m[1]!.trim()), keyDigest);
  }

  async function handle(req: Request, server: Bun.Server<unknown>): Promise<Response> {
    const t0 = performance.now();
    const path = new URL(req.url).pathname;
    const tag = `${req.method} ${path}`;
    counters.requests++;
    try {
      if (req.method === "OPTIONS" && opts.cors) return new Response(null, { status: 204, headers: corsHeaders });
      if ((path.startsWith("/v1/") || path.startsWith("/api/")) && !authorized(req))
        throw new ApiError(401, "missing or wrong API key: send Authorization: Bearer <key>", null, "invalid_api_key");
      let route = routes[path];
      if (!route && path.startsWith("/v1/models/")) {
        const id = decodePathPart(path.slice("/v1/models/".length));
        route = { GET: () => (checkModel(limits, id), json(openai.modelObject(modelId, created))) };
      }
      if (!route)
        throw new ApiError(404, `no route ${path} (see /v1/models, /v1/chat/completions, /v1/completions, /v1/responses, /v1/stats, /health; Ollama's /api/chat, /api/generate, /api/tags, /api/show)`, null, "not_found");
      const handler = route[req.method];
      if (!handler) {
        const allow = Object.keys(route).join(", ");
        throw new ApiError(405, `${req.method} is not allowed on ${path} (use ${allow})`, null, "method_not_allowed", undefined, { allow });
      }
      // Generations may wait in the queue or think for long: no idle timeout for them. The body
      // has its own deadline (readJsonBody) and the queue wait its own (GenerationQueue).
      if (req.method === "POST") server.timeout(req, 0);
      const res = await handler(req, tag, t0);
      if (req.method === "GET") log(`${tag} ${res.status} ${ms(t0)}`);
      return res;
    } catch (e) {
      const err = e === STOPPING ? stoppingError() : toApiError(e);
      if ((isAbortError(e) && e !== STOPPING) || req.signal.aborted) {
        log(`${tag} aborted ${ms(t0)} (client disconnected)`);
        return new Response(null, { status: 499 });
      }
      if (err.status !== 500) counters.rejected++; // refused, as opposed to failed while generating
      log(`${tag} ${err.status} ${ms(t0)} ${err.message}`);
      // Ollama's clients read {"error": "..."}
      if (path.startsWith("/api/")) return json({ error: err.message }, err.status, err.headers);
      return errorResponse(err);
    }
  }

  const server = Bun.serve({
    port: opts.port ?? 8080,
    hostname: opts.hostname ?? "127.0.0.1",
    // Bun's own limit answers with a bare 413 before the handler runs: it is lifted, so every
    // body, declared or chunked, meets readJsonBody's limit and gets a JSON error.
    maxRequestBodySize: Number.MAX_SAFE_INTEGER,
    development: false,
    fetch: handle,
    error: (e) => errorResponse(toApiError(e)),
  });

  const port = server.port ?? 0;
  const url = `http://${server.hostname?.includes(":") ? `[${server.hostname}]` : server.hostname}:${port}`;
  return {
    url,
    port,
    modelId,
    contextLength,
    systemFingerprint: fingerprint,
    async stop() {
      queue.rejectWaiting(stoppingError());
      for (const abort of inFlight.keys()) abort.abort(STOPPING);
      await Promise.allSettled(inFlight.values());
      encoder?.close();
      // open streams end with an error event (and [DONE]); the answers are written before the
      // connections close: a graceful stop, bounded so a stalled client cannot hold it
      await Promise.allSettled(openStreams);
      await Promise.race([server.stop(false), Bun.sleep(STOP_GRACE_MS)]);
      await server.stop(true);
    },
  };
}

/** A percent-encoded path segment; a malformed escape (%E0%A4%A) is the client's error, 400. */
function decodePathPart(part: string): string {
  try {
    return decodeURIComponent(part);
  } catch {
    throw new ApiError(400, `the path segment ${JSON.stringify(part)} is not valid percent-encoded UTF-8`, null, "invalid_path");
  }
}

function digest(s: string): Buffer {
  return createHash("sha256").update(s).digest();
}

function ms(t0: number): string {
  return `${Math.round(performance.now() - t0)}ms`;
}
