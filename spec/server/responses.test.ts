// /v1/responses (OpenAI's Responses API, the Vercel AI SDK's default) through the official
// openai client: text in, output_text out, streamed and not, with the same text as the library.
import { describe, expect, test } from "bun:test";
import OpenAI from "openai";
import { expectError, servedModel } from "./harness.ts";

const fx = servedModel();
const question = "Write a function";

describe("non-streaming", () => {
  test("a string input: the library's text for one user turn, usage, incomplete at max_output_tokens", async () => {
    const r = await fx.client.responses.create({ model: fx.server.modelId, input: question, max_output_tokens: 8 });
    const direct = await fx.model.generate([{ role: "user", content: question }], { maxTokens: 8 });
    expect(r.object).toBe("response");
    expect(r.id).toMatch(/^resp_/);
    expect(r.output_text).toBe(direct.text);
    expect(r.output).toHaveLength(1);
    const item = r.output[0] as OpenAI.Responses.ResponseOutputMessage;
    expect(item.type).toBe("message");
    expect(item.role).toBe("assistant");
    expect(item.content[0]!.type).toBe("output_text");
    expect(r.status).toBe("incomplete");
    expect(r.incomplete_details).toEqual({ reason: "max_output_tokens" });
    const prompt = fx.model.encode([{ role: "user", content: question }]).length;
    expect(r.usage).toMatchObject({ input_tokens: prompt, output_tokens: 8, total_tokens: prompt + 8 });
  });

  test("instructions and message items (input_text parts, an assistant turn) go through the template", async () => {
    const input: OpenAI.Responses.ResponseInput = [
      { role: "user", content: [{ type: "input_text", text: "Hi" }] },
      { role: "assistant", content: "Hello." },
      { role: "user", content: question },
    ];
    const r = await fx.client.responses.create({ model: fx.server.modelId, instructions: "You write Python.", input, max_output_tokens: 6 });
    const direct = await fx.model.generate(
      [
        { role: "system", content: "You write Python." },
        { role: "user", content: "Hi" },
        { role: "assistant", content: "Hello." },
        { role: "user", content: question },
      ],
      { maxTokens: 6 },
    );
    expect(r.output_text).toBe(direct.text);
    expect(r.instructions).toBe("You write Python.");
  });

  test("sampling: temperature with a seed (extension) is the library's sample", async () => {
    const r = await fx.client.responses.create({ model: fx.server.modelId, input: question, max_output_tokens: 6, temperature: 0.8, top_p: 0.9, seed: 4 } as OpenAI.Responses.ResponseCreateParamsNonStreaming);
    const direct = await fx.model.generate([{ role: "user", content: question }], { maxTokens: 6, temperature: 0.8, topP: 0.9, seed: 4 });
    expect(r.output_text).toBe(direct.text);
  });
});

test("log probabilities with include message.output_text.logprobs, streamed and not", async () => {
  const params = { model: fx.server.modelId, input: question, max_output_tokens: 4, include: ["message.output_text.logprobs" as const], top_logprobs: 2 };
  const r = await fx.client.responses.create(params);
  const part = (r.output[0] as OpenAI.Responses.ResponseOutputMessage).content[0] as OpenAI.Responses.ResponseOutputText;
  expect(part.logprobs).toHaveLength(4);
  expect(part.logprobs!.map((l) => l.token).join("")).toBe(r.output_text);
  for (const l of part.logprobs!) expect(l.top_logprobs).toHaveLength(2);
  const deltas: OpenAI.Responses.ResponseTextDeltaEvent.Logprob[] = [];
  for await (const e of await fx.client.responses.create({ ...params, stream: true })) if (e.type === "response.output_text.delta") deltas.push(...e.logprobs);
  expect(deltas.map((l) => l.logprob)).toEqual(part.logprobs!.map((l) => l.logprob));
});

