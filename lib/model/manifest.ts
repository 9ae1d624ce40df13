// cherenkov.json: the schema of a model directory's index, and the layout constants that the
// writer follows and the reader checks. See docs/format.md.
import { z } from "zod";
import { checksum } from "./checksum.ts";
import { DType } from "./config.ts";

/** The format writers write: cherenkov/1 plus `manifest_checksum` (see {@link manifestChecksum}). */
export const FORMAT = "cherenkov/2";
/** Formats readers accept: cherenkov/1 (no manifest checksum) still loads. */
export const FORMATS = ["cherenkov/1", FORMAT] as const;
export const MANIFEST_FILE = "cherenkov.json";
export const DENSE_FILE = "dense.bin";
export const EXPERTS_FILE = "experts.bin";
export const PLE_FILE = "ple.bin";
export const TOKENIZER_FILE = "tokenizer.json";
export const TOKENIZER_CONFIG_FILE = "tokenizer_config.json";

/** Apple-silicon page size: every tensor, record and table starts on one. */
export const PAGE = 16384;
/** Alignment of the parts inside an expert record (GPU buffer-binding offsets). */
export const PART_ALIGN = 256;

export const alignUp = (x: number, a: number) => Math.ceil(x / a) * a;

const count = z.number().int().nonnegative();
const Hex64 = z.string().regex(/^[0-9a-f]{16}$/, "must be 16 lowercase hex digits (xxhash64)");
const Shape = z.array(count);

export const TensorEntry = z.object({
  name: z.string().min(1),
  dtype: DType,
  shape: Shape,
  /** Byte offset in dense.bin, a multiple of PAGE. */
  offset: count,
  bytes: count,
  checksum: Hex64,
});
export type TensorEntry = z.infer<typeof TensorEntry>;

export const ExpertPart = z.object({
  name: z.string().min(1),
  dtype: DType,
  shape: Shape,
  /** Byte offset inside the record. */
  offset: count,
  bytes: count,
});
export type ExpertPart = z.infer<typeof ExpertPart>;

export const ExpertsIndex = z.object({
  layers: count,
  per_layer: count,
  /** Bytes from one record to the next, a multiple of PAGE. */
  stride: count,
  parts: z.array(ExpertPart),
  /** One per record, record (l, e) at index l * per_layer + e; each covers the whole stride. */
  checksums: z.array(Hex64),
});
export type ExpertsIndex = z.infer<typeof ExpertsIndex>;

export const PleTableEntry = z.object({
  layer: count,
  order_index: count,
  head: count,
  rows: count,
  offset: count,
  bytes: count,
  checksum: Hex64,
});
export type PleTableEntry = z.infer<typeof PleTableEntry>;

export const PleIndex = z.object({
  dtype: z.enum(["f32", "bf16"]),
  tables: z.array(PleTableEntry),
});
export type PleIndex = z.infer<typeof PleIndex>;

export const Manifest = z.object({
  format: z.enum(FORMATS),
  /** cherenkov/2: xxhash64 of this object's JSON without this field (see manifestChecksum). */
  manifest_checksum: Hex64.optional(),
  /** The dtype the model's weights were written with (q4, bf16, f16 or f32). */
  weights: DType,
  /** Validated separately (parseConfig) so its errors read "config.<field>". */
  config: z.unknown(),
  tensors: z.array(TensorEntry),
  experts: ExpertsIndex,
  ple: PleIndex.nullable(),
  writer: z.object({ name: z.string(), version: z.string(), source: z.record(z.string(), z.unknown()).optional() }),
  /** cherenkov/2: xxhash64 of the tokenizer files as written (checked when the tokenizer loads). */
  files: z.record(z.string(), Hex64).optional(),
});
export type Manifest = z.infer<typeof Manifest>;

/**
 * The checksum of a manifest: xxhash64 of `JSON.stringify` of the parsed object with its
 * `manifest_checksum` field left out, keys in file order. Any change to a value (a flipped
 * digit of an offset, a config number) changes it; re-indenting the file does not.
 */
export function manifestChecksum(raw: Record<string, unknown>): string {
  const { manifest_checksum: _, ...rest } = raw;
  return checksum(new TextEncoder().encode(JSON.stringify(rest)));
}

/** Sets `manifest_checksum` of a parsed manifest after its values were changed (tools, tests). */
export function sealManifest<T extends Record<string, unknown>>(raw: T): T {
  const { format, manifest_checksum: _, ...rest } = raw;
  const body = { format, ...rest };
  return { format, manifest_checksum: manifestChecksum(body), ...rest } as unknown as T;
}
