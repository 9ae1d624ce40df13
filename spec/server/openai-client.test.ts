// The happy paths through the official `openai` client: what a user's application sees.
import { describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { clientFor, servedModel, startServer } from "./harness.ts";

const fx = servedModel();
const messages = [
  { role: "system" as const, content: "You write Python." },
  { role: "user" as const, content: "Write a function" },
];

async function streamChat(params: Omit<OpenAI.ChatCompletionCreateParamsStreaming, "model" | "stream">) {
  const stream = await fx.client.chat.completions.create({ model: fx.server.modelId, stream: true, ...params });
  const chunks: OpenAI.ChatCompletionChunk[] = [];
  for await (const c of stream) chunks.push(c);
  const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
  const finish = chunks.map((c) => c.choices[0]?.finish_reason).filter((f) => f != null);
  return { chunks, text, finish };
}

describe("models", () => {
  test("list and retrieve name the loaded model", async () => {
    const list = await fx.client.models.list();
    expect(list.data.map((m) => m.id)).toEqual(["qwen4-exp-tiny"]);
    expect(list.data[0]!.owned_by).toBe("cherenkov");
    const one = await fx.client.models.retrieve("qwen4-exp-tiny");
    expect(one.id).toBe("qwen4-exp-tiny");
  });
});

describe("chat completions", () => {
  test("non-streaming: the library's greedy text for the templated messages, usage and finish_reason", async () => {
    const r = await fx.client.chat.completions.create({ model: fx.server.modelId, messages, max_tokens: 12 });
    const direct = await fx.model.generate(messages, { maxTokens: 12 });
    expect(r.object).toBe("chat.completion");
    expect(r.model).toBe("qwen4-exp-tiny");
    expect(r.choices).toHaveLength(1);
    expect(r.choices[0]!.message.role).toBe("assistant");
    expect(r.choices[0]!.message.content).toBe(direct.text);
    expect(r.choices[0]!.message.content!.length).toBeGreaterThan(0);
    expect(r.choices[0]!.finish_reason).toBe("length");
    expect(r.usage).toEqual({ prompt_tokens: fx.model.encode(messages).length, completion_tokens: 12, total_tokens: fx.model.encode(messages).length + 12 });
  });

  test("streaming: the streamed text equals the non-streamed text; role first, finish last, usage chunk", async () => {
    const whole = await fx.client.chat.completions.create({ model: fx.server.modelId, messages, max_completion_tokens: 10 });
    const s = await streamChat({ messages, max_completion_tokens: 10, stream_options: { include_usage: true } });
    expect(s.text).toBe(whole.choices[0]!.message.content!);
    expect(s.chunks[0]!.choices[0]!.delta.role).toBe("assistant");
    expect(s.chunks.every((c) => c.object === "chat.completion.chunk" && c.id === s.chunks[0]!.id)).toBe(true);
    expect(s.finish).toEqual(["length"]);
    const last = s.chunks[s.chunks.length - 1]!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toEqual(whole.usage);
  });

  test("a stop string spanning tokens ends the text before it, streamed and not", async () => {
    const free = await fx.model.generate(messages, { maxTokens: 12 });
    const full = free.text;
    // a stop string made of the last 2 characters of one token and the first 2 of the next
    const ends = free.tokens.map((_, i) => fx.model.decode(free.tokens.slice(0, i + 1)).length);
    const i = ends.findIndex((end, i) => i > 0 && end - ends[i - 1]! >= 2 && (ends[i + 1] ?? 0) - end >= 2);
    expect(i).toBeGreaterThan(0);
    const stop = full.slice(ends[i]! - 2, ends[i]! + 2);
    const cut = full.slice(0, full.indexOf(stop));
    expect(cut.length).toBeGreaterThan(0);
    const whole = await fx.client.chat.completions.create({ model: fx.server.modelId, messages, max_tokens: 12, stop: [stop] });
    expect(whole.choices[0]!.message.content).toBe(cut);
    expect(whole.choices[0]!.finish_reason).toBe("stop");
    const s = await streamChat({ messages, max_tokens: 12, stop });
    expect(s.text).toBe(cut);
    expect(s.finish).toEqual(["stop"]);
  });

  test("temperature 0, top_p 1, n 1 and a seed are accepted (they do not change greedy output)", async () => {
    const a = await fx.client.chat.completions.create({ model: fx.server.modelId, messages, max_tokens: 6 });
    const b = await fx.client.chat.completions.create({ model: fx.server.modelId, messages, max_tokens: 6, temperature: 0, top_p: 1, n: 1, seed: 7 });
    expect(b.choices[0]!.message.content).toBe(a.choices[0]!.message.content);
  });
});

describe("completions", () => {
  const prompt = "import os\n";

  test("a text prompt and the same prompt as token ids give the library's text", async () => {
    const direct = await fx.model.generate(prompt, { maxTokens: 10 });
    const a = await fx.client.completions.create({ model: fx.server.modelId, prompt, max_tokens: 10 });
    const b = await fx.client.completions.create({ model: fx.server.modelId, prompt: fx.model.encode(prompt), max_tokens: 10 });
    expect(a.object).toBe("text_completion");
    expect(a.choices[0]!.text).toBe(direct.text);
    expect(b.choices[0]!.text).toBe(direct.text);
    expect(a.choices[0]!.finish_reason).toBe("length");
    expect(a.usage).toEqual({ prompt_tokens: fx.model.encode(prompt).length, completion_tokens: 10, total_tokens: fx.model.encode(prompt).length + 10 });
  });

  test("streaming equals non-streaming, with echo and a stop string", async () => {
    const params = { model: fx.server.modelId, prompt, max_tokens: 16, stop: "\n", echo: true };
    const whole = await fx.client.completions.create(params);
    const stream = await fx.client.completions.create({ ...params, stream: true });
    let text = "";
    const finish: string[] = [];
    for await (const c of stream) {
      text += c.choices[0]?.text ?? "";
      if (c.choices[0]?.finish_reason) finish.push(c.choices[0].finish_reason);
    }
    expect(whole.choices[0]!.text.startsWith(prompt)).toBe(true);
    expect(whole.choices[0]!.text.slice(prompt.length)).not.toContain("\n");
    expect(whole.choices[0]!.finish_reason).toBe("stop");
    expect(text).toBe(whole.choices[0]!.text);
    expect(finish).toEqual(["stop"]);
  });
});

describe("speculative decoding", () => {
  for (const drafts of [2, "auto"] as const) {
    test(`a server with drafts ${drafts} answers with the same text as plain greedy`, async () => {
      const before = fx.model.stats().drafts.proposed;
      const drafting = startServer(fx.model, { drafts });
      try {
        const c = clientFor(drafting);
        const a = await fx.client.completions.create({ model: fx.server.modelId, prompt: "import os\n", max_tokens: 12 });
        const b = await c.completions.create({ model: fx.server.modelId, prompt: "import os\n", max_tokens: 12 });
        expect(b.choices[0]!.text).toBe(a.choices[0]!.text);
        // auto tries every count once before it settles, so both propose drafts here
        const stats = (await (await drafting.get("/v1/stats")).json()) as { drafts: { proposed: number } };
        expect(stats.drafts.proposed).toBeGreaterThan(before);
      } finally {
        await drafting.stop();
      }
    });
  }
});
