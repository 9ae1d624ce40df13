// TextTokenizer.decode (lib/model/tokenizer.ts's linearDecode) against @huggingface/tokenizers'
// own decode, on random id sequences, for every kind of tokenizer the repo has or ships
// (the byte tokenizer at a small and at Qwen's vocab size, the shipped models' ByteLevel BPE)
// and for small inline ones whose decoders take the library path (a sentencepiece-style
// Unigram with a Metaspace decoder and a BPE with byte fallback, a BPE with an
// end_of_word_suffix, a WordPiece with and without a decoder).
import { describe, expect, test } from "bun:test";
import { Tokenizer } from "@huggingface/tokenizers";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { byteTokenizer } from "../../lib/convert/byte-tokenizer.ts";
import { Rng } from "../../lib/model/rng.ts";
import { tokenizerFromSource, type TextTokenizer } from "../../lib/model/tokenizer.ts";

interface Fixture {
  json: Record<string, unknown>;
  config: Record<string, unknown>;
}

/** Ours and the library's tokenizer of the same files. */
function both({ json, config }: Fixture): { ours: TextTokenizer; library: Tokenizer; pieces: (string | undefined)[] } {
  const ours = tokenizerFromSource({ dir: "fixture", tokenizer: JSON.stringify(json), config: JSON.stringify(config), indexEosId: null });
  // A copy each: the library writes into the objects it is given (model.vocab).
  const library = new Tokenizer(structuredClone(json), structuredClone(config));
  const pieces = Array.from({ length: ours.vocabSize }, (_, id) => library.id_to_token(id));
  return { ours, library, pieces };
}

/** The ids that have a piece, by kind: added tokens (special or not) and the model's own. */
function idKinds(library: Tokenizer, pieces: (string | undefined)[]): { added: number[]; plain: number[] } {
  const addedIds = new Set(library.get_added_tokens_decoder().keys());
  const withPiece = pieces.flatMap((p, id) => (p === undefined ? [] : [id]));
  return { added: withPiece.filter((id) => addedIds.has(id)), plain: withPiece.filter((id) => !addedIds.has(id)) };
}

/**
 * Random sequences of ids with a piece: runs of plain ids (bytes, for the byte tokenizer:
 * text and broken UTF-8 alike) between added tokens, or ids of `texts` encoded.
 */
function randomSequences(rng: Rng, count: number, kinds: { added: number[]; plain: number[] }, encoded: number[][]): number[][] {
  const pick = (a: number[]) => a[rng.int(a.length)]!;
  return Array.from({ length: count }, () => {
    const ids: number[] = [];
    const parts = 1 + rng.int(6);
    for (let p = 0; p < parts; p++) {
      const r = rng.next();
      if (r < 0.3 && kinds.added.length > 0) ids.push(pick(kinds.added));
      else if (r < 0.55 && encoded.length > 0) ids.push(...encoded[rng.int(encoded.length)]!);
      else for (let n = 1 + rng.int(8); n > 0; n--) ids.push(pick(kinds.plain));
    }
    return ids;
  });
}

/** Text whose tokens make clean_up_tokenization and the decoders' edge cases fire. */
const TEXTS = ["Hello, world.", " . ? ! , ' 's n't 'm 've 're", "don't stop", "é 日本語 🎉", "  two  spaces ", "a\nb\tc", "<|im_start|>user\nhi<|im_end|>"];

function expectSameAsLibrary(f: Fixture, seed: number, count: number): void {
  const { ours, library, pieces } = both(f);
  const rng = new Rng(seed, "decode");
  const encoded = TEXTS.map((t) => ours.encode(t, { addSpecialTokens: false })).filter((ids) => ids.length > 0 && ids.every((id) => pieces[id] !== undefined));
  for (const ids of randomSequences(rng, count, idKinds(library, pieces), encoded))
    for (const skip of [false, true]) {
      const want = library.decode(ids, { skip_special_tokens: skip });
      const got = ours.decode(ids, { skipSpecialTokens: skip });
      if (got !== want) throw new Error(`ids ${JSON.stringify(ids)} (skip ${skip}): ${JSON.stringify(got)} !== library's ${JSON.stringify(want)}`);
    }
}

