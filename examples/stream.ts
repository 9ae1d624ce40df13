// Stream tokens as they are generated, and stop after two seconds with an AbortSignal:
// `bun examples/stream.ts [MODEL_DIR]`.
import { Model } from "cherenkov";

const model = await Model.load(process.argv[2]);
const signal = AbortSignal.timeout(2000);
try {
  for await (const chunk of model.stream("import os\n", { maxTokens: 200, signal })) process.stdout.write(chunk.text);
} catch (e) {
  if ((e as Error).name !== "AbortError" && (e as Error).name !== "TimeoutError") throw e;
  process.stdout.write("\n[stopped]");
}
process.stdout.write("\n");
await model.close();
