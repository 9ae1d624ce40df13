// Child process of the fuzz suite: runs cases [from, from + count) of a seed against a clean
// model directory and prints one JSON line per case start and end, so the parent can tell a
// crash or a hang (no end line) from a result. Each case goes through `cherenkov inspect
// --verify`, the reference backend and the CPU engine.
import { cpSync, readFileSync, rmSync } from "node:fs";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import { main } from "../../lib/cli/main.ts";
import { fileSizes, fuzzCase } from "./cases.ts";

export type Outcome = "unchanged" | "error" | "different" | "unclean";
export interface Baseline {
  prompt: number[];
  tokens: number[];
  chat: number[];
}

const [base, seedArg, fromArg, countArg, work] = process.argv.slice(2) as [string, string, string, string, string];
const baseline = JSON.parse(readFileSync(join(work, "baseline.json"), "utf8")) as Baseline;
const manifest = JSON.parse(readFileSync(join(base, "cherenkov.json"), "utf8"));
const sizes = fileSizes(base);
const LIMIT_MS = 20_000;

/** A clean error names what is wrong: a model file, the chat template, or a layer. */
const CLEAN = /^(cherenkov\.json|dense\.bin|experts\.bin|ple\.bin|tokenizer\.json|tokenizer_config\.json|chat template|invalid model config|layer \d+|the output logits|the MTP head)|\/(cherenkov\.json|dense\.bin|experts\.bin|ple\.bin|tokenizer\.json)\b/;

function classify(e: unknown): { outcome: Outcome; message: string } {
  const message = e instanceof Error ? `${e.name}: ${e.message.split("\n")[0]}` : String(e);
  const text = e instanceof Error ? e.message : "";
  return { outcome: e instanceof Error && CLEAN.test(text) ? "error" : "unclean", message };
}

function within<T>(p: Promise<T>, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout>;
  return Promise.race([p, new Promise<never>((_, rej) => (timer = setTimeout(() => rej(new Error(`HANG: ${what} took over ${LIMIT_MS} ms`)), LIMIT_MS)))]).finally(() =>
    clearTimeout(timer),
  );
}

async function inspect(dir: string): Promise<{ outcome: Outcome; message: string }> {
  let err = "";
  const rc = await main(["inspect", dir, "--verify"], { stdout: () => {}, stderr: (s: string) => void (err += s), stderrIsTTY: false } as never);
  if (rc === 0) return { outcome: "unchanged", message: "" };
  const line = err.replace(/^cherenkov inspect: /, "").split("\n")[0]!;
  // An error the CLI did not recognise is printed with its stack.
  return { outcome: /\n\s+at /.test(err) || !CLEAN.test(line) ? "unclean" : "error", message: line };
}

async function run(dir: string, backend: "reference" | "cpu"): Promise<{ outcome: Outcome; message: string }> {
  let model: Model | null = null;
  try {
    model = await within(Model.load(dir, { backend, engine: { prefault: false } }), `${backend} load`);
    const g = await within(model.generate(baseline.prompt, { maxTokens: baseline.tokens.length, stopAtEos: false }), `${backend} generate`);
    const chat = backend === "reference" ? model.encode([{ role: "user", content: "hi" }]) : baseline.chat;
    const same = JSON.stringify(g.tokens) === JSON.stringify(baseline.tokens) && JSON.stringify(chat) === JSON.stringify(baseline.chat);
    return same ? { outcome: "unchanged", message: "" } : { outcome: "different", message: `tokens ${g.tokens} (want ${baseline.tokens}), chat ${chat.length} ids` };
  } catch (e) {
    return classify(e);
  } finally {
    await model?.close().catch(() => {});
  }
}

const seed = Number(seedArg);
for (let i = Number(fromArg); i < Number(fromArg) + Number(countArg); i++) {
  const c = fuzzCase(seed, i, sizes, manifest);
  const dir = join(work, `case${i}`);
  cpSync(base, dir, { recursive: true });
  console.log(JSON.stringify({ start: i, what: c.what }));
  c.apply(dir);
  const result = { inspect: await inspect(dir), reference: await run(dir, "reference"), cpu: await run(dir, "cpu") };
  rmSync(dir, { recursive: true, force: true });
  console.log(JSON.stringify({ end: i, what: c.what, ...result }));
}
process.exit(0);
