// Prompt encoding for the server in a worker (encoder-worker.ts): tokenizing megabytes of text
// or rendering a chat template takes seconds of CPU, which on the event loop would stall
// /health, streams and every other request. The worker builds the tokenizer from the text the
// model loaded at start-up (TextTokenizer.source), so every restart encodes exactly as the
// model was loaded, whatever happened to the directory since.
//
// Jobs wait here, in this thread, and go to the worker one at a time. A job's time limit starts
// when the worker starts it; a job past it restarts the worker and fails alone (400), and the
// jobs behind it go on in the fresh worker. Prompts longer than the context could hold are
// refused before they are queued, and the queue has a length and a wait limit.
// A bundled app carries no worker file (lib/worker-file.ts): there the jobs run on the
// server's thread, so a huge prompt delays other requests while it is encoded, and only the
// chat template's own time limit applies.
import type { TemplateMessage, TextTokenizer, TokenizerSource } from "../model/tokenizer.ts";
import { workerFile } from "../worker-file.ts";
import { EncoderJobs } from "./encoder-jobs.ts";
import { ApiError } from "./errors.ts";

const WORKER_URL = workerFile("./encoder-worker.ts", import.meta.url);

export type EncoderRequest =
  | { id: number; kind: "load"; source: TokenizerSource }
  | { id: number; kind: "text"; text: string }
  | { id: number; kind: "chat"; messages: TemplateMessage[]; tools?: unknown[] };

export interface EncoderInfo {
  hasChatTemplate: boolean;
  /** The chat template renders OpenAI-style `tools` (it showed a probe tool's name). */
  tools: boolean;
}

export type EncoderReply =
  | { id: number; info: EncoderInfo }
  | { id: number; ids: Int32Array }
  | { id: number; error: { name: string; message: string; template: boolean } };

/** A request before it gets its id. */
type Message = EncoderRequest extends infer R ? (R extends { id: number } ? Omit<R, "id"> : never) : never;

export interface EncoderLimits {
  /** Longest a job may run in the worker, from when it starts (ms; default 60 s). */
  timeoutMs?: number;
  /** Longest building the tokenizer in a fresh worker may take (ms; default 60 s). */
  loadTimeoutMs?: number;
  /** Jobs that may wait for the worker; more get 503 (default 256). */
  maxWaiting?: number;
  /** Longest a job may wait for the worker before it starts (ms; default 120 s); then 503. */
  maxWaitMs?: number;
  /**
   * Prompt + completion tokens of a request: a text longer than this many tokens' worth of the
   * longest vocabulary piece is refused before it is tokenized (default: no bound).
   */
  contextLength?: number;
  /** The worker file (default: encoder-worker.ts beside this one); null runs the jobs on this thread. */
  workerUrl?: string | null;
}

interface Job {
  message: Message;
  param: string;
  resolve: (r: EncoderReply) => void;
  reject: (e: unknown) => void;
  /** The wait deadline, cleared when the job starts. */
  waitTimer: ReturnType<typeof setTimeout> | null;
}

interface Exchange {
  resolve: (r: EncoderReply) => void;
  reject: (e: unknown) => void;
}

/** Slack for normalizers that shorten text (NFC composing, whitespace folding) before it is split. */
const NORMALIZATION_SLACK = 2;

export class PromptEncoder {
  private worker: Worker | null = null;
  private ready: Promise<EncoderInfo> | null = null;
  private next = 1;
  private exchanges = new Map<number, Exchange>();
  private waiting: Job[] = [];
  private running = false;
  private closed = false;
  private readonly source: TokenizerSource;
  private readonly timeoutMs: number;
  private readonly loadTimeoutMs: number;
  private readonly maxWaiting: number;
  private readonly maxWaitMs: number;
  /** UTF-16 units a prompt may have before it is tokenized (Infinity: no bound). */
  readonly maxPromptUnits: number;
  /** The worker file; null runs the jobs on this thread (a bundled app). */
  private readonly url: string | null;
  /** The jobs on this thread, when there is no worker file. */
  private here: EncoderJobs | null = null;

  constructor(tokenizer: Pick<TextTokenizer, "source" | "longestPiece">, limits: EncoderLimits = {}) {
    this.source = tokenizer.source;
    this.timeoutMs = limits.timeoutMs ?? 60_000;
    this.loadTimeoutMs = limits.loadTimeoutMs ?? 60_000;
    this.maxWaiting = limits.maxWaiting ?? 256;
    this.maxWaitMs = limits.maxWaitMs ?? 120_000;
    this.maxPromptUnits = limits.contextLength === undefined ? Infinity : limits.contextLength * tokenizer.longestPiece * NORMALIZATION_SLACK;
    this.url = limits.workerUrl === undefined ? WORKER_URL : limits.workerUrl;
  }

  /** What the model's tokenizer offers (builds it in the worker on first use). */
  info(): Promise<EncoderInfo> {
    if (this.closed) return Promise.reject(stopping());
    return this.start();
  }

  /** Jobs waiting for the worker (the running one not counted). */
  get queued(): number {
    return this.waiting.length;
  }

  text(text: string, param: string): Promise<number[]> {
    this.checkLength(text.length, param);
    return this.enqueue({ kind: "text", text }, param);
  }

  /**
   * Chat messages through the template. The length bound counts what templates render whole
   * (every role but the assistant's, whose earlier reasoning some templates drop).
   */
  chat(messages: TemplateMessage[], tools: unknown[] | undefined, param: string): Promise<number[]> {
    let units = 0;
    for (const m of messages) if (m.role !== "assistant" && typeof m.content === "string") units += m.content.length;
    this.checkLength(units, param);
    return this.enqueue({ kind: "chat", messages, tools }, param);
  }

