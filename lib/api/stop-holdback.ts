// Stop strings in streamed text: a stop string is never output, so text that might be its start
// waits until later text decides. What is released, plus the rest at the end, is exactly the
// final text (cut before the first stop string), however the text is split into pieces.

export class StopHoldback {
  private full = "";
  private released = 0;
  /** Where the first stop string begins in the text, once one has completed; else -1. */
  stoppedAt = -1;
  constructor(private stops: readonly string[]) {}

  /** Adds the text of one token; returns the text now certain to be output. */
  push(text: string): string {
    if (this.stoppedAt >= 0) return "";
    this.full += text;
    let safe = this.full.length;
    for (const stop of this.stops) {
      if (stop === "") continue;
      // released text holds no start of a stop string, so an occurrence begins after it
      const at = this.full.indexOf(stop, this.released);
      if (at >= 0 && (this.stoppedAt < 0 || at < this.stoppedAt)) this.stoppedAt = at;
      safe = Math.min(safe, at >= 0 ? at : this.full.length - overlap(this.full, stop));
    }
    if (this.stoppedAt >= 0) safe = this.stoppedAt;
    if (safe <= this.released) return "";
    const out = this.full.slice(this.released, safe);
    this.released = safe;
    return out;
  }

  /** Generation ended without a stop string: the text still held back. */
  flush(): string {
    if (this.stoppedAt >= 0) return "";
    const out = this.full.slice(this.released);
    this.released = this.full.length;
    return out;
  }

  /** The output text: everything before the first stop string. */
  get text(): string {
    return this.full.slice(0, this.stoppedAt >= 0 ? this.stoppedAt : this.full.length);
  }
}

/** Length of the longest suffix of `text` that is a proper prefix of `stop`. */
function overlap(text: string, stop: string): number {
  for (let n = Math.min(stop.length - 1, text.length); n > 0; n--) if (text.endsWith(stop.slice(0, n))) return n;
  return 0;
}
