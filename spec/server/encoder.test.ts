// The server's prompt encoder (a worker): the same ids as the tokenizer on this thread; a job
// past the time limit fails alone with 400 and the jobs queued behind it run in a fresh worker;
// a prompt longer than the context could hold is refused before it is tokenized.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { DEFAULT_MODEL_DIR } from "../../lib/model/default-model.ts";
import { encodeChat } from "../../lib/model/chat-encode.ts";
import { loadTokenizer, type TextTokenizer } from "../../lib/model/tokenizer.ts";
import { PromptEncoder } from "../../lib/server/encoder.ts";
import { ApiError } from "../../lib/server/errors.ts";
import { STALL_TEXT } from "./fixtures/stalling-encoder-worker.ts";

let tok: TextTokenizer;
let encoder: PromptEncoder;
/** A short job limit, for the tests that pass it. */
let hurried: PromptEncoder;
beforeAll(async () => {
  tok = await loadTokenizer(DEFAULT_MODEL_DIR);
  encoder = new PromptEncoder(tok);
  // Its worker never answers STALL_TEXT: the slow job is past the limit on any machine.
  hurried = new PromptEncoder(tok, { timeoutMs: 1000, workerUrl: STALLING_WORKER });
});
afterAll(() => {
  encoder.close();
  hurried.close();
});

/** The encoder's worker, except that a text job for STALL_TEXT never answers. */
const STALLING_WORKER = new URL("./fixtures/stalling-encoder-worker.ts", import.meta.url).href;

test("text and chat ids equal the tokenizer's own", async () => {
  expect(await encoder.info()).toEqual({ hasChatTemplate: true, tools: false });
  expect(await encoder.text("def f(x):\n    return x", "prompt")).toEqual(tok.encode("def f(x):\n    return x"));
  const messages = [{ role: "user", content: "hi <|im_start|>system" }];
  expect(await encoder.chat(messages, undefined, "messages")).toEqual(encodeChat(tok, messages));
});

test("a job past the time limit is 400 prompt_too_slow; the jobs queued behind it still run", async () => {
  await hurried.info();
  const slow = hurried.text(STALL_TEXT, "prompt").catch((err) => err);
  // queued while the slow one runs: on the old encoder their timers ran from here and the slow
  // job's timeout failed them all
  const innocent = ["hello", "import os", "x = 1"].map((t) => hurried.text(t, "prompt"));
  const e = await slow;
  expect(e).toBeInstanceOf(ApiError);
  expect((e as ApiError).status).toBe(400);
  expect((e as ApiError).code).toBe("prompt_too_slow");
  expect(await Promise.all(innocent)).toEqual(["hello", "import os", "x = 1"].map((t) => tok.encode(t)));
});

test("a prompt longer than the context can hold is refused before it is tokenized", async () => {
  const bounded = new PromptEncoder(tok, { contextLength: 64 });
  try {
    expect(bounded.maxPromptUnits).toBe(64 * tok.longestPiece * 2);
    const long = " ".repeat(bounded.maxPromptUnits + 1);
    let e: unknown;
    try {
      void bounded.text(long, "prompt");
    } catch (err) {
      e = err; // thrown at once: nothing was queued or tokenized
    }
    expect((e as ApiError).code).toBe("context_length_exceeded");
    expect(bounded.queued).toBe(0);
    expect(() => bounded.chat([{ role: "user", content: long }], undefined, "messages")).toThrow(/cannot fit this server's context/);
    // a short text is tokenized as usual
    expect(await bounded.text("hello", "prompt")).toEqual(tok.encode("hello"));
  } finally {
    bounded.close();
  }
});

test("a full queue refuses with 503 queue_full; a wait past the limit is 503 queue_timeout", async () => {
  const small = new PromptEncoder(tok, { maxWaiting: 1, maxWaitMs: 50, timeoutMs: 30_000, workerUrl: STALLING_WORKER });
  try {
    const running = small.text(STALL_TEXT, "prompt"); // occupies the worker until close()
    const waiting = small.text("a", "prompt").catch((err) => err);
    const refused = await small.text("b", "prompt").catch((err) => err);
    expect((refused as ApiError).code).toBe("queue_full");
    expect(((await waiting) as ApiError).code).toBe("queue_timeout");
    small.close();
    await running.catch(() => {});
  } finally {
    small.close();
  }
});
