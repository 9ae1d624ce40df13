// The public API over the reference backend: generate / stream / sessions / abort / stop /
// drafts, each compared with the reference's own greedy generation.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Model, synthesize } from "../../lib/index.ts";
import { openModel } from "../../lib/model/format.ts";
import { generateGreedy } from "../../lib/reference/index.ts";

let dir: string;
let model: Model;
const prompt = [72, 101, 108, 108, 111, 44, 32, 119]; // "Hello, w"

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "cherenkov-api-"));
  await synthesize({ preset: "tiny", seed: 11, out: dir, weights: "q4", workers: 0 });
  model = await Model.load(dir, { backend: "reference" });
});
afterAll(async () => {
  await model.close();
  rmSync(dir, { recursive: true, force: true });
});

async function expected(maxTokens: number) {
  const files = await openModel(dir);
  const g = generateGreedy(files, prompt, { maxTokens });
  files.close();
  return g.tokens;
}

describe("Model", () => {
  test("generate() from token ids equals the reference's greedy tokens", async () => {
    const r = await model.generate(prompt, { maxTokens: 12, stopAtEos: false });
    expect(r.tokens).toEqual(await expected(12));
    expect(r.finishReason).toBe("length");
    expect(r.usage).toEqual({ promptTokens: prompt.length, completionTokens: 12 });
    // The text is what streaming emitted: an unfinished last UTF-8 character is held back.
    const full = model.decode(r.tokens);
    expect(full.startsWith(r.text)).toBe(true);
    expect(full.slice(r.text.length)).toMatch(/^\uFFFD*$/);
    expect(r.text.length).toBeGreaterThan(0);
  });

  test("text prompts go through the tokenizer", async () => {
    const a = await model.generate("Hello, w", { maxTokens: 6, stopAtEos: false });
    const b = await model.generate(model.encode("Hello, w"), { maxTokens: 6, stopAtEos: false });
    expect(a.tokens).toEqual(b.tokens);
    expect(model.encode("Hello, w")).toEqual(prompt);
  });

  test("chat messages use the chat template", async () => {
    const ids = model.encode([{ role: "user", content: "hi" }]);
    const text = model.tokenizer!.decode(ids);
    expect(text).toContain("<|im_start|>user");
    expect(text).toContain("hi");
    expect(text.trimEnd().endsWith("<|im_start|>assistant")).toBe(true);
  });

  test("stream() yields the same tokens as generate(), and its text concatenates to the result", async () => {
    const want = await expected(10);
    const it = model.stream(prompt, { maxTokens: 10, stopAtEos: false });
    const got: number[] = [];
    let text = "";
    let r = await it.next();
    while (!r.done) {
      got.push(r.value.token);
      text += r.value.text;
      r = await it.next();
    }
    expect(got).toEqual(want);
    expect(r.value.tokens).toEqual(want);
    expect(text).toBe(r.value.text);
  });

  test("a long stream of raw byte tokens (split UTF-8 sequences) concatenates to the decoded text", async () => {
    let text = "";
    const it = model.stream(prompt, { maxTokens: 200, stopAtEos: false });
    let r = await it.next();
    while (!r.done) {
      text += r.value.text;
      r = await it.next();
    }
    expect(r.value.tokens.length).toBe(200);
    expect(r.value.tokens.some((t) => t >= 0xc0 && t < 0x100)).toBe(true); // multi-byte leads occur
    expect(text).toBe(r.value.text);
    const full = model.decode(r.value.tokens);
    expect(full.startsWith(text)).toBe(true);
    expect(full.slice(text.length)).toMatch(/^\uFFFD*$/); // only an unfinished character may be held back
  });

  test("speculative decoding with 1..3 drafts gives the greedy tokens", async () => {
    const want = await expected(14);
    for (const drafts of [1, 2, 3]) {
      const r = await model.generate(prompt, { maxTokens: 14, stopAtEos: false, drafts });
      expect(r.tokens).toEqual(want);
      expect(r.drafts!.proposed).toBeGreaterThan(0);
    }
  });

  test("an aborted signal rejects with AbortError, and the model stays usable", async () => {
    const ac = new AbortController();
    const it = model.stream(prompt, { maxTokens: 50, signal: ac.signal, stopAtEos: false });
    await it.next();
    ac.abort();
    await expect(it.next()).rejects.toThrow();
    const pre = new AbortController();
    pre.abort();
    await expect(model.generate(prompt, { signal: pre.signal })).rejects.toHaveProperty("name", "AbortError");
    expect((await model.generate(prompt, { maxTokens: 3, stopAtEos: false })).tokens).toEqual((await expected(3)));
  });

  test("stop strings end generation and are cut from the text", async () => {
    const full = await model.generate(prompt, { maxTokens: 16, stopAtEos: false });
    // a printable ASCII character from the middle of the text (random weights: no words)
    const i = [...full.text].findIndex((ch, j) => j >= 2 && /^[ -~]$/.test(ch));
    expect(i).toBeGreaterThan(0);
    const stopAt = [...full.text][i]!;
    const r = await model.generate(prompt, { maxTokens: 16, stopAtEos: false, stop: [stopAt] });
    expect(r.finishReason).toBe("stop");
    expect(r.text).toBe(full.text.slice(0, full.text.indexOf(stopAt)));
  });

  /** Streams `prompt` with `opts`: the chunks' texts, the emitted text after each, and the result. */
  async function streamAll(opts: { maxTokens: number; stop?: string[] }) {
    const it = model.stream(prompt, { ...opts, stopAtEos: false });
    const chunks: { token: number; text: string; emittedSoFar: string }[] = [];
    let emitted = "";
    for (let r = await it.next(); ; r = await it.next()) {
      if (r.done) return { chunks, emitted, result: r.value };
      emitted += r.value.text;
      chunks.push({ token: r.value.token, text: r.value.text, emittedSoFar: emitted });
    }
  }

  test("stream() never emits stop-string text: a started stop string is held until it diverges or completes", async () => {
    const full = await streamAll({ maxTokens: 40 });
    const text = full.result.text;
    expect(full.emitted).toBe(text);
    // distinct three-character pieces of the text (random weights: bytes, no words), each
    // spanning several tokens
    const pieces: [number, string][] = [];
    for (let i = 1; i + 3 <= text.length; i++) {
      const p = text.slice(i, i + 3);
      if (!/[\uFFFD\uD800-\uDFFF]/.test(p) && text.indexOf(p) === i) pieces.push([i, p]);
    }
    expect(pieces.length).toBeGreaterThan(1);

    // Diverging: the first two characters of a piece, then a character the text never has there.
    const [, piece] = pieces[0]!;
    const other = [..."~`^|{}"].find((c) => !text.includes(piece.slice(0, 2) + c))!;
    const diverging = piece.slice(0, 2) + other;
    const d = await streamAll({ maxTokens: 40, stop: [diverging] });
    expect(d.result.finishReason).toBe("length");
    expect(d.result.text).toBe(text);
    expect(d.emitted).toBe(text);
    for (const c of d.chunks.slice(0, -1)) {
      // before the end, no emitted text ends with the start of the stop string: it waits
      for (let n = 1; n < diverging.length; n++) expect(c.emittedSoFar.endsWith(diverging.slice(0, n))).toBe(false);
    }

    // Completing: a piece from the middle of the text; its characters are never streamed.
    const [at, stop] = pieces[Math.floor(pieces.length / 2)]!;
    const c = await streamAll({ maxTokens: 40, stop: [stop] });
    expect(c.result.finishReason).toBe("stop");
    expect(c.result.text).toBe(text.slice(0, at));
    expect(c.emitted).toBe(c.result.text);
    expect(c.chunks.every((k) => k.emittedSoFar.length <= at)).toBe(true);
    expect(c.chunks.length).toBe(c.result.tokens.length);
  });

  test("out-of-vocabulary prompt ids are refused with the id named", async () => {
    await expect(model.generate([1, 2, 99999])).rejects.toThrow(/99999/);
  });

  test("stats() counts generations and tokens", async () => {
    const before = model.stats();
    await model.generate(prompt, { maxTokens: 4, stopAtEos: false });
    const after = model.stats();
    expect(after.generations).toBe(before.generations + 1);
    expect(after.completionTokens).toBe(before.completionTokens + 4);
    expect(after.promptTokens).toBe(before.promptTokens + prompt.length);
    expect(after.backend).toBe("reference");
  });
});

