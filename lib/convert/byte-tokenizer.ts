// A byte-level tokenizer for synthetic models, generated rather than shipped: ids 0..255 are
// the 256 bytes (spelled with the usual byte-level alphabet, so Hugging Face's ByteLevel
// pre-tokenizer and decoder apply), BPE with no merges, then the ChatML specials, then
// reserved specials up to the model's vocab_size. Any UTF-8 text round-trips through it.

export const ENDOFTEXT = "<|endoftext|>";
export const IM_START = "<|im_start|>";
export const IM_END = "<|im_end|>";
const SPECIALS = [ENDOFTEXT, IM_START, IM_END];

/** ChatML, as Qwen models write it. */
export const CHATML_TEMPLATE =
  "{%- for message in messages %}" +
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}" +
  "{%- endfor %}" +
  "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

/**
 * The byte-level alphabet: printable Latin-1 bytes stand for themselves, every other byte
 * (controls, space, ...) gets a printable code point from 256 upwards, in byte order.
 */
export function byteAlphabet(): string[] {
  const printable = (b: number) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  let shifted = 0;
  return Array.from({ length: 256 }, (_, b) => String.fromCodePoint(printable(b) ? b : 256 + shifted++));
}

const byteLevel = { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: true };

export interface ByteTokenizerFiles {
  tokenizerJson: Record<string, unknown>;
  tokenizerConfig: Record<string, unknown>;
}

/** tokenizer.json and tokenizer_config.json for a byte-level vocabulary of `vocabSize` ids (>= 259). */
export function byteTokenizer(vocabSize: number): ByteTokenizerFiles {
  const firstSpecial = 256;
  if (vocabSize < firstSpecial + SPECIALS.length)
    throw new Error(`byte tokenizer needs vocab_size >= ${firstSpecial + SPECIALS.length}, got ${vocabSize}`);
  const vocab: Record<string, number> = {};
  byteAlphabet().forEach((ch, id) => (vocab[ch] = id));
  const added = Array.from({ length: vocabSize - firstSpecial }, (_, i) => ({
    id: firstSpecial + i,
    content: SPECIALS[i] ?? `<|reserved_${i - SPECIALS.length}|>`,
    single_word: false,
    lstrip: false,
    rstrip: false,
    normalized: false,
    special: true,
  }));
  const tokenizerJson = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: added,
    normalizer: null,
    pre_tokenizer: byteLevel,
    post_processor: byteLevel,
    decoder: byteLevel,
    model: {
      type: "BPE",
      dropout: null,
      unk_token: null,
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: false,
      byte_fallback: false,
      ignore_merges: false,
      vocab,
      merges: [],
    },
  };
  const tokenizerConfig = {
    tokenizer_class: "PreTrainedTokenizerFast",
    add_bos_token: false,
    add_eos_token: false,
    bos_token: null,
    eos_token: ENDOFTEXT,
    pad_token: ENDOFTEXT,
    unk_token: null,
    clean_up_tokenization_spaces: false,
    model_max_length: 1 << 20,
    chat_template: CHATML_TEMPLATE,
  };
  return { tokenizerJson, tokenizerConfig };
}
