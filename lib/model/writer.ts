// Writes a model directory tensor by tensor, so that memory stays at one tensor or one expert
// record however large the model is. cherenkov.json is written last: a directory without it
// is an unfinished write, never a model.
import { closeSync, fsyncSync, ftruncateSync, rmSync, writeSync } from "node:fs";
import pkg from "../../package.json";
import { checksum } from "./checksum.ts";
import { encode, encodeInto } from "./codec.ts";
import { dims, type DType, type ModelConfig } from "./config.ts";
import {
  alignUp,
  DENSE_FILE,
  EXPERTS_FILE,
  FORMAT,
  MANIFEST_FILE,
  PAGE,
  PART_ALIGN,
  PLE_FILE,
  TOKENIZER_CONFIG_FILE,
  TOKENIZER_FILE,
  type ExpertPart,
  type ExpertsIndex,
  type Manifest,
  type PleIndex,
  type PleTableEntry,
  type TensorEntry,
  manifestChecksum,
} from "./manifest.ts";
import { openTemp, prepareOutputDir, publish, removeEntry, syncDir, writeFileAtomic } from "./safe-write.ts";
import { denseTensorSpecs, expertPartSpecs, numel, storageDType, tensorBytes, type TensorSpec } from "./tensors.ts";
import type { ExpertWeights } from "./weights.ts";

export interface WriterOptions {
  weights: DType;
  /** Free-form description of where the weights came from (preset, seed, checkpoint...). */
  source?: Record<string, unknown>;
  /** Write into a non-empty directory, replacing its model files (each by rename). Default false: refuse. */
  force?: boolean;
}

/** The expert record layout of a config written with `weights`: parts at PART_ALIGN offsets. */
export function planExperts(config: ModelConfig, weights: DType): Omit<ExpertsIndex, "checksums"> {
  let cursor = 0;
  const parts: ExpertPart[] = expertPartSpecs(config).map((spec) => {
    const dtype = storageDType(spec, weights);
    const offset = alignUp(cursor, PART_ALIGN);
    const bytes = tensorBytes(spec.shape, dtype);
    cursor = offset + bytes;
    return { name: spec.name, dtype, shape: spec.shape, offset, bytes };
  });
  return { layers: dims(config).expertLayers, per_layer: config.moe.experts, stride: alignUp(cursor, PAGE), parts };
}

/** The PLE tables in file order (layer, order index, head), each on its own page. */
export function planPle(config: ModelConfig, weights: DType): Omit<PleIndex, "tables"> & { tables: Omit<PleTableEntry, "checksum">[] } | null {
  const p = config.ple;
  if (!p) return null;
  const dtype = weights === "f32" ? "f32" : "bf16";
  const tables: Omit<PleTableEntry, "checksum">[] = [];
  let cursor = 0;
  for (const layer of p.layers)
    p.orders.forEach((_, o) => {
      for (let j = 0; j < p.heads; j++) {
        const rows = p.rows[o]![j]!;
        const bytes = tensorBytes([rows, p.head_dim], dtype);
        tables.push({ layer, order_index: o, head: j, rows, offset: cursor, bytes });
        cursor = alignUp(cursor + bytes, PAGE);
      }
    });
  return { dtype, tables };
}

/** Total bytes of the three binary files when every tensor takes its planned dtype (for progress bars). */
export function plannedBytes(config: ModelConfig, weights: DType): number {
  let dense = 0;
  for (const s of denseTensorSpecs(config)) dense = alignUp(dense, PAGE) + tensorBytes(s.shape, storageDType(s, weights));
  const e = planExperts(config, weights);
  const ple = planPle(config, weights);
  const pleEnd = ple ? ple.tables.reduce((end, t) => Math.max(end, alignUp(t.offset + t.bytes, PAGE)), 0) : 0;
  return alignUp(dense, PAGE) + e.layers * e.per_layer * e.stride + pleEnd;
}

/** Encodes one expert's f32 parts into `record` (stride bytes, zero padding included). */
export function encodeExpertRecord(layout: Omit<ExpertsIndex, "checksums">, weights: ExpertWeights, record: Uint8Array, what = "expert"): void {
  record.fill(0);
  for (const part of layout.parts) {
    const values = weights[part.name as keyof ExpertWeights];
    if (!values || values.length !== numel(part.shape))
      throw new Error(`ModelWriter: ${what} part ${part.name}: got ${values?.length ?? 0} values, shape [${part.shape.join(", ")}] needs ${numel(part.shape)}`);
    encodeInto(values, part.dtype, record.subarray(part.offset, part.offset + part.bytes));
  }
}

