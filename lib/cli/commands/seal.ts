// `cherenkov seal DIR`: after a deliberate edit of tokenizer.json or tokenizer_config.json (a
// new chat template, say), records the files' new checksums in cherenkov.json and seals it
// again. Only the tokenizer files: the index must still be intact (its own seal, sizes and
// layout are checked first) and tensor, record and table checksums are never rewritten, so a
// damaged weight file cannot be sealed into looking valid.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { checksum } from "../../model/checksum.ts";
import { readManifest } from "../../model/format.ts";
import { FORMAT, MANIFEST_FILE, sealManifest, TOKENIZER_CONFIG_FILE, TOKENIZER_FILE } from "../../model/manifest.ts";
import { FILE_LIMITS, readRegularFile } from "../../model/safe-read.ts";
import { writeFileAtomic } from "../../model/safe-write.ts";
import { parseFlags, UsageError, type FlagSpec } from "../args.ts";
import type { CliIO } from "../io.ts";

/** seal takes no options. */
export const SEAL_FLAGS: FlagSpec = {};

export async function sealCommand(argv: string[], io: CliIO): Promise<number> {
  const { positionals } = parseFlags(argv, SEAL_FLAGS, 1);
  if (positionals.length < 1) throw new UsageError("needs DIR");
  const dir = positionals[0]!;
  readManifest(dir); // the index itself must be intact
  const raw = JSON.parse(readFileSync(join(dir, MANIFEST_FILE), "utf8")) as Record<string, unknown>;
  const files: Record<string, string> = {};
  for (const [f, cap] of [[TOKENIZER_FILE, FILE_LIMITS.tokenizer], [TOKENIZER_CONFIG_FILE, FILE_LIMITS.tokenizerConfig]] as const) {
    try {
      files[f] = checksum(readRegularFile(join(dir, f), f, cap));
    } catch (e) {
      if ((e as { code?: string }).code !== "ENOENT") throw e;
    }
  }
  raw.files = files;
  raw.format = FORMAT;
  writeFileAtomic(dir, MANIFEST_FILE, JSON.stringify(sealManifest(raw), null, 1) + "\n");
  io.stdout(`sealed ${dir}: ${Object.keys(files).join(", ") || "no tokenizer files"} recorded in ${MANIFEST_FILE}\n`);
  return 0;
}
