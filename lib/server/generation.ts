// One generation for the server: streams through Model, hands out text that stop strings can no
// longer claim, and yields to the event loop after every token so that sockets are written,
// disconnects are noticed and new requests are accepted (queued) while the model runs.
import type { GenerationResult, Model } from "../api/model.ts";
import { StopHoldback } from "./sse.ts";

export interface GenerationJob {
  prompt: number[];
  maxTokens: number;
  stop: string[];
  drafts: number | "auto";
  signal: AbortSignal;
  /** Called with each piece of output text, in order; their concatenation is the result's text. */
  onText?: (text: string) => void;
}

const nextMacrotask = () => new Promise<void>((resolve) => setImmediate(resolve));

export async function runGeneration(model: Model, job: GenerationJob): Promise<GenerationResult> {
  const stream = model.stream(job.prompt, {
    maxTokens: job.maxTokens,
    stop: job.stop.length > 0 ? job.stop : undefined,
    drafts: job.drafts === "auto" || job.drafts > 0 ? job.drafts : undefined,
    signal: job.signal,
  });
  const holdback = new StopHoldback(job.stop);
  try {
    for (;;) {
      const step = await stream.next();
      if (step.done) {
        const rest = holdback.finish(step.value.text);
        if (rest !== "") job.onText?.(rest);
        return step.value;
      }
      const text = holdback.push(step.value.text);
      if (text !== "") job.onText?.(text);
      await nextMacrotask();
    }
  } finally {
    // Leaving early (abort, a failing callback) closes the model's session.
    await stream.return(undefined as never);
  }
}