/** Writes all of `bytes` at `position` (writeSync may write less than asked, and caps at 2 GiB). */
function writeAllAt(fd: number, bytes: Uint8Array, position: number) {
  let done = 0;
  while (done < bytes.byteLength) {
    const n = Math.min(bytes.byteLength - done, 1 << 30);
    done += writeSync(fd, bytes, done, n, position + done);
  }
}

export class ModelWriter {
  private readonly specs: TensorSpec[];
  private readonly tensors: TensorEntry[] = [];
  private denseEnd = 0;
  private readonly expertPlan: Omit<ExpertsIndex, "checksums">;
  private readonly expertChecksums: string[] = [];
  private readonly record: Uint8Array;
  private readonly plePlan: ReturnType<typeof planPle>;
  private readonly pleTables: PleTableEntry[] = [];
  private finished = false;
  private tokenizer: { json: string; config: string } | null = null;
  private files: Record<string, string> | null = null;

  private constructor(
    readonly dir: string,
    readonly config: ModelConfig,
    readonly options: WriterOptions,
    private readonly fds: { dense: number; experts: number; ple: number | null },
    private readonly temps: Map<string, string>,
  ) {
    this.specs = denseTensorSpecs(config);
    this.expertPlan = planExperts(config, options.weights);
    this.record = new Uint8Array(this.expertPlan.stride);
    this.plePlan = planPle(config, options.weights);
  }

  /**
   * Creates `dir` (and parents), or takes an existing empty one (a non-empty one only with
   * `force`), and opens temporary files for the binary files. Nothing under the final names
   * changes before finish(), which renames the finished files into place (cherenkov.json
   * last): a model loaded from the old files keeps its old inodes, symlinks in `dir` are
   * replaced, never written through.
   */
  static async create(dir: string, config: ModelConfig, options: WriterOptions): Promise<ModelWriter> {
    prepareOutputDir(dir, options.force ?? false);
    const temps = new Map<string, string>();
    const fds: number[] = [];
    const open = (f: string) => {
      const t = openTemp(dir, f);
      temps.set(f, t.path);
      fds.push(t.fd);
      return t.fd;
    };
    try {
      return new ModelWriter(dir, config, options, { dense: open(DENSE_FILE), experts: open(EXPERTS_FILE), ple: config.ple ? open(PLE_FILE) : null }, temps);
    } catch (e) {
      for (const fd of fds) closeSync(fd);
      for (const p of temps.values()) rmSync(p, { force: true });
      throw e;
    }
  }

  /** Dense tensors written so far / in total. */
  get denseProgress() {
    return { written: this.tensors.length, total: this.specs.length };
  }

  /** Bytes of the dense tensor written last (for progress reports). */
  get lastDenseBytes(): number {
    return this.tensors[this.tensors.length - 1]?.bytes ?? 0;
  }

  /** The next dense tensor expected, in denseTensorSpecs order. */
  nextDenseSpec(): TensorSpec | undefined {
    return this.specs[this.tensors.length];
  }

  /** Adds the next dense tensor from f32 values, converted to its storage dtype. */
  addDense(name: string, values: Float32Array): void {
    const spec = this.expectDense(name);
    if (values.length !== numel(spec.shape))
      throw new Error(`ModelWriter: tensor ${name}: got ${values.length} values, shape [${spec.shape.join(", ")}] needs ${numel(spec.shape)}`);
    const dtype = storageDType(spec, this.options.weights);
    this.writeDense(spec, dtype, encode(values, spec.shape, dtype));
  }

  /** Adds the next dense tensor as bytes already in `dtype` (e.g. q4 from an MLX checkpoint). */
  addDenseRaw(name: string, dtype: DType, bytes: Uint8Array): void {
    const spec = this.expectDense(name);
    if (dtype === "q4" && (spec.shape.length !== 2 || spec.shape[1]! % 32 !== 0))
      throw new Error(`ModelWriter: tensor ${name}: q4 needs a 2-d shape with in % 32 == 0, shape is [${spec.shape.join(", ")}]`);
    const want = tensorBytes(spec.shape, dtype);
    if (bytes.byteLength !== want)
      throw new Error(`ModelWriter: tensor ${name}: got ${bytes.byteLength} bytes, ${dtype} [${spec.shape.join(", ")}] needs ${want}`);
    this.writeDense(spec, dtype, bytes);
  }

