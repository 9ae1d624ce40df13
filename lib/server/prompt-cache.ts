// Prompt-prefix reuse across requests (llama.cpp's `cache_prompt`): a chat client resends the
// whole conversation every turn, so the next request's prompt starts with the last one's
// prompt, and often with its answer too. The server keeps checkpoints of the last request's
// session (after its prompt, and after its answer) and starts the next request from the
// longest one that is a prefix of its prompt; only the rest is prefilled. Checkpoints resume
// exactly (lib/api/checkpoint.ts), so the output is the same as from a cold start.
import type { Checkpoint } from "../api/checkpoint.ts";
import type { Model, Session } from "../api/model.ts";

/** Checkpoints kept: the last request's prompt (but its last token), and its prompt with the answer. */
const KEPT = 2;

export class PromptCache {
  private saved: Checkpoint[] = [];

  constructor(private readonly model: Model) {}

  /**
   * A session for `prompt`: from the longest saved checkpoint whose tokens begin the prompt
   * and leave at least one token to append, else a fresh one; `cached` is how many tokens it
   * already holds.
   */
  open(prompt: readonly number[]): { session: Session; cached: number } {
    let best: Checkpoint | null = null;
    for (const c of this.saved)
      if (c.length < prompt.length && (!best || c.length > best.length) && startsWith(prompt, c.tokens)) best = c;
    return best ? { session: this.model.session({ from: best }), cached: best.length } : { session: this.model.session(), cached: 0 };
  }

  /** Keeps these checkpoints (the newest request's), dropping older ones. */
  keep(checkpoints: Checkpoint[]): void {
    this.saved = checkpoints.slice(-KEPT);
  }
}

function startsWith(tokens: readonly number[], prefix: readonly number[]): boolean {
  if (prefix.length > tokens.length) return false;
  for (let i = 0; i < prefix.length; i++) if (tokens[i] !== prefix[i]) return false;
  return true;
}
