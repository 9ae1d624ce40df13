// The worker that renders chat templates (lib/model/chat-template.ts): a template is code from
// the model directory, so it runs here, off the caller's thread, where a runaway loop can be
// stopped by terminating the worker (chat-template-render.ts bounds range() and the output).
import { renderTemplate } from "./chat-template-render.ts";

declare const self: Worker;

interface Job {
  id: number;
  template: string;
  context: Record<string, unknown>;
  maxOutputBytes: number;
  maxRange: number;
  /** Sync callers: [state, length] then the UTF-8 output (state 3 = started, 1 = ok, 2 = error text). */
  sab?: SharedArrayBuffer;
}

self.onmessage = (ev: MessageEvent<Job>) => {
  const job = ev.data;
  const head = job.sab ? new Int32Array(job.sab, 0, 2) : null;
  if (head) {
    Atomics.store(head, 0, 3);
    Atomics.notify(head, 0);
  }
  let ok = true;
  let text: string;
  try {
    // No deadline here: the caller terminates this worker at its time limit.
    text = renderTemplate(job.template, job.context, { deadline: Infinity, maxRange: job.maxRange, maxOutputBytes: job.maxOutputBytes });
  } catch (e) {
    ok = false;
    text = e instanceof Error ? e.message : String(e);
  }
  if (head && job.sab) {
    const body = new Uint8Array(job.sab, 8);
    let bytes = new TextEncoder().encode(text);
    if (bytes.length > body.length) {
      ok = false;
      bytes = new TextEncoder().encode(`the rendered prompt exceeds the limit of ${body.length} bytes`);
    }
    body.set(bytes);
    head[1] = bytes.length;
    Atomics.store(head, 0, ok ? 1 : 2);
    Atomics.notify(head, 0);
  } else {
    self.postMessage({ id: job.id, ok, text });
  }
};