  private expectDense(name: string): TensorSpec {
    this.checkOpen();
    const spec = this.specs[this.tensors.length];
    if (!spec) throw new Error(`ModelWriter: tensor ${name}: all ${this.specs.length} dense tensors are already written`);
    if (spec.name !== name) throw new Error(`ModelWriter: tensor ${name}: expected ${spec.name} next (denseTensorSpecs order)`);
    return spec;
  }

  private writeDense(spec: TensorSpec, dtype: DType, bytes: Uint8Array) {
    const offset = alignUp(this.denseEnd, PAGE);
    writeAllAt(this.fds.dense, bytes, offset);
    this.denseEnd = offset + bytes.byteLength;
    this.tensors.push({ name: spec.name, dtype, shape: spec.shape, offset, bytes: bytes.byteLength, checksum: checksum(bytes) });
  }

  /** The next expert record (layer-major: (0,0), (0,1), ..., (1,0), ...) from f32 values. */
  addExpert(layer: number, e: number, weights: ExpertWeights): void {
    this.expectExpert(layer, e);
    encodeExpertRecord(this.expertPlan, weights, this.record, `expert layer ${layer} expert ${e}`);
    this.writeRecord(this.record);
  }

  /** The next expert record as a whole, already encoded (stride bytes; see encodeExpertRecord). */
  addExpertRecord(layer: number, e: number, record: Uint8Array): void {
    this.expectExpert(layer, e);
    if (record.byteLength !== this.expertPlan.stride)
      throw new Error(`ModelWriter: expert layer ${layer} expert ${e}: record of ${record.byteLength} bytes, the stride is ${this.expertPlan.stride}`);
    this.writeRecord(record);
  }

  /** The next expert record from parts already in the record's dtypes (see expertLayout). */
  addExpertRaw(layer: number, e: number, parts: Record<string, Uint8Array>): void {
    this.expectExpert(layer, e);
    this.record.fill(0);
    for (const part of this.expertPlan.parts) {
      const bytes = parts[part.name];
      if (!bytes || bytes.byteLength !== part.bytes)
        throw new Error(`ModelWriter: expert layer ${layer} expert ${e} part ${part.name}: got ${bytes?.byteLength ?? 0} bytes, ${part.dtype} [${part.shape.join(", ")}] needs ${part.bytes}`);
      this.record.set(bytes, part.offset);
    }
    this.writeRecord(this.record);
  }

  /** The record layout this writer uses (part dtypes, offsets, stride). */
  get expertLayout(): Omit<ExpertsIndex, "checksums"> {
    return this.expertPlan;
  }

  private expectExpert(layer: number, e: number) {
    this.checkOpen();
    const i = this.expertChecksums.length;
    const { layers, per_layer } = this.expertPlan;
    if (i >= layers * per_layer) throw new Error(`ModelWriter: expert layer ${layer} expert ${e}: all ${layers * per_layer} records are already written`);
    const want = { layer: Math.floor(i / per_layer), e: i % per_layer };
    if (layer !== want.layer || e !== want.e)
      throw new Error(`ModelWriter: expert layer ${layer} expert ${e}: expected layer ${want.layer} expert ${want.e} next`);
  }

  private writeRecord(record: Uint8Array) {
    const i = this.expertChecksums.length;
    writeAllAt(this.fds.experts, record, i * this.expertPlan.stride);
    this.expertChecksums.push(checksum(record));
  }

  /** The next PLE table (order: ple.layers, then order index, then head) as rows x head_dim f32 values. */
  addPleTable(layer: number, o: number, j: number, values: Float32Array): void {
    this.checkOpen();
    const plan = this.plePlan;
    const what = `PLE table layer ${layer} order ${o} head ${j}`;
    if (!plan || this.fds.ple === null) throw new Error(`ModelWriter: ${what}: the config has no PLE`);
    const t = plan.tables[this.pleTables.length];
    if (!t) throw new Error(`ModelWriter: ${what}: all ${plan.tables.length} tables are already written`);
    if (t.layer !== layer || t.order_index !== o || t.head !== j)
      throw new Error(`ModelWriter: ${what}: expected layer ${t.layer} order ${t.order_index} head ${t.head} next`);
    const shape = [t.rows, this.config.ple!.head_dim];
    if (values.length !== numel(shape)) throw new Error(`ModelWriter: ${what}: got ${values.length} values, needs ${numel(shape)}`);
    const bytes = encode(values, shape, plan.dtype);
    writeAllAt(this.fds.ple, bytes, t.offset);
    this.pleTables.push({ ...t, checksum: checksum(bytes) });
  }

