// Reading the small text files of a model directory (cherenkov.json, tokenizer.json,
// tokenizer_config.json) without trusting them: each must be a regular file (a symlink to
// /dev/zero or a FIFO is refused before a byte is read) no larger than its cap, so a hostile
// directory can neither hang the open nor make the reader allocate gigabytes.
import { closeSync, constants, fstatSync, openSync, readSync } from "node:fs";
import { ModelFormatError } from "./errors.ts";

/** Size caps of the JSON files of a model directory (bytes). */
export const FILE_LIMITS = {
  /** cherenkov.json: the index of a 1000-layer, 65536-expert model stays well below. */
  manifest: 256 << 20,
  /** tokenizer.json: real ones are 2-20 MB. */
  tokenizer: 128 << 20,
  /** tokenizer_config.json: real ones are a few KB to 1 MB. */
  tokenizerConfig: 16 << 20,
} as const;

/**
 * The bytes of `path` (named `file` in errors), refusing anything but a regular file of at
 * most `maxBytes`. Symlinks are followed (Hugging Face caches link to blobs); what they point
 * to must be a regular file. Errors carry the errno code in `code` (ENOENT for a missing file).
 */
export function readRegularFile(path: string, file: string, maxBytes: number): Uint8Array {
  let fd: number;
  try {
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    fd = openSync(path, constants.O_RDONLY | (constants.O_NONBLOCK ?? 0));
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    const err = new ModelFormatError(`${file}: cannot open ${path}: ${code ?? String(e)}`, { file });
    (err as { code?: string }).code = code;
    throw err;
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new ModelFormatError(`${file}: ${path} is not a regular file (a device, FIFO or directory); refusing to read it`, { file });
    if (st.size > maxBytes) throw new ModelFormatError(`${file}: ${st.size} bytes, more than the ${maxBytes}-byte limit for this file`, { file });
    const out = new Uint8Array(st.size);
    let got = 0;
    while (got < st.size) {
      const n = readSync(fd, out, got, st.size - got, got);
      if (n === 0) break;
      got += n;
    }
    return got === st.size ? out : out.subarray(0, got);
  } finally {
    closeSync(fd);
  }
}

/** {@link readRegularFile} decoded as UTF-8 text. */
export function readTextFile(path: string, file: string, maxBytes: number): string {
  return new TextDecoder().decode(readRegularFile(path, file, maxBytes));
}

/** The errno code of an error from {@link readRegularFile} (e.g. "ENOENT"), if any. */
export const errnoOf = (e: unknown): string | undefined => (e as { code?: string }).code;
