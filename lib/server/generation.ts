// One generation for the server: streams through Model (whose chunks hold back text a stop
// string may still claim, so they add up to the final text), and yields to the event loop after every token so that sockets are written,
// disconnects are noticed and new requests are accepted (queued) while the model runs.
import type { GenerationResult, Model, TokenLogprob } from "../api/model.ts";
import type { Sampling } from "./prepare.ts";

export interface GenerationJob {
  prompt: number[];
  maxTokens: number;
  stop: string[];
  drafts: number | "auto";
  signal: AbortSignal;
  sampling?: Sampling;
  /**
   * Called with each piece of output text, in order (their concatenation is the result's
   * text), and the log probabilities of the tokens generated since the last piece.
   */
  onText?: (text: string, logprobs: TokenLogprob[]) => void;
}

const nextMacrotask = () => new Promise<void>((resolve) => setImmediate(resolve));

export async function runGeneration(model: Model, job: GenerationJob): Promise<GenerationResult> {
  const stream = model.stream(job.prompt, {
    maxTokens: job.maxTokens,
    stop: job.stop.length > 0 ? job.stop : undefined,
    drafts: job.drafts === "auto" || job.drafts > 0 ? job.drafts : undefined,
    signal: job.signal,
    ...job.sampling,
  });
  // log probabilities wait with their text (held back, or a character split across tokens)
  let pending: TokenLogprob[] = [];
  try {
    for (;;) {
      const step = await stream.next();
      if (step.done) {
        if (pending.length > 0) job.onText?.("", pending);
        return step.value;
      }
      if (step.value.logprobs) pending.push(...step.value.logprobs);
      const text = step.value.text;
      if (text !== "") {
        job.onText?.(text, pending);
        pending = [];
      }
      await nextMacrotask();
    }
  } finally {
    // Leaving early (abort, a failing callback) closes the model's session.
    await stream.return(undefined as never);
  }
}