  close(): void {
    this.closed = true;
    for (const job of this.waiting.splice(0)) {
      if (job.waitTimer) clearTimeout(job.waitTimer);
      job.reject(stopping());
    }
    this.stopWorker(stopping());
  }

  private checkLength(units: number, param: string) {
    if (units > this.maxPromptUnits)
      throw new ApiError(
        400,
        `${param}: ${units} characters cannot fit this server's context (at most ${this.maxPromptUnits} characters: the context's tokens times the longest vocabulary piece, ${this.source.dir})`,
        param,
        "context_length_exceeded",
      );
  }

  private enqueue(message: Message, param: string): Promise<number[]> {
    if (this.closed) return Promise.reject(stopping());
    if (this.waiting.length >= this.maxWaiting)
      return Promise.reject(new ApiError(503, `the server is busy: ${this.waiting.length} prompts are waiting to be tokenized`, null, "queue_full"));
    return new Promise<EncoderReply>((resolve, reject) => {
      const job: Job = { message, param, resolve, reject, waitTimer: null };
      job.waitTimer = setTimeout(() => {
        const i = this.waiting.indexOf(job);
        if (i < 0) return;
        this.waiting.splice(i, 1);
        reject(new ApiError(503, `the server is busy: the prompt waited ${this.maxWaitMs / 1000} s to be tokenized`, null, "queue_timeout"));
      }, this.maxWaitMs);
      this.waiting.push(job);
      this.pump();
    }).then((r) => this.ids(r, param));
  }

  /** Starts the next waiting job when none runs. */
  private pump(): void {
    if (this.running || this.closed) return;
    const job = this.waiting.shift();
    if (!job) return;
    if (job.waitTimer) clearTimeout(job.waitTimer);
    this.running = true;
    this.run(job)
      .then(job.resolve, job.reject)
      .finally(() => {
        this.running = false;
        this.pump();
      });
  }

  private async run(job: Job): Promise<EncoderReply> {
    if (this.url === null) {
      await this.start();
      return this.here!.run({ ...job.message, id: this.next++ } as EncoderRequest);
    }
    await this.start();
    const timeoutMs = this.timeoutMs;
    return this.exchange(job.message, timeoutMs, () =>
      new ApiError(400, `${job.param}: the prompt took longer than ${timeoutMs / 1000} s to tokenize and render (the model's chat template or a huge prompt)`, job.param, "prompt_too_slow"),
    );
  }

  /** A worker with the tokenizer built (a fresh one after a restart). */
  private start(): Promise<EncoderInfo> {
    this.ready ??= (() => {
      if (this.url === null) {
        // No worker file: the jobs run here (built once, never restarted).
        this.here ??= new EncoderJobs();
        return this.here.run({ id: this.next++, kind: "load", source: this.source }).then((r) => {
          if ("error" in r) throw new ApiError(500, `the tokenizer of ${this.source.dir} does not build: ${r.error.message}`);
          return (r as { info: EncoderInfo }).info;
        });
      }
      const w = new Worker(this.url);
      w.onmessage = (e: MessageEvent<EncoderReply>) => {
        const x = this.exchanges.get(e.data.id);
        if (!x) return;
        this.exchanges.delete(e.data.id);
        x.resolve(e.data);
      };
      w.onerror = (e) => this.stopWorker(new ApiError(500, `the prompt encoder failed: ${e.message}`));
      w.unref();
      this.worker = w;
      // Building a tokenizer is bounded by the file caps, and by its own limit (not a job's).
      const ms = this.loadTimeoutMs;
      return this.exchange({ kind: "load", source: this.source }, ms, () => new ApiError(500, `building the tokenizer of ${this.source.dir} took longer than ${ms / 1000} s`)).then(
        (r) => {
          if ("error" in r) throw new ApiError(500, `the tokenizer of ${this.source.dir} does not build: ${r.error.message}`);
          return (r as { info: EncoderInfo }).info;
        },
      );
    })();
    // a failed start is not kept: the next job tries a fresh worker
    this.ready.catch(() => {});
    return this.ready;
  }

  /** Sends one message to the current worker; past `timeoutMs`, the worker is restarted and only this message fails. */
  private exchange(m: Message, timeoutMs: number, late: () => ApiError): Promise<EncoderReply> {
    const w = this.worker;
    if (!w) return Promise.reject(stopping());
    const id = this.next++;
    return new Promise<EncoderReply>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.exchanges.delete(id);
        reject(late());
        this.stopWorker(late());
      }, timeoutMs);
      const done = <T>(f: (v: T) => void) => (v: T) => {
        clearTimeout(timer);
        f(v);
      };
      this.exchanges.set(id, { resolve: done(resolve), reject: done(reject) });
      w.postMessage({ ...m, id });
    });
  }

  private ids(r: EncoderReply, param: string): number[] {
    if ("ids" in r) return Array.from(r.ids);
    if ("error" in r) {
      // A template that raises (roles out of order, a missing field) is the request's fault.
      if (r.error.template) throw new ApiError(400, `${param}: the chat template refused the messages: ${r.error.message}`, param, "invalid_messages");
      throw new ApiError(500, `tokenizing the prompt failed: ${r.error.message}`);
    }
    throw new Error("the encoder answered out of turn");
  }

  /** Ends the worker; what is in it fails with `why`; the next job starts a fresh worker. Waiting jobs are untouched. */
  private stopWorker(why: ApiError): void {
    this.worker?.terminate();
    this.worker = null;
    this.ready = null;
    for (const x of this.exchanges.values()) x.reject(why);
    this.exchanges.clear();
  }
}

function stopping(): ApiError {
  return new ApiError(503, "the server is stopping", null, "server_stopping");
}
