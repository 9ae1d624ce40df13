// Reads a model directory (docs/format.md): checks cherenkov.json against the config's tensor
// inventory and the files' sizes up front, so that every later read is in bounds, then serves
// tensors as the reference's Weights (dequantized to f32 on first use, cached).
import { closeSync, openSync, readFileSync, readSync, statSync } from "node:fs";
import { open } from "node:fs/promises";
import { join } from "node:path";
import { checksum } from "./checksum.ts";
import { decode } from "./codec.ts";
import { describeIssues, ModelConfig } from "./config.ts";
import { ModelFormatError } from "./errors.ts";
import {
  DENSE_FILE,
  EXPERTS_FILE,
  Manifest,
  MANIFEST_FILE,
  PAGE,
  PLE_FILE,
  alignUp,
  type ExpertPart,
  type PleTableEntry,
  type TensorEntry,
} from "./manifest.ts";
import { denseTensorSpecs, expertPartSpecs, tensorBytes } from "./tensors.ts";
import { expertName, pleTableName, type ExpertWeights, type Weights } from "./weights.ts";
import { planPle } from "./writer.ts";

export type ValidManifest = Manifest & { config: ModelConfig };

export interface ExpertLayout {
  /** Bytes from one record to the next (a multiple of 16 KiB). */
  stride: number;
  /** gate, up, down: dtype, shape, offset and bytes inside a record. */
  parts: ExpertPart[];
  /** Expert layers: num_layers, plus one for the MTP head. */
  layers: number;
  perLayer: number;
}

export type VerifyProgress = (doneBytes: number, totalBytes: number) => void;

export interface ModelFiles extends Weights {
  readonly dir: string;
  readonly manifest: ValidManifest;
  readonly expertLayout: ExpertLayout;
  readonly paths: { dense: string; experts: string; ple: string | null };
  /** The index entry of a dense tensor; throws naming the tensor if absent. */
  tensorInfo(name: string): TensorEntry;
  /** The stored bytes of a dense tensor, a view of the mapped dense.bin (no copy). */
  denseBytes(name: string): Uint8Array;
  /** Byte offset of record (l, e) in experts.bin. */
  expertOffset(layer: number, e: number): number;
  /** The stored bytes of record (l, e), read from experts.bin (stride bytes). */
  readExpertRecord(layer: number, e: number, into?: Uint8Array): Uint8Array;
  /** Checks every checksum; throws a ModelFormatError naming the first tensor, record or table that fails. */
  verify(onProgress?: VerifyProgress): Promise<void>;
  close(): void;
}

export interface OpenOptions {
  /** Check every checksum before returning (reads every byte). */
  verify?: boolean;
  /** Upper bound of dequantized experts kept in memory (bytes of f32). */
  expertCacheBytes?: number;
}

const fail = (message: string, file: string, extra: { tensor?: string; field?: string } = {}): never => {
  throw new ModelFormatError(message, { file, ...extra });
};

const sameShape = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((x, i) => x === b[i]);
const shapeText = (s: readonly number[]) => `[${s.join(", ")}]`;

export async function openModel(dir: string, opts: OpenOptions = {}): Promise<ModelFiles> {
  const manifest = readManifest(dir);
  const model = new ModelDirectory(dir, manifest, opts.expertCacheBytes ?? 256 << 20);
  if (opts.verify) await model.verify();
  return model;
}

/** Reads and validates cherenkov.json, and checks the binary files are large enough for it. */
export function readManifest(dir: string): ValidManifest {
  let st;
  try {
    st = statSync(dir);
  } catch (e) {
    return fail(`cannot open model directory ${dir}: ${(e as NodeJS.ErrnoException).code ?? String(e)}`, dir);
  }
  if (!st.isDirectory()) fail(`${dir} is not a directory (a model is a directory with ${MANIFEST_FILE})`, dir);
  const path = join(dir, MANIFEST_FILE);
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return fail(`${MANIFEST_FILE} is missing in ${dir} (not a model directory, or an unfinished write)`, MANIFEST_FILE);
    return fail(`${MANIFEST_FILE}: cannot read ${path}: ${code ?? String(e)}`, MANIFEST_FILE);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    return fail(`${MANIFEST_FILE}: not valid JSON: ${(e as Error).message}`, MANIFEST_FILE);
  }
  const parsed = Manifest.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const field = issue.path.join(".");
    const tensor = tensorNameAt(raw, issue.path);
    return fail(
      `${MANIFEST_FILE}: ${tensor ? `tensor ${tensor}: ` : ""}${describeIssues(parsed.error, "")}`,
      MANIFEST_FILE,
      { field, tensor },
    );
  }
  const config = ModelConfig.safeParse(parsed.data.config);
  if (!config.success) {
    const field = ["config", ...config.error.issues[0]!.path].join(".");
    fail(`${MANIFEST_FILE}: invalid config:\n${describeIssues(config.error, "config")}`, MANIFEST_FILE, { field });
  }
  const m = { ...parsed.data, config: config.data! } as ValidManifest;
  checkDenseIndex(m);
  checkExpertIndex(m);
  checkPleIndex(m);
  checkFileSizes(dir, m);
  return m;
}

