// The worker that renders chat templates (lib/model/chat-template.ts): a template is code from
// the model directory, so it runs here, off the caller's thread, where a runaway loop can be
// stopped by terminating the worker. `range` is bounded so a loop cannot allocate gigabytes
// before the time limit strikes.
import { Environment, Template } from "@huggingface/jinja";

declare const self: Worker;

interface Job {
  id: number;
  template: string;
  context: Record<string, unknown>;
  maxOutputBytes: number;
  maxRange: number;
  /** Sync callers: [state, length] then the UTF-8 output (state 1 = ok, 2 = error text). */
  sab?: SharedArrayBuffer;
}

const cache = new Map<string, Template>();
let maxRange = 1 << 16;

/** jinja's range(), refusing more than maxRange items (it would build the whole array first). */
function boundedRange(start: number, stop?: number, step = 1): number[] {
  const [a, b] = stop === undefined ? [0, start] : [start, stop];
  if (step === 0) throw new Error("range() step must not be zero");
  const n = Math.max(0, Math.ceil((b - a) / step));
  if (!(n <= maxRange)) throw new Error(`range() of ${n} items exceeds the limit of ${maxRange}`);
  return Array.from({ length: n }, (_, i) => a + i * step);
}

// Every render's environment gets the bounded range() in place of the library's (this worker
// renders nothing else, so patching its Environment is contained here).
const set = Environment.prototype.set;
Environment.prototype.set = function (this: Environment, name: string, value: unknown) {
  return set.call(this, name, name === "range" ? boundedRange : value);
};

function render(job: Job): string {
  let t = cache.get(job.template);
  if (!t) {
    t = new Template(job.template);
    cache.clear();
    cache.set(job.template, t);
  }
  maxRange = job.maxRange;
  const out = t.render(job.context);
  if (out.length * 3 > job.maxOutputBytes && new TextEncoder().encode(out).length > job.maxOutputBytes)
    throw new Error(`the rendered prompt exceeds the limit of ${job.maxOutputBytes} bytes`);
  return out;
}

self.onmessage = (ev: MessageEvent<Job>) => {
  const job = ev.data;
  let ok = true;
  let text: string;
  try {
    text = render(job);
  } catch (e) {
    ok = false;
    text = e instanceof Error ? e.message : String(e);
  }
  if (job.sab) {
    const head = new Int32Array(job.sab, 0, 2);
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
