// A conversation that grows: each turn is appended to one session, so the model never
// re-reads what it already saw. `bun examples/session.ts [MODEL_DIR]`.
import { Model } from "cherenkov";

const model = await Model.load(process.argv[2]);
const chat = model.session();
for (const question of ["What is a list?", "And a tuple?"]) {
  await chat.append([{ role: "user", content: question }]);
  const answer = await chat.generate({ maxTokens: 40, stop: ["<|im_end|>"] });
  console.log(`> ${question}\n${answer.text}\n`);
}
console.log(JSON.stringify(model.stats(), null, 2));
chat.close();
await model.close();
