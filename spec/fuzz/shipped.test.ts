// The shipped default model's files under one-bit damage (issue 22, item 2): the fault review
// flipped one bit of a digit in its cherenkov.json and 86 of 184 flips loaded and silently
// changed the output, and one bit of the chat template changed every chat answer. Sealed
// (cherenkov/2), every such flip must be refused by name before anything is used. Bounded by
// count: every digit of the config part of the index (a few hundred reads of a 43 KB file),
// and a fixed sample of bytes of the tokenizer files.
import { afterAll, expect, test } from "bun:test";
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DEFAULT_MODEL_DIR } from "../../lib/model/default-model.ts";
import { ModelFormatError } from "../../lib/model/errors.ts";
import { readManifest } from "../../lib/model/format.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { Rng } from "./cases.ts";

const work = mkdtempSync(join(tmpdir(), "cherenkov-shipped-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const dir = join(work, "model");
cpSync(DEFAULT_MODEL_DIR, dir, { recursive: true });

/** Flips bit `bit` of byte `at` of `file` in `dir`, runs `check`, and restores the file. */
function withFlip<T>(file: string, at: number, bit: number, check: () => T): T {
  const path = join(dir, file);
  const clean = readFileSync(path);
  const bad = Buffer.from(clean);
  bad[at]! ^= 1 << bit;
  writeFileSync(path, bad);
  try {
    return check();
  } finally {
    writeFileSync(path, clean);
  }
}

test("the shipped model is sealed: its index, config and tokenizer files all have checksums", () => {
  const m = readManifest(DEFAULT_MODEL_DIR);
  expect(m.format).toBe("cherenkov/2");
  expect(Object.keys(m.files ?? {}).sort()).toEqual(["tokenizer.json", "tokenizer_config.json"]);
});

test("every one-bit flip of a digit in the shipped config that still parses is refused by name", () => {
  const text = readFileSync(join(dir, "cherenkov.json"), "latin1");
  const start = text.indexOf('"config"');
  const end = text.indexOf('"tensors"');
  let tried = 0;
  for (let at = start; at < end; at++) {
    if (!/[0-9]/.test(text[at]!)) continue;
    // bits 0..3 keep most digits digits: 3 -> 2, 7 -> 5 ... (the flips that load when unsealed)
    for (const bit of [0, 1, 2]) {
      const flipped = String.fromCharCode(text.charCodeAt(at) ^ (1 << bit));
      if (!/[0-9]/.test(flipped)) continue;
      tried++;
      withFlip("cherenkov.json", at, bit, () => {
        expect(() => readManifest(dir)).toThrow(/^cherenkov\.json: (manifest checksum mismatch|not valid JSON)/);
      });
    }
  }
  expect(tried).toBeGreaterThan(100);
});

test("one-bit flips in the shipped tokenizer files are refused by name", async () => {
  const r = new Rng(22);
  const index = readManifest(dir);
  for (const file of ["tokenizer.json", "tokenizer_config.json"]) {
    const size = readFileSync(join(dir, file)).length;
    for (let k = 0; k < 12; k++) {
      const at = r.int(size);
      const e = await withFlip(file, at, r.int(8), () => loadTokenizer(dir, index).then(() => null, (err) => err));
      expect(e).toBeInstanceOf(ModelFormatError);
      expect((e as Error).message).toStartWith(`${file}: checksum mismatch`);
    }
  }
});