  /** Writes tokenizer.json and tokenizer_config.json (the Hugging Face files). */
  setTokenizer(tokenizerJson: object, tokenizerConfig: object): void {
    this.checkOpen();
    this.tokenizer = { json: JSON.stringify(tokenizerJson), config: JSON.stringify(tokenizerConfig, null, 2) };
    const hash = (text: string) => checksum(new TextEncoder().encode(text));
    this.files = { [TOKENIZER_FILE]: hash(this.tokenizer.json), [TOKENIZER_CONFIG_FILE]: hash(this.tokenizer.config) };
  }

  /** Checks that everything was written, pads the files to whole pages and writes cherenkov.json. */
  async finish(): Promise<Manifest> {
    this.checkOpen();
    const next = this.nextDenseSpec();
    if (next) throw new Error(`ModelWriter: tensor ${next.name} was never added (${this.tensors.length} of ${this.specs.length} written)`);
    const { layers, per_layer, stride } = this.expertPlan;
    if (this.expertChecksums.length !== layers * per_layer) {
      const i = this.expertChecksums.length;
      throw new Error(`ModelWriter: expert layer ${Math.floor(i / per_layer)} expert ${i % per_layer} was never added`);
    }
    const pleTotal = this.plePlan?.tables.length ?? 0;
    if (this.pleTables.length !== pleTotal) {
      const t = this.plePlan!.tables[this.pleTables.length]!;
      throw new Error(`ModelWriter: PLE table layer ${t.layer} order ${t.order_index} head ${t.head} was never added`);
    }
    // Holes left by alignment read as zeros; truncating to the padded size makes the tail exist too.
    ftruncateSync(this.fds.dense, alignUp(this.denseEnd, PAGE));
    ftruncateSync(this.fds.experts, layers * per_layer * stride);
    if (this.fds.ple !== null) {
      const last = this.pleTables[this.pleTables.length - 1]!;
      ftruncateSync(this.fds.ple, alignUp(last.offset + last.bytes, PAGE));
    }
    this.close(true);
    const body = {
      format: FORMAT,
      weights: this.options.weights,
      config: this.config,
      tensors: this.tensors,
      experts: { ...this.expertPlan, checksums: this.expertChecksums },
      ple: this.plePlan ? { dtype: this.plePlan.dtype, tables: this.pleTables } : null,
      writer: { name: pkg.name, version: pkg.version, ...(this.options.source ? { source: this.options.source } : {}) },
      ...(this.files ? { files: this.files } : {}),
    };
    const { format, ...rest } = body;
    const manifest = { format, manifest_checksum: manifestChecksum(body), ...rest } as Manifest;
    // The old index goes first: between the renames below the directory is an unfinished write.
    removeEntry(this.dir, MANIFEST_FILE);
    syncDir(this.dir);
    for (const [name, temp] of this.temps) publish(temp, this.dir, name);
    this.temps.clear();
    if (!this.config.ple) removeEntry(this.dir, PLE_FILE);
    if (this.tokenizer) {
      writeFileAtomic(this.dir, TOKENIZER_FILE, this.tokenizer.json, false);
      writeFileAtomic(this.dir, TOKENIZER_CONFIG_FILE, this.tokenizer.config, false);
    } else {
      // a model without a tokenizer must not inherit the one a replaced model left (--force)
      removeEntry(this.dir, TOKENIZER_FILE);
      removeEntry(this.dir, TOKENIZER_CONFIG_FILE);
    }
    // every file is on disk and in the directory before the index that makes it a model
    syncDir(this.dir);
    writeFileAtomic(this.dir, MANIFEST_FILE, JSON.stringify(manifest, null, 1) + "\n");
    return manifest;
  }

  /** Closes the files without writing a manifest (for aborted writes). */
  abort(): void {
    if (!this.finished) this.close();
    for (const temp of this.temps.values()) rmSync(temp, { force: true });
    this.temps.clear();
  }

  private close(sync = false) {
    this.finished = true;
    // the bytes reach the disk before the files are renamed into place
    if (sync) for (const fd of [this.fds.dense, this.fds.experts, this.fds.ple]) if (fd !== null) fsyncSync(fd);
    closeSync(this.fds.dense);
    closeSync(this.fds.experts);
    if (this.fds.ple !== null) closeSync(this.fds.ple);
  }

  private checkOpen() {
    if (this.finished) throw new Error(`ModelWriter: ${this.dir} is already finished`);
  }
}
