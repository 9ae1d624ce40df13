// Usage text of every command, shown by `cherenkov help [command]` and `--help`.
import { buildUsage } from "./build.ts";
import { convertUsage } from "./convert.ts";
import { serveUsage } from "./serve.ts";

export const usage: Record<string, string> = {
  convert: convertUsage,
  serve: serveUsage,
  synth: `cherenkov synth --preset NAME --out DIR [options]
  Writes a seeded random qwen4-exp model (every feature on unless switched off).
    --preset tiny|small|30b-a3b-shape|80b-a3b-shape
    --seed N            random seed (default 0); the same seed gives the same bytes
    --out DIR           model directory to write (created; must be empty unless --force)
    --force             write into a non-empty DIR: its model files are replaced by rename
    --dtype q4|bf16|f32 weight storage (default q4)
    --no-hc --no-qsa --no-ple --no-mtp   switch a feature off (n = 1, dense attention, ...)
    --kv f32|q8         attention KV cache type recorded in the config (default q8)
    --progress          draw the progress bar even when stderr is not a terminal`,
  inspect: `cherenkov inspect DIR [--json] [--verify] [--progress]
  Prints a model's config, files, expert record layout and tensor table.
    --json      one JSON object instead of the tables
    --verify    check every checksum (tensors, expert records, PLE tables)`,
  seal: `cherenkov seal DIR
  After a deliberate edit of tokenizer.json or tokenizer_config.json (e.g. a new chat
  template), records their checksums in cherenkov.json and seals the index again. The index
  must be intact; weight checksums are never rewritten.`,
  run: `cherenkov run [DIR] (--prompt TEXT | --prompt-tokens 1,2,3) [options]
  Greedy generation. DIR defaults to the embedded model (examples/models/qwen4-exp-tiny).
    --prompt TEXT        text prompt, tokenized with the model's tokenizer
    --prompt-tokens IDS  comma-separated token ids instead of text
    --chat               wrap --prompt as a user message with the chat template
    --max-tokens N       tokens to generate at most (default 16; stops after the end token)
    --backend NAME       auto (default: metal on macOS, else reference, the faster CPU choice;
                         CHERENKOV_BACKEND overrides), cpu, metal, or reference
    --drafts auto|N      MTP drafts per step (speculative decoding; same tokens as greedy);
                         auto picks 0..max each step from the measured acceptance and step times
    --prefill-chunk N    prompt rows per step (default 512)
    --json               print {"tokens": [...], "text": "..."} on one line
    --verbose            print which backend runs the model, and why auto chose it (stderr)
    --stats              print the model's stats (engine: pool, IO, lookahead, activity,
                         memory, phases, handshake) as JSON on stderr, or inside --json
  Engine options (cpu, metal, auto):
    --pool N% | SIZE     expert pool as a share of all expert records, or bytes (8GiB)
    --pool-slots N       expert pool in records
    --backing wired|mapped  slots filled by reads (default), or the mapped file (only when
                         experts.bin fits the working set: it is made resident whole)
    --io direct|cached   wired pool reads: uncached (default), or through the page cache,
                         which then keeps hot records the pool evicted
    --pool-policy reuse|layer-cyclic|lru  eviction: the record expected back farthest away
                         (default; its layer's distance and its recent use rate), the layer
                         visited farthest away next, or the least recently used record
    --no-lookahead       do not run the next layer's router early to prefetch its experts
    --max-context N      tokens a sequence may hold (default 4096)
    --trace FILE         append every step's routing (tokens, experts, weights, misses) as JSON lines`,
  build: buildUsage,
};

export function helpText(command?: string): string {
  if (command && usage[command]) return usage[command] + "\n";
  return [
    "cherenkov: run mixture-of-experts models with experts streamed from SSD",
    "",
    "usage: cherenkov <command> [options]      (cherenkov help <command> for details)",
    "",
    ...Object.values(usage).map((u) => u.split("\n").slice(0, 2).join("\n")),
    "",
  ].join("\n");
}