describe("Session", () => {
  test("append + generate in pieces equals one generation over the concatenation", async () => {
    const s = model.session();
    await s.append(prompt.slice(0, 3));
    await s.append(prompt.slice(3));
    const a = await s.generate({ maxTokens: 5, stopAtEos: false });
    const b = await s.generate({ maxTokens: 5, stopAtEos: false });
    expect([...a.tokens, ...b.tokens]).toEqual(await expected(10));
    expect(s.tokens).toEqual([...prompt, ...a.tokens, ...b.tokens]);
    s.close();
  });

  test("appending after generation continues the same sequence", async () => {
    const s = model.session();
    await s.append(prompt);
    const a = await s.generate({ maxTokens: 4, stopAtEos: false });
    await s.append([65, 66]);
    const b = await s.generate({ maxTokens: 4, stopAtEos: false });
    const files = await openModel(dir);
    const want = generateGreedy(files, [...prompt, ...a.tokens, 65, 66], { maxTokens: 4 }).tokens;
    files.close();
    expect(b.tokens).toEqual(want);
    s.close();
  });

  /** The template's rendering of `messages`, encoded, with the assistant message's content as the `answer` tokens. */
  function rendered(messages: { role: string; content: string }[], answer: number[]): number[] {
    const tok = model.tokenizer!;
    const mark = "ANSWER_HERE";
    const text = tok.applyChatTemplate(messages.map((m) => (m.role === "assistant" ? { ...m, content: mark } : m)), { addGenerationPrompt: true });
    const [before, after] = text.split(mark) as [string, string];
    return [...tok.encode(before, { addSpecialTokens: false }), ...answer, ...tok.encode(after, { addSpecialTokens: false })];
  }

  test("a chat turn after an answer that stopped on length closes the assistant turn as the template does", async () => {
    const s = model.session();
    await s.append([{ role: "user", content: "hi" }]);
    const a = await s.generate({ maxTokens: 5, stopAtEos: false });
    expect(a.finishReason).toBe("length");
    await s.append([{ role: "user", content: "more" }]);
    const conversation = [{ role: "user", content: "hi" }, { role: "assistant", content: "" }, { role: "user", content: "more" }];
    expect(s.tokens).toEqual(rendered(conversation, a.tokens));
    const after = s.tokens.slice(model.encode([{ role: "user", content: "hi" }]).length + a.tokens.length);
    expect(model.tokenizer!.decode(after, { skipSpecialTokens: false })).toBe("<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n");
    // and generation continues from there as it would over the whole rendering at once
    const b = await s.generate({ maxTokens: 4, stopAtEos: false });
    const files = await openModel(dir);
    expect(b.tokens).toEqual(generateGreedy(files, rendered(conversation, a.tokens), { maxTokens: 4 }).tokens);
    files.close();
    s.close();
    // a session resumed from a checkpoint taken inside the answer closes the turn the same way
    const t = model.session();
    await t.append([{ role: "user", content: "hi" }]);
    await t.generate({ maxTokens: 5, stopAtEos: false });
    const resumed = model.session({ from: t.checkpoint() });
    t.close();
    await resumed.append([{ role: "user", content: "more" }]);
    expect(resumed.tokens).toEqual(rendered(conversation, a.tokens));
    resumed.close();
  });

  test("an answer that ended with the end-of-turn token gets only the rest of the turn's close; raw appends add nothing", async () => {
    const imEnd = model.tokenizer!.encode("<|im_end|>", { addSpecialTokens: false });
    expect(imEnd).toHaveLength(1);
    const newline = model.tokenizer!.encode("\n", { addSpecialTokens: false });
    expect(model.turnEnd([65, imEnd[0]!])).toEqual(newline);
    expect(model.turnEnd([65])).toEqual([...imEnd, ...newline]);
    expect(model.turnEnd([])).toEqual([...imEnd, ...newline]);
    const s = model.session();
    await s.append([{ role: "user", content: "hi" }]);
    await s.append([65, ...imEnd, ...newline]); // the caller writes the markup itself
    const before = s.tokens.length;
    await s.append([{ role: "user", content: "more" }]);
    expect(s.tokens.slice(before)).toEqual(model.encode([{ role: "user", content: "more" }]));
    s.close();
  });

  test("reset() starts over", async () => {
    const s = model.session();
    await s.append([1, 2, 3]);
    await s.generate({ maxTokens: 3, stopAtEos: false });
    s.reset();
    expect(s.tokens).toEqual([]);
    await s.append(prompt);
    expect((await s.generate({ maxTokens: 6, stopAtEos: false })).tokens).toEqual(await expected(6));
    await expect(s.generate({ maxTokens: -1 })).rejects.toThrow(/maxTokens/);
    s.close();
    await expect(s.append([1])).rejects.toThrow(/closed/);
  });

  test("a closed model refuses new sessions; an unknown backend is a clear error", async () => {
    const m = await Model.load(dir, { backend: "reference" });
    await m.close();
    expect(() => m.session()).toThrow(/closed/);
    await expect(Model.load(dir, { backend: "nope" as never })).rejects.toThrow(/backend "nope"/);
  });
});
