// A one-line progress bar on stderr: bytes done, rate and time left. Redrawn at most ten
// times a second; silent unless enabled (stderr is a terminal, or --progress). Where stderr
// is no terminal (--progress into a log or a pipe) it writes plain lines instead, at most one
// a second: no carriage returns or escape codes.

export interface ProgressSink {
  write(text: string): void;
  /** The sink is a terminal, which redraws one line in place (default true). */
  terminal?: boolean;
}

export function formatBytes(n: number): string {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let u = 0;
  while (n >= 1000 && u < units.length - 1) {
    n /= 1000;
    u++;
  }
  return `${n.toFixed(u === 0 ? 0 : n < 10 ? 2 : n < 100 ? 1 : 0)} ${units[u]}`;
}

export function formatSeconds(s: number): string {
  if (!Number.isFinite(s)) return "--:--";
  s = Math.round(s);
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const sec = String(s % 60).padStart(2, "0");
  return h > 0 ? `${h}:${String(m).padStart(2, "0")}:${sec}` : `${m}:${sec}`;
}

export class ProgressBar {
  private readonly started = performance.now();
  private lastDraw = 0;
  private drawn = false;

  constructor(
    private readonly label: string,
    private readonly sink: ProgressSink | null,
    private readonly width = 30,
  ) {}

  /** Reports `done` of `total` bytes; draws when enabled and at least 100 ms have passed. */
  update(done: number, total: number): void {
    if (!this.sink) return;
    const terminal = this.sink.terminal ?? true;
    const now = performance.now();
    if (done < total && now - this.lastDraw < (terminal ? 100 : 1000)) return;
    this.lastDraw = now;
    const line = this.line(done, total, (now - this.started) / 1000);
    this.sink.write(terminal ? `\r${line}\x1b[K` : `${line}\n`);
    this.drawn = true;
  }

  /** Ends the line (so later output starts on a fresh one). */
  finish(): void {
    if (this.sink && this.drawn && (this.sink.terminal ?? true)) this.sink.write("\n");
  }

  line(done: number, total: number, seconds: number): string {
    const frac = total > 0 ? Math.min(1, done / total) : 1;
    const filled = Math.round(frac * this.width);
    const rate = seconds > 0 ? done / seconds : 0;
    const eta = rate > 0 ? (total - done) / rate : Infinity;
    const bar = "#".repeat(filled) + "-".repeat(this.width - filled);
    return `${this.label} [${bar}] ${(frac * 100).toFixed(0).padStart(3)}% ${formatBytes(done)}/${formatBytes(total)} ${formatBytes(rate)}/s ETA ${formatSeconds(eta)}`;
  }
}
