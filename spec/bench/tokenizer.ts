/**
 * `bun run bench:tokenizer`: what turning generated tokens into text costs per token on the
 * host, as Model's TextStream does it (two decodes a token, of the window from the token before
 * the last emitted text on, special tokens skipped), with the synthetic byte tokenizer
 * (lib/convert/byte-tokenizer.ts: every id from 256 up an added special token).
 *
 *   bun spec/bench/tokenizer.ts [--json] [--vocab 320,151936] [--tokens N]
 *
 * "library": @huggingface/tokenizers' own decode, as lib/model/tokenizer.ts called it before
 * (linear in the number of added tokens for each token decoded); "linear": TextTokenizer.decode
 * (lib/model/tokenizer.ts's linearDecode). The generated text mixes ASCII, two-, three- and
 * four-byte characters (held back until complete) and an end-of-turn special every 64 tokens.
 */
import { parseArgs } from "node:util";
import { Tokenizer } from "@huggingface/tokenizers";
import { byteTokenizer, IM_END } from "../../lib/convert/byte-tokenizer.ts";
import { tokenizerFromSource } from "../../lib/model/tokenizer.ts";

const { values: args } = parseArgs({
  options: {
    json: { type: "boolean", default: false },
    vocab: { type: "string", default: "320,151936" },
    tokens: { type: "string", default: "2048" },
  },
});

type Decode = (ids: number[]) => string;

/** TextStream's push (lib/api/model.ts) over `decode`: the text deltas of `ids`, one push a token. */
function streamText(decode: Decode, ids: number[]): string {
  const tokens: number[] = [];
  let prefixOffset = 0;
  let readOffset = 0;
  let emitted = "";
  for (const id of ids) {
    tokens.push(id);
    const prefix = decode(tokens.slice(prefixOffset, readOffset));
    const text = decode(tokens.slice(prefixOffset));
    if (text.length <= prefix.length || text.endsWith("\uFFFD")) continue;
    emitted += text.slice(prefix.length);
    prefixOffset = readOffset;
    readOffset = tokens.length;
  }
  return emitted;
}

/** Microseconds per token of streaming `ids` through `decode` (repeated until 0.5 s have passed). */
function usPerToken(decode: Decode, ids: number[]): number {
  let runs = 0;
  const t0 = performance.now();
  do {
    streamText(decode, ids);
    runs++;
  } while (performance.now() - t0 < 500);
  return ((performance.now() - t0) * 1000) / (runs * ids.length);
}

function generatedIds(encode: (text: string) => number[], endId: number, count: number): number[] {
  const words = ["the ", "model ", "streams ", "café ", "naïve ", "日本語 ", "emoji 🎉 ", "tokens, ", "one by one.\n"];
  const ids: number[] = [];
  for (let i = 0; ids.length < count; i++) {
    ids.push(...encode(words[(i * 7) % words.length]!));
    if (ids.length % 64 < 8) ids.push(endId);
  }
  return ids.slice(0, count);
}

interface Row {
  vocab: number;
  decode: string;
  tokens: number;
  usPerToken: number;
}

const rows: Row[] = [];
for (const vocab of args.vocab.split(",").map(Number)) {
  const { tokenizerJson, tokenizerConfig } = byteTokenizer(vocab);
  const ours = tokenizerFromSource({ dir: `byte tokenizer ${vocab}`, tokenizer: JSON.stringify(tokenizerJson), config: JSON.stringify(tokenizerConfig), indexEosId: null });
  const library = new Tokenizer(tokenizerJson, tokenizerConfig);
  const ids = generatedIds((t) => ours.encode(t, { addSpecialTokens: false }), ours.encode(IM_END)[0]!, Number(args.tokens));
  const cases: [string, Decode][] = [
    ["library", (w) => (w.length === 0 ? "" : library.decode(w, { skip_special_tokens: true }))],
    ["linear", (w) => ours.decode(w, { skipSpecialTokens: true })],
  ];
  const texts = cases.map(([, d]) => streamText(d, ids.slice(0, 256)));
  if (texts[0] !== texts[1]) throw new Error(`vocab ${vocab}: the two decodes stream different text`);
  for (const [name, decode] of cases) {
    // The library's decode at a large vocabulary takes milliseconds a call: fewer tokens.
    const n = name === "library" && vocab > 4096 ? Math.min(ids.length, 64) : ids.length;
    rows.push({ vocab, decode: name, tokens: n, usPerToken: usPerToken(decode, ids.slice(0, n)) });
  }
}

if (args.json) console.log(JSON.stringify(rows));
else {
  console.log("decode per generated token (TextStream: two decodes a token, specials skipped), byte tokenizer");
  for (const r of rows) console.log(`  vocab ${String(r.vocab).padStart(7)}  ${r.decode.padEnd(8)}  ${r.usPerToken.toFixed(1).padStart(10)} us/token  (${r.tokens} tokens)`);
}
