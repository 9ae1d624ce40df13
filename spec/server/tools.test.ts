// Tool calls through the model's own chat template: tools rendered into the prompt by the
// template, the model's <tool_call> blocks parsed into OpenAI tool_calls (streamed and not),
// tool results sent back in the history; refused when the template does not render tools.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Ollama } from "ollama";
import OpenAI from "openai";
import { Model, type GenerationResult, type GenerateOptions, type Prompt, type StreamChunk } from "../../lib/index.ts";
import { main } from "../../lib/cli/main.ts";
import { encodeChat } from "../../lib/model/chat-encode.ts";
import { DEFAULT_MODEL_DIR } from "../../lib/model/default-model.ts";
import { parseToolCalls, ToolCallSplitter } from "../../lib/server/tool-calls.ts";
import { clientFor, expectError, startServer, type TestServer } from "./harness.ts";

const weather: OpenAI.ChatCompletionTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};
const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: "Weather in Paris?" }];

describe("parsing the model's tool calls", () => {
  test("Qwen/Hermes JSON blocks, Qwen3-Coder XML blocks, content around them", () => {
    const a = parseToolCalls('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>');
    expect(a.content).toBe("");
    expect(a.calls.map((c) => [c.name, JSON.parse(c.arguments)])).toEqual([["get_weather", { city: "Paris" }]]);
    const b = parseToolCalls('Let me look.\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "g", "arguments": {"n": 2}}\n</tool_call>');
    expect(b.content).toBe("Let me look.\n\n");
    expect(b.calls.map((c) => c.name)).toEqual(["f", "g"]);
    expect(new Set(b.calls.map((c) => c.id)).size).toBe(2);
    const x = parseToolCalls("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>");
    expect(x.calls.map((c) => [c.name, JSON.parse(c.arguments)])).toEqual([["get_weather", { city: "Paris", days: 3 }]]);
  });

  test("a block that does not parse stays text; so does plain text", () => {
    expect(parseToolCalls("<tool_call>\n{not json}\n</tool_call>")).toEqual({ content: "<tool_call>\n{not json}\n</tool_call>", calls: [] });
    expect(parseToolCalls("no calls here")).toEqual({ content: "no calls here", calls: [] });
  });

  test("the stream splitter never releases a call's markup, even split across pieces", () => {
    const s = new ToolCallSplitter();
    const out = ["Sure", ". <tool", "_ca", 'll>\n{"name": "f", ', '"arguments": {"a": 1}}\n</tool_call>'].map((p) => s.push(p)).join("");
    expect(out).toBe("Sure. ");
    const end = s.finish();
    expect(end.calls.map((c) => [c.name, c.arguments])).toEqual([["f", '{"a":1}']]);
    const t = new ToolCallSplitter();
    expect(t.push("a <tool")).toBe("a ");
    expect(t.push("box>")).toBe("<toolbox>");
    expect(t.finish()).toEqual({ content: "", calls: [] });
  });
});

test("a model whose chat template does not render tools refuses them (400 tools_unsupported)", async () => {
  const model = await Model.load(undefined, { backend: "reference" });
  const server = startServer(model);
  try {
    const e = await expectError(await server.post("/v1/chat/completions", { messages, tools: [weather] }), 400);
    expect(e.code).toBe("tools_unsupported");
    expect(e.param).toBe("tools");
    // tool_choice "none" renders no tools, so it is fine; "required" cannot be honoured
    expect((await server.post("/v1/chat/completions", { messages, tools: [weather], tool_choice: "none", max_tokens: 1 })).status).toBe(200);
    expect((await expectError(await server.post("/v1/chat/completions", { messages, tools: [weather], tool_choice: "required" }), 400)).param).toBe("tool_choice");
  } finally {
    await server.stop();
    await model.close();
  }
});

