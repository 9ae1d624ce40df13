// A command buffer that notes the pipeline name of every dispatch before passing it on: the
// kernel tests' "which kernels ran" checks (spec/kernels/harness.ts) and bench:kernels' kernels
// column. Everything but dispatch reaches the real command buffer untouched.
import type { EncodeContext } from "../lib/gpu/dispatch.ts";

/** `ctx` with a command buffer that appends each dispatch's pipeline name to `names`. */
export function recordingNames(ctx: EncodeContext, names: string[]): EncodeContext {
  const cb = ctx.cb;
  const dispatch = (...a: Parameters<typeof cb.dispatch>) => {
    names.push(typeof a[0] === "string" ? a[0] : a[0].name);
    return cb.dispatch(...a);
  };
  return { ...ctx, cb: new Proxy(cb, { get: (t, k) => (k === "dispatch" ? dispatch : Reflect.get(t, k, t)) }) };
}