/** For a zod issue under tensors[i] or experts.parts[i], the name of that entry. */
function tensorNameAt(raw: unknown, path: PropertyKey[]): string | undefined {
  const r = raw as { tensors?: { name?: unknown }[]; experts?: { parts?: { name?: unknown }[] } };
  let entry: { name?: unknown } | undefined;
  if (path[0] === "tensors" && typeof path[1] === "number") entry = r.tensors?.[path[1]];
  if (path[0] === "experts" && path[1] === "parts" && typeof path[2] === "number") entry = r.experts?.parts?.[path[2]];
  return typeof entry?.name === "string" ? (path[0] === "experts" ? `experts.${entry.name}` : entry.name) : undefined;
}

function checkDenseIndex(m: ValidManifest) {
  const byName = new Map<string, number>();
  m.tensors.forEach((t, i) => {
    if (byName.has(t.name)) fail(`${MANIFEST_FILE}: tensor ${t.name} is listed twice`, MANIFEST_FILE, { tensor: t.name, field: `tensors.${i}` });
    byName.set(t.name, i);
  });
  const specs = denseTensorSpecs(m.config);
  const wanted = new Set(specs.map((s) => s.name));
  for (const spec of specs) {
    const i = byName.get(spec.name);
    if (i === undefined)
      fail(`${MANIFEST_FILE}: tensor ${spec.name} is missing from the index (the config needs it)`, MANIFEST_FILE, { tensor: spec.name, field: "tensors" });
    checkEntry(m.tensors[i!]!, spec.shape, `tensors.${i}`, spec.name);
    if (m.tensors[i!]!.offset % PAGE !== 0)
      fail(`${MANIFEST_FILE}: tensor ${spec.name}: offset ${m.tensors[i!]!.offset} is not a multiple of ${PAGE}`, MANIFEST_FILE, {
        tensor: spec.name,
        field: `tensors.${i}.offset`,
      });
  }
  m.tensors.forEach((t, i) => {
    if (!wanted.has(t.name)) fail(`${MANIFEST_FILE}: tensor ${t.name} is not part of this config`, MANIFEST_FILE, { tensor: t.name, field: `tensors.${i}` });
  });
}

/** Shape, dtype and byte count of one index entry against what the config needs. */
function checkEntry(t: { dtype: string; shape: number[]; bytes: number }, shape: readonly number[], field: string, tensor: string) {
  if (!sameShape(t.shape, shape))
    fail(`${MANIFEST_FILE}: tensor ${tensor}: shape ${shapeText(t.shape)} in the index, the config needs ${shapeText(shape)}`, MANIFEST_FILE, {
      tensor,
      field: `${field}.shape`,
    });
  if (t.dtype === "q4" && (shape.length !== 2 || shape[1]! % 32 !== 0))
    fail(`${MANIFEST_FILE}: tensor ${tensor}: q4 needs a 2-d shape with a multiple of 32 columns`, MANIFEST_FILE, { tensor, field: `${field}.dtype` });
  const want = tensorBytes(shape, t.dtype as TensorEntry["dtype"]);
  if (t.bytes !== want)
    fail(`${MANIFEST_FILE}: tensor ${tensor}: ${t.bytes} bytes in the index, ${t.dtype} ${shapeText(shape)} takes ${want}`, MANIFEST_FILE, {
      tensor,
      field: `${field}.bytes`,
    });
}

