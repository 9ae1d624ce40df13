// Serve a model over OpenAI's HTTP API from your own Bun app, ask it once, and stop:
// `bun examples/server.ts [MODEL_DIR]`. Any OpenAI client works against `${server.url}/v1`.
// (`cherenkov serve` does the same from the command line.)
import { createServer, Model } from "cherenkov";

const model = await Model.load(process.argv[2]);
const server = createServer({ model, port: 0, hostname: "127.0.0.1", log: (line) => console.error(line) });
console.log(`serving ${server.modelId} on ${server.url}/v1`);

const res = await fetch(`${server.url}/v1/chat/completions`, {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ messages: [{ role: "user", content: "Write a function" }], max_tokens: 24 }),
});
const reply = (await res.json()) as { choices: { message: { content: string } }[]; usage: object };
console.log(reply.choices[0]!.message.content);
console.log(reply.usage);

await server.stop();
await model.close();
