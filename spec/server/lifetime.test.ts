// The loaded model's files are the model, to the byte (docs/server.md): the server encodes
// prompts with the tokenizer and chat template the model loaded at start-up, even when the
// directory's tokenizer files are replaced (and re-sealed) under the running server.
import { afterAll, expect, test } from "bun:test";
import { cpSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import { main } from "../../lib/cli/main.ts";
import { encodeChat } from "../../lib/model/chat-encode.ts";
import { DEFAULT_MODEL_DIR } from "../../lib/model/default-model.ts";
import { startServer } from "./harness.ts";

const work = mkdtempSync(join(tmpdir(), "cherenkov-lifetime-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

test("a tokenizer_config.json replaced and sealed under a running server changes nothing it encodes", async () => {
  const dir = join(work, "model");
  cpSync(DEFAULT_MODEL_DIR, dir, { recursive: true });
  const model = await Model.load(dir, { backend: "reference" });
  const server = startServer(model);
  try {
    // a new template that renders a long preamble, swapped in by rename and sealed
    const cfg = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
    cfg.chat_template = `${"preamble ".repeat(50)}{% for m in messages %}{{ m.content }}{% endfor %}`;
    writeFileSync(join(dir, ".new"), JSON.stringify(cfg));
    renameSync(join(dir, ".new"), join(dir, "tokenizer_config.json"));
    const io = { stdout: () => {}, stderr: () => {}, stderrIsTTY: false };
    expect(await main(["seal", dir], io)).toBe(0);

    const messages = [{ role: "user", content: "Write a function" }];
    const res = await server.post("/v1/chat/completions", { messages, max_tokens: 1 });
    expect(res.status).toBe(200);
    const body = (await res.json()) as { usage: { prompt_tokens: number } };
    expect(body.usage.prompt_tokens).toBe(encodeChat(model.tokenizer!, messages).length);
    const text = await server.post("/v1/completions", { prompt: "preamble preamble", max_tokens: 1 });
    expect(((await text.json()) as { usage: { prompt_tokens: number } }).usage.prompt_tokens).toBe(model.tokenizer!.encode("preamble preamble").length);
  } finally {
    await server.stop();
    await model.close();
  }
});