function checkExpertIndex(m: ValidManifest) {
  const x = m.experts;
  const c = m.config;
  const layers = c.num_layers + (c.mtp ? 1 : 0);
  const field = (f: string) => ({ field: `experts.${f}` });
  if (x.layers !== layers) fail(`${MANIFEST_FILE}: experts.layers is ${x.layers}, the config needs ${layers}`, MANIFEST_FILE, field("layers"));
  if (x.per_layer !== c.moe.experts)
    fail(`${MANIFEST_FILE}: experts.per_layer is ${x.per_layer}, config.moe.experts is ${c.moe.experts}`, MANIFEST_FILE, field("per_layer"));
  if (x.stride <= 0 || x.stride % PAGE !== 0)
    fail(`${MANIFEST_FILE}: experts.stride ${x.stride} is not a positive multiple of ${PAGE}`, MANIFEST_FILE, field("stride"));
  const specs = expertPartSpecs(c);
  if (x.parts.length !== specs.length)
    fail(`${MANIFEST_FILE}: experts.parts has ${x.parts.length} entries, expected ${specs.map((s) => s.name).join(", ")}`, MANIFEST_FILE, field("parts"));
  specs.forEach((spec, i) => {
    const p = x.parts[i]!;
    const tensor = `experts.${spec.name}`;
    if (p.name !== spec.name)
      fail(`${MANIFEST_FILE}: experts.parts.${i} is ${p.name}, expected ${spec.name}`, MANIFEST_FILE, { tensor, field: `experts.parts.${i}.name` });
    checkEntry(p, spec.shape, `experts.parts.${i}`, tensor);
    if (p.offset + p.bytes > x.stride)
      fail(`${MANIFEST_FILE}: expert part ${spec.name} ends at ${p.offset + p.bytes}, past the stride ${x.stride}`, MANIFEST_FILE, {
        tensor,
        field: `experts.parts.${i}.offset`,
      });
  });
  const records = x.layers * x.per_layer;
  if (x.checksums.length !== records)
    fail(`${MANIFEST_FILE}: experts.checksums has ${x.checksums.length} entries, expected ${records} (one per record)`, MANIFEST_FILE, field("checksums"));
}

function checkPleIndex(m: ValidManifest) {
  const plan = planPle(m.config, m.weights);
  if (!plan) {
    if (m.ple) fail(`${MANIFEST_FILE}: ple is present but the config has no PLE`, MANIFEST_FILE, { field: "ple" });
    return;
  }
  if (!m.ple) return fail(`${MANIFEST_FILE}: ple is missing (config.ple is set)`, MANIFEST_FILE, { field: "ple" });
  const head = m.config.ple!.head_dim;
  const key = (t: { layer: number; order_index: number; head: number }) => pleTableName(t.layer, t.order_index, t.head);
  const have = new Map(m.ple.tables.map((t, i) => [key(t), i]));
  for (const want of plan.tables) {
    const name = key(want);
    const i = have.get(name);
    if (i === undefined) fail(`${MANIFEST_FILE}: PLE table ${name} is missing from ple.tables`, MANIFEST_FILE, { tensor: name, field: "ple.tables" });
    const t = m.ple.tables[i!]!;
    checkEntry({ dtype: m.ple.dtype, shape: [t.rows, head], bytes: t.bytes }, [want.rows, head], `ple.tables.${i}`, name);
    if (t.offset % PAGE !== 0)
      fail(`${MANIFEST_FILE}: PLE table ${name}: offset ${t.offset} is not a multiple of ${PAGE}`, MANIFEST_FILE, { tensor: name, field: `ple.tables.${i}.offset` });
  }
  if (m.ple.tables.length !== plan.tables.length)
    fail(`${MANIFEST_FILE}: ple.tables has ${m.ple.tables.length} entries, the config needs ${plan.tables.length}`, MANIFEST_FILE, { field: "ple.tables" });
}

function fileSize(dir: string, file: string): number {
  try {
    return statSync(join(dir, file)).size;
  } catch (e) {
    return fail(`${file} is missing in ${dir} (${(e as NodeJS.ErrnoException).code ?? String(e)})`, file);
  }
}

function checkFileSizes(dir: string, m: ValidManifest) {
  const truncated = (file: string, size: number, expected: number, what: string, tensor?: string) =>
    fail(`${file} is truncated: ${size} bytes, expected ${expected} (${what})`, file, { tensor });

  const denseSize = fileSize(dir, DENSE_FILE);
  const denseEnd = alignUp(Math.max(0, ...m.tensors.map((t) => t.offset + t.bytes)), PAGE);
  if (denseSize < denseEnd) {
    const t = [...m.tensors].sort((a, b) => a.offset - b.offset).find((t) => t.offset + t.bytes > denseSize);
    if (t) truncated(DENSE_FILE, denseSize, denseEnd, `tensor ${t.name} ends at ${t.offset + t.bytes}`, t.name);
    truncated(DENSE_FILE, denseSize, denseEnd, `padding to a multiple of ${PAGE}`);
  }

  const x = m.experts;
  const expertsSize = fileSize(dir, EXPERTS_FILE);
  const expertsEnd = x.layers * x.per_layer * x.stride;
  if (expertsSize < expertsEnd) {
    const i = Math.floor(expertsSize / x.stride);
    const l = Math.floor(i / x.per_layer);
    const e = i % x.per_layer;
    truncated(EXPERTS_FILE, expertsSize, expertsEnd, `record layer ${l} expert ${e} ends at ${(i + 1) * x.stride}`, expertName(l, e));
  }

  if (m.ple) {
    const pleSize = fileSize(dir, PLE_FILE);
    const pleEnd = alignUp(Math.max(0, ...m.ple.tables.map((t) => t.offset + t.bytes)), PAGE);
    if (pleSize < pleEnd) {
      const t = [...m.ple.tables].sort((a, b) => a.offset - b.offset).find((t) => t.offset + t.bytes > pleSize);
      const name = t ? pleTableName(t.layer, t.order_index, t.head) : undefined;
      truncated(PLE_FILE, pleSize, pleEnd, t ? `table ${name} ends at ${t.offset + t.bytes}` : `padding to a multiple of ${PAGE}`, name);
    }
  }
}