/** Ids with no piece (past the last one, or a hole) are skipped: the text of the others. */
function expectPiecelessSkipped(f: Fixture, seed: number, count: number): void {
  const { ours, library, pieces } = both(f);
  const rng = new Rng(seed, "pieceless");
  const holes = pieces.flatMap((p, id) => (p === undefined ? [id] : []));
  const pieceless = () => (holes.length > 0 && rng.next() < 0.3 ? holes[rng.int(holes.length)]! : pieces.length + rng.int(200_000));
  for (const ids of randomSequences(rng, count, idKinds(library, pieces), [])) {
    const mixed = ids.flatMap((id) => (rng.next() < 0.3 ? [pieceless(), id] : [id]));
    mixed.push(pieceless());
    for (const skip of [false, true]) expect(ours.decode(mixed, { skipSpecialTokens: skip })).toBe(library.decode(ids, { skip_special_tokens: skip }));
  }
  expect(ours.decode([pieces.length, pieces.length + 7])).toBe("");
}

function shipped(name: string): Fixture {
  const dir = join(import.meta.dir, "../../examples/models", name);
  const read = (f: string) => JSON.parse(readFileSync(join(dir, f), "utf8"));
  return { json: read("tokenizer.json"), config: read("tokenizer_config.json") };
}

function byteFixture(vocabSize: number): Fixture {
  const { tokenizerJson, tokenizerConfig } = byteTokenizer(vocabSize);
  return { json: tokenizerJson, config: tokenizerConfig };
}

/**
 * The byte tokenizer with non-special added tokens, one of them spelled as a byte's piece
 * ("x": the ByteLevel decoder passes every "x" verbatim), some that clean-up rewrites, an
 * additional special token from the config and clean_up_tokenization_spaces on.
 */
function byteFixtureWithPlainAdded(): Fixture {
  const f = structuredClone(byteFixture(320));
  const added = f.json.added_tokens as { id: number; content: string; special: boolean }[];
  [" .", "'s", "x", " ", "<tool>", "n't"].forEach((content, i) => Object.assign(added[10 + i]!, { content, special: false }));
  Object.assign(added[20]!, { content: "<think>", special: false });
  f.config = { ...f.config, clean_up_tokenization_spaces: true, additional_special_tokens: ["<think>", { content: "<tool>" }] };
  return f;
}

const SPECIALS = [
  { id: 0, content: "<unk>", special: true },
  { id: 1, content: "<s>", special: true },
  { id: 2, content: "</s>", special: true },
];
const PIECES = ["▁", "▁Hello", ",", "▁world", ".", "▁.", "▁'s", "'s", "n't", "▁n't", "▁?", "!", "▁é", "日本", "▁a", "b", "</s>x"];
const addedToken = (t: { id: number; content: string; special: boolean }) => ({ ...t, single_word: false, lstrip: false, rstrip: false, normalized: false });
/** Many reserved special tokens after the pieces, and a non-special one: as Llama 3 has them. */
const reserved = (from: number, n: number) => [
  ...Array.from({ length: n }, (_, i) => addedToken({ id: from + i, content: `<|reserved_${i}|>`, special: true })),
  addedToken({ id: from + n, content: "<tool>", special: false }),
];

