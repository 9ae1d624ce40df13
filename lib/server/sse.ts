// Server-sent events as OpenAI streams them ("data: {json}\n\n" ... "data: [DONE]\n\n"), and the
// hold-back that keeps a streamed text equal to the non-streamed one when stop strings are set.

const encoder = new TextEncoder();

export function sseData(value: unknown): Uint8Array {
  return encoder.encode(`data: ${JSON.stringify(value)}\n\n`);
}

/** A named event (`event: type`), as the Responses API streams. */
export function sseEvent(type: string, value: unknown): Uint8Array {
  return encoder.encode(`event: ${type}\ndata: ${JSON.stringify(value)}\n\n`);
}

export const SSE_DONE = encoder.encode("data: [DONE]\n\n");

export const SSE_HEADERS = {
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
  // reverse proxies (nginx) would otherwise buffer the stream
  "x-accel-buffering": "no",
};

/**
 * Releases streamed text only once no stop string can still begin inside it: a stop string is
 * never returned, so text that might be its start waits until the next token decides.
 */
export class StopHoldback {
  private full = "";
  private released = 0;
  constructor(private stops: string[]) {}

  /** Adds the text of one token; returns the text that is now certain to be output. */
  push(text: string): string {
    this.full += text;
    let safe = this.full.length;
    for (const stop of this.stops) {
      const at = this.full.indexOf(stop, Math.max(0, this.released - stop.length + 1));
      safe = Math.min(safe, at >= 0 ? at : this.full.length - overlap(this.full, stop));
    }
    if (safe <= this.released) return "";
    const out = this.full.slice(this.released, safe);
    this.released = safe;
    return out;
  }

  /** The rest of the final text (the generation's own, cut at the stop string) not yet released. */
  finish(finalText: string): string {
    const out = finalText.slice(this.released);
    this.released = finalText.length;
    return out;
  }
}

/** Length of the longest suffix of `text` that is a proper prefix of `stop`. */
function overlap(text: string, stop: string): number {
  for (let n = Math.min(stop.length - 1, text.length); n > 0; n--) if (text.endsWith(stop.slice(0, n))) return n;
  return 0;
}
