// Rendering one chat template under limits: `range()` bounded (a loop cannot build a huge
// array), a deadline checked as the template runs, and the output's size. Used by the
// template worker (chat-template-worker.ts) and, in a bundled app that carries no worker
// file, on the caller's thread (chat-template.ts): the deadline is what stops a runaway
// template there, since a thread cannot be terminated from within.
import { Environment, Interpreter, Template } from "@huggingface/jinja";

export interface RenderLimits {
  /** Wall-clock deadline (performance.now()) after which rendering throws. */
  deadline: number;
  /** Items one `range()` call may produce. */
  maxRange: number;
  /** UTF-8 bytes of the output. */
  maxOutputBytes: number;
}

/** A render that passed its deadline. */
export class RenderTimeoutError extends Error {}

/** The limits of the render running now; null outside one, when the hooks below step aside. */
let active: RenderLimits | null = null;
let steps = 0;

/** jinja's range(), refusing more than the limit (it would build the whole array first). */
function boundedRange(start: number, stop?: number, step = 1): number[] {
  const [a, b] = stop === undefined ? [0, start] : [start, stop];
  if (step === 0) throw new Error("range() step must not be zero");
  const n = Math.max(0, Math.ceil((b - a) / step));
  const max = active?.maxRange ?? Infinity;
  if (!(n <= max)) throw new Error(`range() of ${n} items exceeds the limit of ${max}`);
  return Array.from({ length: n }, (_, i) => a + i * step);
}

// The library offers no hook for either limit: its globals are set inside Template.render (a
// second `range` there is an error) and its interpreter has no step callback. Both methods
// are wrapped once; they act only while `active` is set, that is during renderTemplate
// (synchronous, so no other template of this thread renders meanwhile).
const set = Environment.prototype.set;
Environment.prototype.set = function (this: Environment, name: string, value: unknown) {
  return set.call(this, name, active && name === "range" ? boundedRange : value);
};
type Evaluate = (this: Interpreter, statement: unknown, environment: Environment) => unknown;
const proto = Interpreter.prototype as unknown as { evaluate: Evaluate };
const evaluate = proto.evaluate;
proto.evaluate = function (statement, environment) {
  if (active && ++steps % 256 === 0 && performance.now() > active.deadline) throw new RenderTimeoutError("deadline passed");
  return evaluate.call(this, statement, environment);
};

const cache = new Map<string, Template>();

/** Renders `template` with `context` within `limits`; throws RenderTimeoutError past the deadline. */
export function renderTemplate(template: string, context: Record<string, unknown>, limits: RenderLimits): string {
  let t = cache.get(template);
  if (!t) {
    t = new Template(template);
    cache.clear();
    cache.set(template, t);
  }
  active = limits;
  steps = 0;
  let out: string;
  try {
    out = t.render(context);
  } finally {
    active = null;
  }
  if (out.length * 3 > limits.maxOutputBytes && new TextEncoder().encode(out).length > limits.maxOutputBytes)
    throw new Error(`the rendered prompt exceeds the limit of ${limits.maxOutputBytes} bytes`);
  return out;
}
