// Generate a continuation with the embedded default model (or a model directory given as
// the first argument): `bun examples/generate.ts [MODEL_DIR] [PROMPT]`.
import { Model } from "cherenkov";

const [dir, prompt = "def fibonacci(n):"] = process.argv.slice(2);
const model = await Model.load(dir);
const result = await model.generate(prompt, { maxTokens: 48 });
console.log(prompt + result.text);
console.error(`${result.usage.completionTokens} tokens, ${result.timings.tokensPerSecond.toFixed(1)} tok/s on ${model.backendName}`);
await model.close();