/** Dequantized experts, least recently used first, bounded in bytes. */
class ExpertCache {
  private map = new Map<string, ExpertWeights>();
  private bytes = 0;
  constructor(private readonly limit: number) {}
  get(key: string): ExpertWeights | undefined {
    const v = this.map.get(key);
    if (v) {
      this.map.delete(key);
      this.map.set(key, v);
    }
    return v;
  }
  set(key: string, v: ExpertWeights, size: number) {
    this.map.set(key, v);
    this.bytes += size;
    for (const [k, old] of this.map) {
      if (this.bytes <= this.limit || k === key) break;
      this.map.delete(k);
      this.bytes -= (old.gate.length + old.up.length + old.down.length) * 4;
    }
  }
  clear() {
    this.map.clear();
    this.bytes = 0;
  }
}

class ModelDirectory implements ModelFiles {
  readonly config: ModelConfig;
  readonly expertLayout: ExpertLayout;
  readonly paths: { dense: string; experts: string; ple: string | null };
  private readonly byName: Map<string, TensorEntry>;
  private readonly pleByName: Map<string, PleTableEntry>;
  private dense: Uint8Array | null;
  private pleMap: Uint8Array | null = null;
  private expertsFd: number | null = null;
  private readonly cache = new Map<string, Float32Array>();
  private readonly experts: ExpertCache;

  constructor(readonly dir: string, readonly manifest: ValidManifest, expertCacheBytes: number) {
    this.config = manifest.config;
    const x = manifest.experts;
    this.expertLayout = { stride: x.stride, parts: x.parts, layers: x.layers, perLayer: x.per_layer };
    this.paths = { dense: join(dir, DENSE_FILE), experts: join(dir, EXPERTS_FILE), ple: manifest.ple ? join(dir, PLE_FILE) : null };
    this.byName = new Map(manifest.tensors.map((t) => [t.name, t]));
    this.pleByName = new Map((manifest.ple?.tables ?? []).map((t) => [pleTableName(t.layer, t.order_index, t.head), t]));
    // MAP_PRIVATE: the model's files are never written through this mapping.
    this.dense = Bun.mmap(this.paths.dense, { shared: false });
    this.experts = new ExpertCache(expertCacheBytes);
  }

  has(name: string) {
    return this.byName.has(name);
  }

  tensorInfo(name: string): TensorEntry {
    const t = this.byName.get(name);
    if (!t) return fail(`${DENSE_FILE}: no tensor ${name} in this model`, DENSE_FILE, { tensor: name });
    return t;
  }

  denseBytes(name: string): Uint8Array {
    const t = this.tensorInfo(name);
    return this.denseMap().subarray(t.offset, t.offset + t.bytes);
  }

  get(name: string): Float32Array {
    let v = this.cache.get(name);
    if (!v) {
      const t = this.tensorInfo(name);
      this.cache.set(name, (v = decode(this.denseBytes(name), t.shape, t.dtype)));
    }
    return v;
  }

  expertOffset(layer: number, e: number): number {
    const { layers, perLayer, stride } = this.expertLayout;
    if (!Number.isInteger(layer) || !Number.isInteger(e) || layer < 0 || layer >= layers || e < 0 || e >= perLayer)
      fail(`${EXPERTS_FILE}: no record layer ${layer} expert ${e} (${layers} layers of ${perLayer})`, EXPERTS_FILE, { tensor: expertName(layer, e) });
    return (layer * perLayer + e) * stride;
  }

