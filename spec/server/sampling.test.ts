// Sampling parameters and log probabilities through the official openai client: the server
// passes them to the library (the same text as model.generate with the same options), the
// same seed gives the same text, and logprobs come back in OpenAI's shapes.
import { describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { clientFor, servedModel, startServer } from "./harness.ts";
import { BACKEND } from "../selected-backend.ts";

const fx = servedModel();
const messages = [{ role: "user" as const, content: "Write a function" }];

describe("sampling parameters", () => {
  test("temperature 0.7 with a seed: 200, reproducible, and the library's own sample", async () => {
    const ask = (seed: number) => fx.client.chat.completions.create({ model: fx.server.modelId, messages, max_tokens: 8, temperature: 0.7, seed });
    const a = await ask(11);
    const b = await ask(11);
    expect(b.choices[0]!.message.content).toBe(a.choices[0]!.message.content);
    const direct = await fx.model.generate(messages, { maxTokens: 8, temperature: 0.7, seed: 11 });
    expect(a.choices[0]!.message.content).toBe(direct.text);
    // other seeds draw other texts (the tiny model is far from certain at T = 0.7)
    const others = await Promise.all([12, 13].map(async (s) => (await ask(s)).choices[0]!.message.content));
    expect(others.some((t) => t !== a.choices[0]!.message.content)).toBe(true);
  });

  test("every knob reaches the sampler: top_k, top_p, min_p and the penalties, on completions too", async () => {
    const knobs = { temperature: 1.3, top_k: 7, top_p: 0.9, min_p: 0.02, presence_penalty: 0.4, frequency_penalty: 0.3, repetition_penalty: 1.2, seed: 5 };
    const lib = { temperature: 1.3, topK: 7, topP: 0.9, minP: 0.02, presencePenalty: 0.4, frequencyPenalty: 0.3, repetitionPenalty: 1.2, seed: 5 };
    const body = { model: fx.server.modelId, max_tokens: 10, ...knobs };
    const chat = await fx.client.chat.completions.create({ ...body, messages } as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(chat.choices[0]!.message.content).toBe((await fx.model.generate(messages, { maxTokens: 10, ...lib })).text);
    const prompt = "import os\n";
    const cmpl = await fx.client.completions.create({ ...body, prompt } as OpenAI.CompletionCreateParamsNonStreaming);
    expect(cmpl.choices[0]!.text).toBe((await fx.model.generate(prompt, { maxTokens: 10, ...lib })).text);
    // and each one matters: without the penalties the sample is another one
    const plain = await fx.model.generate(prompt, { maxTokens: 10, ...lib, presencePenalty: 0, frequencyPenalty: 0, repetitionPenalty: 1 });
    const withPenalties = await fx.model.generate(prompt, { maxTokens: 10, ...lib });
    expect(plain.tokens).not.toEqual(withPenalties.tokens);
  });

  test("streamed sampling equals non-streamed sampling with the same seed", async () => {
    const params = { model: fx.server.modelId, messages, max_tokens: 8, temperature: 0.9, top_p: 0.95, seed: 21 };
    const whole = await fx.client.chat.completions.create(params);
    let text = "";
    for await (const c of await fx.client.chat.completions.create({ ...params, stream: true })) text += c.choices[0]?.delta.content ?? "";
    expect(text).toBe(whole.choices[0]!.message.content!);
  });

  test("top_k -1 and 0 mean off, as in vLLM and llama.cpp", async () => {
    const base = { model: fx.server.modelId, messages, max_tokens: 6, temperature: 0.8, seed: 3 };
    const off = (await fx.client.chat.completions.create(base)).choices[0]!.message.content;
    for (const top_k of [-1, 0]) expect((await fx.client.chat.completions.create({ ...base, top_k } as never as OpenAI.ChatCompletionCreateParamsNonStreaming)).choices[0]!.message.content).toBe(off);
  });
});

describe("logprobs", () => {
  test("chat: one entry per completion token with its alternatives; greedy picks the most likely", async () => {
    const r = await fx.client.chat.completions.create({ model: fx.server.modelId, messages, max_tokens: 6, logprobs: true, top_logprobs: 3 });
    const content = r.choices[0]!.logprobs!.content!;
    expect(content).toHaveLength(r.usage!.completion_tokens);
    expect(content.map((e) => e.token).join("")).toBe(r.choices[0]!.message.content!);
    for (const e of content) {
      expect(e.logprob).toBeLessThanOrEqual(0);
      expect(e.top_logprobs).toHaveLength(3);
      expect(e.top_logprobs[0]!.token).toBe(e.token); // temperature 0: the argmax
      expect(e.top_logprobs[0]!.logprob).toBe(e.logprob);
      expect(e.top_logprobs[1]!.logprob).toBeLessThanOrEqual(e.top_logprobs[0]!.logprob);
      expect(e.bytes).toEqual(Array.from(new TextEncoder().encode(e.token)));
    }
    const direct = await fx.model.generate(messages, { maxTokens: 6, logprobs: true, topLogprobs: 3 });
    expect(content.map((e) => e.logprob)).toEqual(direct.logprobs!.map((e) => e.logprob));
  });

  test("chat streaming: the chunks' logprobs add up to the non-streamed ones", async () => {
    const params = { model: fx.server.modelId, messages, max_tokens: 6, logprobs: true, top_logprobs: 2 };
    const whole = await fx.client.chat.completions.create(params);
    const streamed: OpenAI.ChatCompletionTokenLogprob[] = [];
    for await (const c of await fx.client.chat.completions.create({ ...params, stream: true })) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
    expect(streamed).toEqual(whole.choices[0]!.logprobs!.content!);
  });

  test("completions: the legacy parallel arrays with text offsets", async () => {
    const r = await fx.client.completions.create({ model: fx.server.modelId, prompt: "import os\n", max_tokens: 5, logprobs: 2 });
    const lp = r.choices[0]!.logprobs!;
    expect(lp.tokens).toHaveLength(5);
    expect(lp.token_logprobs).toHaveLength(5);
    expect(lp.tokens!.join("")).toBe(r.choices[0]!.text);
    expect(lp.text_offset![0]).toBe(0);
    for (let i = 1; i < 5; i++) expect(lp.text_offset![i]).toBe(lp.text_offset![i - 1]! + lp.tokens![i - 1]!.length);
    for (const top of lp.top_logprobs!) expect(Object.keys(top).length).toBeGreaterThanOrEqual(1);
    // no logprobs unless asked
    const plain = await fx.client.completions.create({ model: fx.server.modelId, prompt: "import os\n", max_tokens: 2 });
    expect(plain.choices[0]!.logprobs).toBeNull();
  });
});

test("a server on the engine (the selected backend) samples the reference's text for the same seed", async () => {
  const { Model } = await import("../../lib/index.ts");
  const engine = await Model.load(undefined, { backend: BACKEND });
  const onEngine = startServer(engine);
  try {
    const c = clientFor(onEngine);
    const params = { model: onEngine.modelId, messages, max_tokens: 5, temperature: 0.7, top_k: 20, seed: 3 };
    const a = await c.chat.completions.create(params as OpenAI.ChatCompletionCreateParamsNonStreaming);
    const b = await fx.client.chat.completions.create(params as OpenAI.ChatCompletionCreateParamsNonStreaming);
    expect(a.choices[0]!.message.content).toBe(b.choices[0]!.message.content);
  } finally {
    await onEngine.stop();
    await engine.close();
  }
});
