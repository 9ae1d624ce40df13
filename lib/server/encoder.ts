// Prompt encoding for the server in a worker (encoder-worker.ts): tokenizing megabytes of text
// or rendering a chat template takes seconds of CPU, which on the event loop would stall
// /health, streams and every other request. One job at a time runs in the worker; a job that
// passes the time limit restarts the worker and fails with 400. A bundled app carries no
// worker file (lib/worker-file.ts): there the jobs run on the server's thread, so a huge
// prompt delays other requests while it is encoded, and only the chat template's own time
// limit applies.
import type { TemplateMessage } from "../model/tokenizer.ts";
import { workerFile } from "../worker-file.ts";
import { EncoderJobs } from "./encoder-jobs.ts";
import { ApiError } from "./errors.ts";

const WORKER_URL = workerFile("./encoder-worker.ts", import.meta.url);

export type EncoderRequest =
  | { id: number; kind: "load"; dir: string }
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

interface Pending {
  resolve: (v: EncoderReply) => void;
  reject: (e: unknown) => void;
  timer: ReturnType<typeof setTimeout> | null;
}

/** A request before it gets its id. */
type Job = EncoderRequest extends infer R ? (R extends { id: number } ? Omit<R, "id"> : never) : never;

export class PromptEncoder {
  private worker: Worker | null = null;
  private next = 1;
  private pending = new Map<number, Pending>();
  private loaded: Promise<EncoderInfo> | null = null;
  private closed = false;
  /** The jobs on this thread, when there is no worker file. */
  private here: EncoderJobs | null = null;

  constructor(
    private readonly dir: string,
    /** Longest a job may run before the worker is restarted (ms). */
    private readonly timeoutMs = 60_000,
    /** The worker file; null runs the jobs on this thread. */
    private readonly url: string | null = WORKER_URL,
  ) {}

  /** What the model's tokenizer offers (loads it in the worker on first use). */
  info(): Promise<EncoderInfo> {
    this.loaded ??= this.send({ kind: "load", dir: this.dir }, null).then((r) => {
      if ("error" in r) throw new Error(`the tokenizer of ${this.dir} does not load: ${r.error.message}`);
      return (r as { info: EncoderInfo }).info;
    });
    return this.loaded;
  }

  async text(text: string, param: string): Promise<number[]> {
    await this.info();
    return this.ids(await this.send({ kind: "text", text }, this.timeoutMs), param);
  }

  async chat(messages: TemplateMessage[], tools: unknown[] | undefined, param: string): Promise<number[]> {
    await this.info();
    return this.ids(await this.send({ kind: "chat", messages, tools }, this.timeoutMs), param);
  }

  close(): void {
    this.closed = true;
    this.stopWorker(new ApiError(503, "the server is stopping", null, "server_stopping"));
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

  private start(url: string): Worker {
    const w = new Worker(url);
    w.onmessage = (e: MessageEvent<EncoderReply>) => {
      const p = this.pending.get(e.data.id);
      if (!p) return;
      this.pending.delete(e.data.id);
      if (p.timer) clearTimeout(p.timer);
      p.resolve(e.data);
    };
    w.onerror = (e) => this.stopWorker(new ApiError(500, `the prompt encoder failed: ${e.message}`));
    w.unref();
    return w;
  }

  private send(m: Job, timeoutMs: number | null): Promise<EncoderReply> {
    if (this.closed) return Promise.reject(new ApiError(503, "the server is stopping", null, "server_stopping"));
    const url = this.url;
    if (url === null) return (this.here ??= new EncoderJobs()).run({ ...m, id: this.next++ } as EncoderRequest);
    this.worker ??= this.start(url);
    const id = this.next++;
    return new Promise<EncoderReply>((resolve, reject) => {
      const timer =
        timeoutMs === null
          ? null
          : setTimeout(() => {
              this.stopWorker(new ApiError(400, `the prompt took longer than ${timeoutMs / 1000} s to tokenize and render (the model's chat template or a huge prompt)`, null, "prompt_too_slow"));
            }, timeoutMs);
      this.pending.set(id, { resolve, reject, timer });
      this.worker!.postMessage({ ...m, id });
    });
  }

  /** Ends the worker; every job in it fails with `why`; the next job starts a fresh worker (and reloads). */
  private stopWorker(why: ApiError): void {
    this.worker?.terminate();
    this.worker = null;
    this.loaded = null;
    for (const p of this.pending.values()) {
      if (p.timer) clearTimeout(p.timer);
      p.reject(why);
    }
    this.pending.clear();
  }
}
