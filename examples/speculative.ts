// Speculative decoding with the model's MTP head: the tokens are the same as plain greedy,
// only the number of steps changes. `bun examples/speculative.ts [MODEL_DIR]`.
import { Model } from "cherenkov";

const model = await Model.load(process.argv[2]);
const plain = await model.generate("class Stack:\n", { maxTokens: 48 });
const fast = await model.generate("class Stack:\n", { maxTokens: 48, drafts: 2 });
console.log(fast.text);
console.log(`same tokens: ${JSON.stringify(plain.tokens) === JSON.stringify(fast.tokens)}`);
console.log(`drafts accepted: ${fast.drafts?.accepted} of ${fast.drafts?.proposed}`);
await model.close();
