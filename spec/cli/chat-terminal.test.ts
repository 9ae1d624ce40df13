// `cherenkov chat` at a terminal (issue 21 item 4): readline reads raw keys there, so what the
// user types is shown only if readline echoes it. Run under a pseudo-terminal; every wait is
// for the program's own output (a prompt), never for a length of time.
import { expect, test } from "bun:test";
import { join } from "node:path";

const MAIN = join(import.meta.dir, "..", "..", "lib", "cli", "main.ts");

test.skipIf(process.platform === "win32")("what you type is shown after the prompt", async () => {
  let out = "";
  const decoder = new TextDecoder();
  const proc = Bun.spawn([process.execPath, MAIN, "chat", "-n", "2"], { terminal: { data: (_t, d) => void (out += decoder.decode(d)) } });
  const prompts = () => out.split("> ").length - 1;
  const until = async (what: string, done: () => boolean) => {
    while (!done()) {
      if (proc.exitCode !== null) throw new Error(`chat exited (${proc.exitCode}) while waiting for ${what}: ${JSON.stringify(out)}`);
      await Bun.sleep(10);
    }
  };
  try {
    await until("the first prompt", () => prompts() >= 1);
    proc.terminal!.write("hello there\r");
    await until("the answer and the next prompt", () => prompts() >= 2);
    proc.terminal!.write("/exit\r");
    expect(await proc.exited).toBe(0);
  } finally {
    proc.kill();
    proc.terminal?.close();
  }
  const plain = out.replace(/\x1b\[[0-9;]*[A-Za-z]/g, "");
  expect(plain).toStartWith("> hello there\r");
  expect(plain).toContain("> /exit");
}, 60_000);