/** A sentencepiece-style Unigram (Metaspace decoder); cleanup as `cleanUp`. */
function unigramFixture(cleanUp: boolean): Fixture {
  const vocab = [...SPECIALS.map((t) => t.content), ...PIECES].map((p, i) => [p, -i]);
  return {
    json: {
      added_tokens: [...SPECIALS.map(addedToken), ...reserved(vocab.length, 40)],
      normalizer: null,
      pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
      post_processor: null,
      decoder: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
      model: { type: "Unigram", unk_id: 0, vocab, byte_fallback: false },
    },
    config: { bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>", clean_up_tokenization_spaces: cleanUp },
  };
}

/** A Llama-2-style BPE with byte fallback (the decoder a Sequence of Replace, ByteFallback, Fuse, Strip). */
function byteFallbackFixture(): Fixture {
  const pieces = [...SPECIALS.map((t) => t.content), ...Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`), ...PIECES];
  return {
    json: {
      added_tokens: [...SPECIALS.map(addedToken), ...reserved(pieces.length, 40)],
      normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] },
      pre_tokenizer: null,
      post_processor: null,
      decoder: {
        type: "Sequence",
        decoders: [{ type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }],
      },
      model: { type: "BPE", unk_token: "<unk>", byte_fallback: true, fuse_unk: true, vocab: Object.fromEntries(pieces.map((p, i) => [p, i])), merges: [] },
    },
    config: { bos_token: "<s>", eos_token: "</s>", unk_token: "<unk>", clean_up_tokenization_spaces: false },
  };
}

/** A CLIP-style BPE: pieces end words with "</w>", which decode replaces with spaces (and trims when skipping). */
function suffixFixture(): Fixture {
  const pieces = ["hello</w>", "wor", "ld</w>", ".</w>", ",</w>", "'s</w>", "a", "b</w>", "</w>", "n't</w>"];
  const added = [addedToken({ id: pieces.length, content: "<|startoftext|>", special: true }), addedToken({ id: pieces.length + 1, content: "<|endoftext|>", special: true })];
  return {
    json: {
      added_tokens: [...added, ...reserved(pieces.length + 2, 30)],
      normalizer: null,
      pre_tokenizer: null,
      post_processor: null,
      decoder: { type: "BPEDecoder", suffix: "</w>" },
      model: { type: "BPE", unk_token: null, end_of_word_suffix: "</w>", vocab: Object.fromEntries(pieces.map((p, i) => [p, i])), merges: [] },
    },
    config: { eos_token: "<|endoftext|>" },
  };
}

/** A BERT-style WordPiece, with its decoder or none (pieces joined by spaces); ids 7..9 a hole. */
function wordPieceFixture(withDecoder: boolean): Fixture {
  const vocab = { "[UNK]": 0, "[CLS]": 1, "[SEP]": 2, hello: 3, "##lo": 4, world: 5, ".": 6, "'": 10, s: 11, "##n": 12, "?": 13 };
  return {
    json: {
      added_tokens: [0, 1, 2].map((id) => addedToken({ id, content: ["[UNK]", "[CLS]", "[SEP]"][id]!, special: true })),
      normalizer: null,
      pre_tokenizer: { type: "BertPreTokenizer" },
      post_processor: null,
      decoder: withDecoder ? { type: "WordPiece", prefix: "##", cleanup: true } : null,
      model: { type: "WordPiece", unk_token: "[UNK]", continuing_subword_prefix: "##", max_input_chars_per_word: 100, vocab },
    },
    config: { unk_token: "[UNK]", additional_special_tokens: ["[CLS]"] },
  };
}

describe("decode equals @huggingface/tokenizers' decode", () => {
  test("byte tokenizer at vocab 320", () => expectSameAsLibrary(byteFixture(320), 1, 400));
  test("byte tokenizer at vocab 151,936 (151,680 reserved specials)", () => expectSameAsLibrary(byteFixture(151_936), 2, 40));
  test("byte tokenizer with non-special added tokens (one spelled as a byte), clean-up on", () => expectSameAsLibrary(byteFixtureWithPlainAdded(), 3, 400));
  test("the shipped qwen4-exp-tiny tokenizer (ByteLevel BPE, clean-up by default)", () => expectSameAsLibrary(shipped("qwen4-exp-tiny"), 4, 300));
  test("the shipped qwen3-next-tiny tokenizer", () => expectSameAsLibrary(shipped("qwen3-next-tiny"), 5, 100));
  test("sentencepiece-style Unigram with a Metaspace decoder, clean-up off and on", () => {
    expectSameAsLibrary(unigramFixture(false), 6, 300);
    expectSameAsLibrary(unigramFixture(true), 7, 300);
  });
  test("BPE with byte fallback (Sequence decoder)", () => expectSameAsLibrary(byteFallbackFixture(), 8, 300));
  test("BPE with an end_of_word_suffix (suffix replaced, trimmed when skipping)", () => expectSameAsLibrary(suffixFixture(), 9, 300));
  test("WordPiece with its decoder and without a decoder", () => {
    expectSameAsLibrary(wordPieceFixture(true), 10, 300);
    expectSameAsLibrary(wordPieceFixture(false), 11, 300);
  });
  test("an empty list is the empty text", () => {
    expect(both(byteFixture(320)).ours.decode([])).toBe("");
  });
});

describe("ids without a piece are skipped", () => {
  test("byte tokenizer: ids past vocab_size", () => expectPiecelessSkipped(byteFixture(320), 21, 100));
  test("the shipped tokenizer: ids past its 4096 pieces (an LM head's padding rows)", () => expectPiecelessSkipped(shipped("qwen4-exp-tiny"), 22, 100));
  test("WordPiece: ids in a hole of the vocabulary and past it", () => {
    expectPiecelessSkipped(wordPieceFixture(true), 23, 100);
    expectPiecelessSkipped(wordPieceFixture(false), 24, 100);
  });
  test("Metaspace, where the library decodes such an id as the unk piece: skipped, not <unk>", () => {
    expectPiecelessSkipped(unigramFixture(true), 25, 100);
    const { ours, library } = both(unigramFixture(false));
    const past = 1000;
    expect(library.decode([4, past, 6], { skip_special_tokens: false })).toBe("Hello<unk> world");
    expect(ours.decode([4, past, 6])).toBe("Hello world");
  });
  test("ids that are no index (negative, fractional) are skipped too", () => {
    const { ours } = both(byteFixture(320));
    expect(ours.decode([72, -1, 105, 1.5, 33])).toBe("Hi!");
  });
});