describe("a model with a tool-rendering (Qwen-style) chat template", () => {
  let dir: string;
  let model: Model;
  let server: TestServer;
  let client: OpenAI;
  /** What the scripted model answers next (null: the real model generates). */
  let script: string | null = null;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "cherenkov-tools-"));
    for (const f of ["cherenkov.json", "dense.bin", "experts.bin", "ple.bin", "tokenizer.json"]) copyFileSync(join(DEFAULT_MODEL_DIR, f), join(dir, f));
    copyFileSync(join(import.meta.dir, "fixtures/tools-tokenizer_config.json"), join(dir, "tokenizer_config.json"));
    // a deliberate edit of the sealed model's template: recorded as docs/format.md says
    expect(await main(["seal", dir], { stdout: () => {}, stderr: () => {}, stderrIsTTY: false })).toBe(0);
    model = await Model.load(dir, { backend: "reference" });
    // The tiny model never learned to call tools: a scripted answer stands in for its output
    // (the tokens of the script, streamed as the library streams), the rest is the real path.
    const real = model.stream.bind(model);
    const scripted = Object.create(model) as Model;
    scripted.stream = async function* (prompt: Prompt, opts: GenerateOptions = {}): AsyncGenerator<StreamChunk, GenerationResult> {
      if (script === null) return yield* real(prompt, opts);
      const tokens = model.encode(script);
      let text = "";
      for (let i = 0; i < tokens.length; i++) {
        const piece = model.decode(tokens.slice(0, i + 1)).slice(text.length);
        text += piece;
        yield { token: tokens[i]!, text: piece };
      }
      return { text, tokens, finishReason: "eos", usage: { promptTokens: model.encode(prompt).length, completionTokens: tokens.length }, timings: { prefillMs: 1, decodeMs: 1, tokensPerSecond: 1 } };
    };
    server = startServer(scripted, { cachePrompt: false }); // the prompt cache runs sessions, not the scripted stream()
    client = clientFor(server);
  });
  afterAll(async () => {
    await server.stop();
    await model.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test("the tools are rendered by the template into the prompt", async () => {
    script = null;
    const r = await client.chat.completions.create({ model: server.modelId, messages, tools: [weather], max_tokens: 1 });
    const ids = encodeChat(model.tokenizer!, [{ role: "user", content: "Weather in Paris?" }], { tools: [weather] });
    expect(r.usage!.prompt_tokens).toBe(ids.length);
    const text = model.tokenizer!.decode(ids);
    expect(text).toContain("<tools>\n");
    expect(text).toContain('"name": "get_weather"');
    expect(ids.length).toBeGreaterThan(model.encode([{ role: "user", content: "Weather in Paris?" }]).length);
  });

  test("the model's <tool_call> becomes tool_calls with finish_reason tool_calls", async () => {
    script = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    const r = await client.chat.completions.create({ model: server.modelId, messages, tools: [weather] });
    const m = r.choices[0]!.message;
    expect(r.choices[0]!.finish_reason).toBe("tool_calls");
    expect(m.content).toBeNull();
    expect(m.tool_calls).toHaveLength(1);
    const call = m.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    expect(call.type).toBe("function");
    expect(call.id).toMatch(/^call_/);
    expect(call.function.name).toBe("get_weather");
    expect(JSON.parse(call.function.arguments)).toEqual({ city: "Paris" });
  });

  test("streamed: content before the call, then the call as a tool_calls delta; no markup as content", async () => {
    script = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    const stream = await client.chat.completions.create({ model: server.modelId, messages, tools: [weather], stream: true });
    let content = "";
    const calls: OpenAI.ChatCompletionChunk.Choice.Delta.ToolCall[] = [];
    const finish: string[] = [];
    for await (const c of stream) {
      content += c.choices[0]?.delta.content ?? "";
      calls.push(...(c.choices[0]?.delta.tool_calls ?? []));
      if (c.choices[0]?.finish_reason) finish.push(c.choices[0].finish_reason);
    }
    expect(content).toBe("Checking.\n");
    expect(calls).toHaveLength(1);
    expect(calls[0]!.index).toBe(0);
    expect(calls[0]!.function!.name).toBe("get_weather");
    expect(JSON.parse(calls[0]!.function!.arguments!)).toEqual({ city: "Paris" });
    expect(finish).toEqual(["tool_calls"]);
  });

  test("without tools in the request, the same text is plain content", async () => {
    script = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>';
    const r = await client.chat.completions.create({ model: server.modelId, messages });
    expect(r.choices[0]!.message.content).toBe(script);
    expect(r.choices[0]!.message.tool_calls).toBeUndefined();
  });

  test("the call and its result go back in the history, rendered by the template", async () => {
    script = null;
    const history: OpenAI.ChatCompletionMessageParam[] = [
      ...messages,
      { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
      { role: "tool", tool_call_id: "call_1", content: "18 C, sunny" },
    ];
    const r = await client.chat.completions.create({ model: server.modelId, messages: history, tools: [weather], max_tokens: 1 });
    const text = model.tokenizer!.applyChatTemplate(
      [
        { role: "user", content: "Weather in Paris?" },
        { role: "assistant", content: "", tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: { city: "Paris" } } }] },
        { role: "tool", content: "18 C, sunny", tool_call_id: "call_1" },
      ],
      { addGenerationPrompt: true, tools: [weather] },
    );
    expect(text).toContain('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>');
    expect(text).toContain("<tool_response>\n18 C, sunny\n</tool_response>");
    expect(r.usage!.prompt_tokens).toBe(model.tokenizer!.encode(text, { addSpecialTokens: false }).length);
  });

  test("/v1/responses: function tools in, function_call items out, streamed and not; results back as input items", async () => {
    const tool: OpenAI.Responses.FunctionTool = { type: "function", name: "get_weather", description: "The weather in a city", parameters: weather.function.parameters!, strict: false };
    script = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    const r = await client.responses.create({ model: server.modelId, input: "Weather in Paris?", tools: [tool] });
    expect(r.status).toBe("completed");
    const calls = r.output.filter((o): o is OpenAI.Responses.ResponseFunctionToolCall => o.type === "function_call");
    expect(r.output).toHaveLength(1);
    expect(calls.map((c) => [c.name, JSON.parse(c.arguments)])).toEqual([["get_weather", { city: "Paris" }]]);
    expect(calls[0]!.call_id).toMatch(/^call_/);
    const streamed = await client.responses.stream({ model: server.modelId, input: "Weather in Paris?", tools: [tool] }).finalResponse();
    const sc = streamed.output.filter((o) => o.type === "function_call") as unknown as OpenAI.Responses.ResponseFunctionToolCall[];
    expect(sc.map((c) => [c.name, JSON.parse(c.arguments)])).toEqual([["get_weather", { city: "Paris" }]]);
    // the call and its output sent back: rendered as the chat history would be
    script = null;
    const next = await client.responses.create({
      model: server.modelId,
      tools: [tool],
      max_output_tokens: 1,
      input: [
        { role: "user", content: "Weather in Paris?" },
        { type: "function_call", call_id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' },
        { type: "function_call_output", call_id: "call_1", output: "18 C, sunny" },
      ],
    });
    const chat = await client.chat.completions.create({
      model: server.modelId,
      tools: [weather],
      max_tokens: 1,
      messages: [
        ...messages,
        { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
        { role: "tool", tool_call_id: "call_1", content: "18 C, sunny" },
      ],
    });
    expect(next.usage!.input_tokens).toBe(chat.usage!.prompt_tokens);
  });

  // Issue 21 item 10: Ollama's /api/chat answers a call as message.tool_calls, arguments an object.
  test("Ollama's /api/chat: tools in, message.tool_calls out, streamed and not", async () => {
    const ollama = new Ollama({ host: server.url });
    script = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
    const tools = [{ type: "function", function: { name: "get_weather", description: "Current weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }];
    const r = await ollama.chat({ model: server.modelId, messages: [{ role: "user", content: "Weather in Paris?" }], tools });
    expect(r.message.content).toBe("Checking.\n");
    expect(r.message.tool_calls).toEqual([{ function: { name: "get_weather", arguments: { city: "Paris" } } }]);
    let content = "";
    const calls: unknown[] = [];
    for await (const part of await ollama.chat({ model: server.modelId, messages: [{ role: "user", content: "Weather in Paris?" }], tools, stream: true })) {
      content += part.message.content;
      calls.push(...(part.message.tool_calls ?? []));
    }
    expect(content).toBe("Checking.\n");
    expect(calls).toEqual([{ function: { name: "get_weather", arguments: { city: "Paris" } } }]);
  });
});
