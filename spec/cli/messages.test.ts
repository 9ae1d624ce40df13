// Smaller things a new user met (issue 21 item 11): the overview's descriptions are whole
// sentences, a Hugging Face checkpoint is pointed at `cherenkov convert`, and a forced
// progress bar into a file or pipe is plain lines.
import { afterAll, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { usage } from "../../lib/cli/commands/help.ts";
import { main } from "../../lib/cli/main.ts";

const scratch = mkdtempSync(join(tmpdir(), "cherenkov-messages-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

async function cli(...argv: string[]) {
  let stdout = "";
  let stderr = "";
  const code = await main(argv, { stdout: (t) => (stdout += t), stderr: (t) => (stderr += t), stderrIsTTY: false });
  return { code, stdout, stderr };
}

test("`cherenkov help` gives each command's first sentence whole", async () => {
  const r = await cli("help");
  expect(r.code).toBe(0);
  for (const [command, text] of Object.entries(usage)) {
    const head = text.split("\n")[0]!;
    const at = r.stdout.indexOf(head + "\n");
    expect({ command, listed: at >= 0 }).toEqual({ command, listed: true });
    const description = r.stdout.slice(at + head.length + 1).split(/\ncherenkov |\n\n/)[0]!;
    expect({ command, ends: description.trimEnd().at(-1) }).toEqual({ command, ends: "." });
  }
  expect((await cli("help", "serve")).stdout).toContain("/v1/responses");
});

test("running a Hugging Face checkpoint says to convert it", async () => {
  const hf = join(scratch, "hf");
  mkdirSync(hf);
  writeFileSync(join(hf, "config.json"), "{}");
  writeFileSync(join(hf, "model-00001-of-00002.safetensors"), "");
  const r = await cli("run", hf, "-p", "x", "-n", "1", "--backend", "reference");
  expect(r.code).toBe(1);
  expect(r.stderr).toContain(`cherenkov.json is missing in ${hf}: it holds a Hugging Face or MLX checkpoint (config.json, *.safetensors); convert it first: cherenkov convert ${hf} OUT_DIR`);
});

test("--progress where stderr is no terminal writes plain lines, no carriage returns or escape codes", async () => {
  const r = await cli("synth", "--preset", "tiny", "--seed", "1", "--out", join(scratch, "synth"), "--progress");
  expect(r.code).toBe(0);
  expect(r.stderr).toContain("synth [");
  expect(r.stderr).not.toContain("\r");
  expect(r.stderr).not.toContain("\x1b");
  expect(r.stderr.endsWith("\n")).toBe(true);
});