describe("streaming", () => {
  test("the events in OpenAI's order; the deltas add up to the final text", async () => {
    const whole = await fx.client.responses.create({ model: fx.server.modelId, input: question, max_output_tokens: 8 });
    const events: OpenAI.Responses.ResponseStreamEvent[] = [];
    for await (const e of await fx.client.responses.create({ model: fx.server.modelId, input: question, max_output_tokens: 8, stream: true })) events.push(e);
    const types = events.map((e) => e.type);
    expect(types.slice(0, 4)).toEqual(["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]);
    expect(types.slice(-4)).toEqual(["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const text = events.flatMap((e) => (e.type === "response.output_text.delta" ? [e.delta] : [])).join("");
    expect(text).toBe(whole.output_text);
    const done = events.find((e) => e.type === "response.output_text.done") as OpenAI.Responses.ResponseTextDoneEvent;
    expect(done.text).toBe(whole.output_text);
    const last = events[events.length - 1] as OpenAI.Responses.ResponseIncompleteEvent;
    expect(last.response.usage).toEqual(whole.usage);
  });

  test("the client's stream helper assembles the same response", async () => {
    const whole = await fx.client.responses.create({ model: fx.server.modelId, input: question, max_output_tokens: 5 });
    const stream = fx.client.responses.stream({ model: fx.server.modelId, input: question, max_output_tokens: 5 });
    const final = await stream.finalResponse();
    expect(final.output_text).toBe(whole.output_text);
  });
});

describe("refusals", () => {
  test("previous_response_id, unknown items and non-text formats are 400 naming the field", async () => {
    const post = (body: unknown) => fx.server.post("/v1/responses", body);
    expect((await expectError(await post({ input: "x", previous_response_id: "resp_1" }), 400)).param).toBe("previous_response_id");
    expect((await expectError(await post({ input: [{ type: "input_image", image_url: "x" }] }), 400)).param).toBe("input[0].type");
    expect((await expectError(await post({ input: [{ role: "user", content: [{ type: "input_image" }] }] }), 400)).param).toBe("input[0].content[0].type");
    expect((await expectError(await post({ input: "x", text: { format: { type: "json_object" } } }), 400)).param).toBe("text");
    expect((await expectError(await post({}), 400)).message).toBe("input: is required");
  });
});

describe("item_reference (clients that rely on OpenAI storing responses, e.g. the Vercel AI SDK's default store: true)", () => {
  test("an earlier answer's message item, sent back as a reference, is the same turn as its text", async () => {
    const first = await fx.client.responses.create({ model: fx.server.modelId, input: question, max_output_tokens: 4 });
    const item = first.output[0] as OpenAI.Responses.ResponseOutputMessage;
    expect((first as unknown as { store: boolean }).store).toBe(true);
    const follow = (prev: OpenAI.Responses.ResponseInputItem) =>
      fx.client.responses.create({ model: fx.server.modelId, max_output_tokens: 3, input: [{ role: "user", content: question }, prev, { role: "user", content: "More" }] });
    const byRef = await follow({ type: "item_reference", id: item.id });
    const inline = await follow({ role: "assistant", content: first.output_text });
    expect(byRef.usage!.input_tokens).toBe(inline.usage!.input_tokens);
    expect(byRef.output_text).toBe(inline.output_text);
  });

  test("an unknown reference, or one of a store: false response, is a 400 that says what to do", async () => {
    const e = await expectError(await fx.server.post("/v1/responses", { input: [{ type: "item_reference", id: "msg_unknown" }] }), 400);
    expect(e.param).toBe("input[0].id");
    expect(e.message).toContain("store: false");
    const unstored = await fx.client.responses.create({ model: fx.server.modelId, input: question, max_output_tokens: 2, store: false });
    expect((unstored as unknown as { store: boolean }).store).toBe(false);
    const id = (unstored.output[0] as OpenAI.Responses.ResponseOutputMessage).id;
    await expectError(await fx.server.post("/v1/responses", { input: [{ type: "item_reference", id }] }), 400);
  });
});