  readExpertRecord(layer: number, e: number, into = new Uint8Array(this.expertLayout.stride)): Uint8Array {
    const offset = this.expertOffset(layer, e);
    const fd = (this.expertsFd ??= openSync(this.paths.experts, "r"));
    const n = readSync(fd, into, 0, this.expertLayout.stride, offset);
    if (n !== this.expertLayout.stride)
      fail(`${EXPERTS_FILE}: short read of record layer ${layer} expert ${e} (${n} of ${this.expertLayout.stride} bytes)`, EXPERTS_FILE, {
        tensor: expertName(layer, e),
      });
    return into;
  }

  expert(layer: number, e: number): ExpertWeights {
    const key = expertName(layer, e);
    let w = this.experts.get(key);
    if (!w) {
      const record = this.readExpertRecord(layer, e);
      const part = (p: ExpertPart) => decode(record.subarray(p.offset, p.offset + p.bytes), p.shape, p.dtype);
      const [gate, up, down] = this.expertLayout.parts.map(part);
      w = { gate: gate!, up: up!, down: down! };
      this.experts.set(key, w, (gate!.length + up!.length + down!.length) * 4);
    }
    return w;
  }

  pleTable(layer: number, o: number, j: number): Float32Array {
    const name = pleTableName(layer, o, j);
    let v = this.cache.get(name);
    if (!v) {
      const t = this.pleByName.get(name);
      if (!t || !this.paths.ple) return fail(`${PLE_FILE}: no table ${name} in this model`, PLE_FILE, { tensor: name });
      this.pleMap ??= Bun.mmap(this.paths.ple, { shared: false });
      const bytes = this.pleMap.subarray(t.offset, t.offset + t.bytes);
      this.cache.set(name, (v = decode(bytes, [t.rows, this.config.ple!.head_dim], this.manifest.ple!.dtype)));
    }
    return v;
  }

  async verify(onProgress?: VerifyProgress): Promise<void> {
    const m = this.manifest;
    const x = this.expertLayout;
    const records = x.layers * x.perLayer;
    const pleTables = m.ple?.tables ?? [];
    const total =
      m.tensors.reduce((s, t) => s + t.bytes, 0) + records * x.stride + pleTables.reduce((s, t) => s + t.bytes, 0);
    let done = 0;
    const mismatch = (file: string, what: string, tensor: string, expected: string, got: string) =>
      fail(`${file}: ${what}: checksum mismatch (expected ${expected}, got ${got})`, file, { tensor });

    for (const t of m.tensors) {
      const got = checksum(this.denseBytes(t.name));
      if (got !== t.checksum) mismatch(DENSE_FILE, `tensor ${t.name}`, t.name, t.checksum, got);
      done += t.bytes;
      onProgress?.(done, total);
    }

    // Records are checked in batches of about 64 MiB read with one positional read each.
    const batch = Math.max(1, Math.floor((64 << 20) / x.stride));
    const buf = new Uint8Array(batch * x.stride);
    const fh = await open(this.paths.experts, "r");
    try {
      for (let first = 0; first < records; first += batch) {
        const count = Math.min(batch, records - first);
        const want = count * x.stride;
        let got = 0;
        while (got < want) {
          const { bytesRead } = await fh.read(buf, got, want - got, first * x.stride + got);
          if (bytesRead === 0) break;
          got += bytesRead;
        }
        for (let k = 0; k < count; k++) {
          const i = first + k;
          const l = Math.floor(i / x.perLayer);
          const e = i % x.perLayer;
          const sum = checksum(buf.subarray(k * x.stride, Math.min(got, (k + 1) * x.stride)));
          if (sum !== m.experts.checksums[i])
            mismatch(EXPERTS_FILE, `record layer ${l} expert ${e}`, expertName(l, e), m.experts.checksums[i]!, sum);
        }
        done += want;
        onProgress?.(done, total);
      }
    } finally {
      await fh.close();
    }

    if (pleTables.length) {
      this.pleMap ??= Bun.mmap(this.paths.ple!, { shared: false });
      for (const t of pleTables) {
        const name = pleTableName(t.layer, t.order_index, t.head);
        const got = checksum(this.pleMap.subarray(t.offset, t.offset + t.bytes));
        if (got !== t.checksum) mismatch(PLE_FILE, `table ${name}`, name, t.checksum, got);
        done += t.bytes;
        onProgress?.(done, total);
      }
    }
  }

  close(): void {
    if (this.expertsFd !== null) closeSync(this.expertsFd);
    this.expertsFd = null;
    this.dense = null;
    this.pleMap = null;
    this.cache.clear();
    this.experts.clear();
  }

  private denseMap(): Uint8Array {
    if (!this.dense) return fail(`${DENSE_FILE}: model ${this.dir} is closed`, DENSE_FILE);
    return this.dense;
  }
}

