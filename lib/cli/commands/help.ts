// Usage text of every command, shown by `cherenkov help [command]` and `--help`.
import type { FlagSpec } from "../args.ts";
import { BUILD_FLAGS, buildUsage } from "./build.ts";
import { CHAT_FLAGS, chatUsage } from "./chat.ts";
import { COMPARE_FLAGS, compareUsage } from "./compare.ts";
import { CONVERT_FLAGS, convertUsage } from "./convert.ts";
import { DOCTOR_FLAGS, doctorUsage } from "./doctor.ts";
import { INSPECT_FLAGS } from "./inspect.ts";
import { RUN_FLAGS, runUsage } from "./run.ts";
import { SEAL_FLAGS } from "./seal.ts";
import { SERVE_FLAGS, serveUsage } from "./serve.ts";
import { SYNTH_FLAGS } from "./synth.ts";

export const usage: Record<string, string> = {
  convert: convertUsage,
  serve: serveUsage,
  synth: `cherenkov synth --preset NAME --out DIR [options]
  Writes a seeded random qwen4-exp model (every feature on unless switched off).
    --preset tiny|small|30b-a3b-shape|80b-a3b-shape  the model's size and shape
    --seed N            random seed (default 0); the same seed gives the same bytes
    --out DIR           model directory to write (created; must be empty unless --force)
    --dtype q4|bf16|f32  weight storage (default q4)
    --no-hc --no-qsa --no-ple --no-mtp   switch a feature off (n = 1, dense attention, ...)
    --kv f32|q8         attention KV cache type recorded in the config (default q8)
    --progress          draw the progress bar even when stderr is not a terminal
    --force             write into a non-empty DIR, replacing its model files`,
  inspect: `cherenkov inspect DIR [--json] [--verify] [--progress]
  Prints a model's config, files, expert record layout and tensor table.
    --json      one JSON object instead of the tables
    --verify    check every checksum (tensors, expert records, PLE tables)
    --progress  draw the verify progress bar even when stderr is not a terminal`,
  seal: `cherenkov seal DIR
  After a deliberate edit of tokenizer.json or tokenizer_config.json (e.g. a new chat
  template), records their checksums in cherenkov.json and seals the index again. The index
  must be intact; weight checksums are never rewritten.`,
  run: runUsage,
  chat: chatUsage,
  build: buildUsage,
  doctor: doctorUsage,
  compare: compareUsage,
};

/** Every command's option table (what its parser accepts), for the test that each is described. */
export const optionTables: Record<string, FlagSpec> = {
  convert: CONVERT_FLAGS,
  serve: SERVE_FLAGS,
  synth: SYNTH_FLAGS,
  inspect: INSPECT_FLAGS,
  seal: SEAL_FLAGS,
  run: RUN_FLAGS,
  chat: CHAT_FLAGS,
  build: BUILD_FLAGS,
  doctor: DOCTOR_FLAGS,
  compare: COMPARE_FLAGS,
};

export function helpText(command?: string): string {
  if (command && usage[command]) return usage[command] + "\n";
  return [
    "cherenkov: run mixture-of-experts models with experts streamed from SSD",
    "",
    "usage: cherenkov <command> [options]      (cherenkov help <command> for details)",
    "",
    ...Object.values(usage).map(summary),
    "",
  ].join("\n");
}

/** A command's usage line and the first sentence of its description, whole (wrapped to 92 columns). */
export function summary(text: string): string {
  const [head, ...rest] = text.split("\n");
  const description: string[] = [];
  for (const line of rest) {
    if (line.trim() === "" || /^\s+-/.test(line)) break; // the options start
    description.push(line.trim());
  }
  const joined = description.join(" ");
  const sentence = /^.*?(?<!\be\.g|\bi\.e)\.(?=\s|$)/.exec(joined)?.[0] ?? joined;
  const lines: string[] = [];
  for (const word of sentence.split(" ")) {
    const last = lines.length - 1;
    if (last >= 0 && lines[last]!.length + 1 + word.length <= 90) lines[last] += ` ${word}`;
    else lines.push(word);
  }
  return [head!, ...lines.map((l) => `  ${l}`)].join("\n");
}
