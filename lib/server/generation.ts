// One generation for the server: streams through Model (whose chunks hold back text a stop
// string may still claim, so they add up to the final text), and yields to the event loop after every token so that sockets are written,
// disconnects are noticed and new requests are accepted (queued) while the model runs.
import type { GenerateOptions, GenerationResult, Model, Session, StreamChunk, TokenLogprob } from "../api/model.ts";
import type { PromptCache } from "./prompt-cache.ts";
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

/**
 * A generation's result as the server reports it: `usage.promptTokens` is the whole prompt
 * (OpenAI's meaning), `cachedTokens` the part of it a saved checkpoint already held.
 */
export type ServedResult = GenerationResult & { cachedTokens: number };

export async function runGeneration(model: Model, job: GenerationJob, cache?: PromptCache): Promise<ServedResult> {
  const options: GenerateOptions = {
    maxTokens: job.maxTokens,
    stop: job.stop.length > 0 ? job.stop : undefined,
    drafts: job.drafts === "auto" || job.drafts > 0 ? job.drafts : undefined,
    signal: job.signal,
    ...job.sampling,
  };
  // log probabilities wait with their text (held back, or a character split across tokens)
  let pending: TokenLogprob[] = [];
  let stream: AsyncGenerator<StreamChunk, GenerationResult> | null = null;
  let session: Session | null = null;
  let cached = 0;
  /** Saves the checkpoints of a finished generation (with a cache). */
  let keep = () => {};
  try {
    if (cache) {
      ({ session, cached } = cache.open(job.prompt));
      const s = session;
      // The checkpoint is taken one token short of the prompt, so that the same prompt sent
      // again (a regenerated answer) has a prefix to start from too.
      const body = job.prompt.slice(cached, -1);
      if (body.length > 0) await s.append(body, { signal: job.signal });
      const afterPrompt = s.checkpoint();
      await s.appendFor(job.prompt.slice(-1), options);
      keep = () => cache.keep([afterPrompt, s.checkpoint()]);
      stream = s.stream(options);
    } else stream = model.stream(job.prompt, options);
    for (;;) {
      const step = await stream.next();
      if (step.done) {
        if (pending.length > 0) job.onText?.("", pending);
        keep();
        const r = step.value;
        return { ...r, usage: { ...r.usage, promptTokens: cached + r.usage.promptTokens }, cachedTokens: cached };
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
    // Leaving early (abort, a failing callback) stops the generation.
    await stream?.return(undefined as never);
    session?.close();
  }
}
