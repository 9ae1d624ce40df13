// Chat templates are code shipped in a model directory (tokenizer_config.json): they are
// rendered in a worker (chat-template-worker.ts) with limits on time, output size and
// `range()` length, so a hostile template neither blocks the caller's event loop nor
// exhausts memory. renderAsync keeps the caller's thread free (servers); renderSync blocks
// the caller up to the time limit (the synchronous Model.encode). A bundled app carries no
// worker file (lib/worker-file.ts): there both render on the caller's thread, under the same
// limits (chat-template-render.ts checks the deadline as the template runs).
import { RenderTimeoutError, renderTemplate } from "./chat-template-render.ts";
import { workerFile } from "../worker-file.ts";

/** Limits of one render. */
export const TEMPLATE_LIMITS = {
  /** Wall-clock time of one render. */
  timeMs: 2000,
  /** UTF-8 bytes of the rendered prompt. */
  outputBytes: 16 << 20,
  /** Items one `range()` call may produce. */
  range: 1 << 16,
} as const;

/** A chat template failed, ran too long or produced too much. */
export class ChatTemplateError extends Error {
  override name = "ChatTemplateError";
}

const WORKER_URL = workerFile("./chat-template-worker.ts", import.meta.url);
/** How long a sync render waits for a fresh worker to pick its job up (loading, not rendering). */
const WORKER_START_MS = 10_000;

const tooLong = () => new ChatTemplateError(`chat template: rendering took longer than ${TEMPLATE_LIMITS.timeMs} ms (stopped)`);

/** Renders on this thread (no worker file): the deadline stops a runaway template. */
function renderHere(template: string, context: Record<string, unknown>): string {
  try {
    return renderTemplate(template, context, {
      deadline: performance.now() + TEMPLATE_LIMITS.timeMs,
      maxRange: TEMPLATE_LIMITS.range,
      maxOutputBytes: TEMPLATE_LIMITS.outputBytes,
    });
  } catch (e) {
    if (e instanceof RenderTimeoutError) throw tooLong();
    throw new ChatTemplateError(`chat template: ${e instanceof Error ? e.message : String(e)}`);
  }
}

interface Pending {
  resolve: (s: string) => void;
  reject: (e: Error) => void;
  timer: ReturnType<typeof setTimeout>;
}

/** One worker for async renders (jobs run one after another) and one for sync renders. */
class Renderer {
  private worker: Worker | null = null;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private chain: Promise<unknown> = Promise.resolve();
  private syncWorker: Worker | null = null;
  private sab: SharedArrayBuffer | null = null;

  private start(url: string): Worker {
    if (this.worker) return this.worker;
    const w = new Worker(url);
    w.unref();
    w.onmessage = (ev: MessageEvent<{ id: number; ok: boolean; text: string }>) => {
      const p = this.pending.get(ev.data.id);
      if (!p) return;
      this.pending.delete(ev.data.id);
      clearTimeout(p.timer);
      if (ev.data.ok) p.resolve(ev.data.text);
      else p.reject(new ChatTemplateError(`chat template: ${ev.data.text}`));
    };
    w.onerror = (ev) => this.fail(new ChatTemplateError(`chat template worker failed: ${(ev as ErrorEvent).message ?? "unknown error"}`));
    return (this.worker = w);
  }

  private fail(e: Error) {
    this.worker?.terminate();
    this.worker = null;
    for (const p of this.pending.values()) {
      clearTimeout(p.timer);
      p.reject(e);
    }
    this.pending.clear();
  }

  renderAsync(template: string, context: Record<string, unknown>): Promise<string> {
    const url = WORKER_URL;
    if (url === null) return Promise.resolve().then(() => renderHere(template, context));
    const run = () =>
      new Promise<string>((resolve, reject) => {
        const id = this.nextId++;
        const timer = setTimeout(() => this.fail(tooLong()), TEMPLATE_LIMITS.timeMs);
        this.pending.set(id, { resolve, reject, timer });
        this.start(url).postMessage({ id, template, context, maxOutputBytes: TEMPLATE_LIMITS.outputBytes, maxRange: TEMPLATE_LIMITS.range });
      });
    const r = this.chain.then(run, run);
    this.chain = r.catch(() => {});
    return r;
  }

  renderSync(template: string, context: Record<string, unknown>): string {
    if (WORKER_URL === null) return renderHere(template, context);
    this.sab ??= new SharedArrayBuffer(8 + TEMPLATE_LIMITS.outputBytes);
    const head = new Int32Array(this.sab, 0, 2);
    Atomics.store(head, 0, 0);
    if (!this.syncWorker) {
      this.syncWorker = new Worker(WORKER_URL);
      this.syncWorker.unref();
    }
    this.syncWorker.postMessage({ id: 0, template, context, maxOutputBytes: TEMPLATE_LIMITS.outputBytes, maxRange: TEMPLATE_LIMITS.range, sab: this.sab });
    // Two waits: the worker takes the job (state 3; a worker that cannot load never does, and
    // says nothing this blocked thread could hear), then the render, under its time limit.
    const stop = (e: ChatTemplateError) => {
      this.syncWorker?.terminate();
      this.syncWorker = null;
      return e;
    };
    if (Atomics.wait(head, 0, 0, WORKER_START_MS) === "timed-out")
      throw stop(new ChatTemplateError(`chat template: the template worker ${WORKER_URL} did not start within ${WORKER_START_MS} ms`));
    if (Atomics.wait(head, 0, 3, TEMPLATE_LIMITS.timeMs) === "timed-out") throw stop(tooLong());
    const text = new TextDecoder().decode(new Uint8Array(this.sab, 8, head[1]!).slice());
    if (head[0] === 2) throw new ChatTemplateError(`chat template: ${text}`);
    return text;
  }
}

const renderer = new Renderer();

/** Renders `template` with `context` in the worker, without blocking this thread. */
export function renderChatTemplateAsync(template: string, context: Record<string, unknown>): Promise<string> {
  return renderer.renderAsync(template, context);
}

/** Renders `template` with `context` in the worker, blocking this thread at most the time limit. */
export function renderChatTemplateSync(template: string, context: Record<string, unknown>): string {
  return renderer.renderSync(template, context);
}
