// The server's prompt encoder (a worker): the same ids as the tokenizer on this thread, and a
// job past the time limit fails with 400 and leaves a fresh worker for the next one.
import { afterAll, expect, test } from "bun:test";
import { DEFAULT_MODEL_DIR } from "../../lib/model/default-model.ts";
import { encodeChat } from "../../lib/model/chat-encode.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { PromptEncoder } from "../../lib/server/encoder.ts";
import { ApiError } from "../../lib/server/errors.ts";

const encoder = new PromptEncoder(DEFAULT_MODEL_DIR);
/** A short limit, for the test that passes it. */
const hurried = new PromptEncoder(DEFAULT_MODEL_DIR, 250);
afterAll(() => {
  encoder.close();
  hurried.close();
});

test("text and chat ids equal the tokenizer's own", async () => {
  const tok = await loadTokenizer(DEFAULT_MODEL_DIR);
  expect(await encoder.info()).toEqual({ hasChatTemplate: true, tools: false });
  expect(await encoder.text("def f(x):\n    return x", "prompt")).toEqual(tok.encode("def f(x):\n    return x"));
  const messages = [{ role: "user", content: "hi <|im_start|>system" }];
  expect(await encoder.chat(messages, undefined, "messages")).toEqual(encodeChat(tok, messages));
});

test("a job past the time limit is 400 prompt_too_slow; the next job runs in a fresh worker", async () => {
  const huge = "def f(x):\n    return x * 2  # words here\n".repeat(60_000); // seconds of tokenizing
  await hurried.info();
  const e = await hurried.text(huge, "prompt").catch((err) => err);
  expect(e).toBeInstanceOf(ApiError);
  expect((e as ApiError).status).toBe(400);
  expect((e as ApiError).code).toBe("prompt_too_slow");
  expect(await hurried.text("ok", "prompt")).toEqual((await loadTokenizer(DEFAULT_MODEL_DIR)).encode("ok"));
});
