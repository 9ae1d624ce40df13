// Where the commands write: the process's streams, or buffers in tests.

export interface CliIO {
  stdout(text: string): void;
  stderr(text: string): void;
  /** Whether stderr is a terminal (progress bars are drawn only there, unless --progress). */
  stderrIsTTY: boolean;
  /** All of stdin when it is not a terminal (a pipe or file), else null; absent: no stdin. */
  stdin?: () => Promise<string | null>;
}

export function processIO(): CliIO {
  // `cherenkov inspect DIR | head` closes the pipe early: that is the reader's choice, not an error.
  process.stdout.on("error", (e: NodeJS.ErrnoException) => {
    if (e.code === "EPIPE") process.exit(0);
    throw e;
  });
  return {
    stdout: (t) => void process.stdout.write(t),
    stderr: (t) => void process.stderr.write(t),
    stderrIsTTY: Boolean(process.stderr.isTTY),
    stdin: async () => (process.stdin.isTTY ? null : await Bun.stdin.text()),
  };
}

/** A sink for ProgressBar when progress is wanted, else null. */
export function progressSink(io: CliIO, forced: boolean) {
  return io.stderrIsTTY || forced ? { write: io.stderr, terminal: io.stderrIsTTY } : null;
}
