// cherenkov.json: the schema of a model directory's index, and the layout constants that the
// writer follows and the reader checks. See docs/format.md.
import { z } from "zod";
import { DType } from "./config.ts";

export const FORMAT = "cherenkov/1";
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
  format: z.literal(FORMAT),
  /** The dtype the model's weights were written with (q4, bf16, f16 or f32). */
  weights: DType,
  /** Validated separately (parseConfig) so its errors read "config.<field>". */
  config: z.unknown(),
  tensors: z.array(TensorEntry),
  experts: ExpertsIndex,
  ple: PleIndex.nullable(),
  writer: z.object({ name: z.string(), version: z.string(), source: z.record(z.string(), z.unknown()).optional() }),
});
export type Manifest = z.infer<typeof Manifest>;
