// Reads a model directory (docs/format.md): checks cherenkov.json against the config's tensor
// inventory and the files' sizes up front, so that every later read is in bounds, then serves
// tensors as the reference's Weights (dequantized to f32 on first use, cached).
import { closeSync, existsSync, fstatSync, openSync, read, readdirSync, readSync, statSync } from "node:fs";
import { join } from "node:path";
import { checksum } from "./checksum.ts";
import { decode } from "./codec.ts";
import { describeIssues, ModelConfig } from "./config.ts";
import { ChecksumMismatchError, ModelFormatError } from "./errors.ts";
import {
  DENSE_FILE,
  EXPERTS_FILE,
  Manifest,
  MANIFEST_FILE,
  PAGE,
  PLE_FILE,
  alignUp,
  FORMATS,
  manifestChecksum,
  PART_ALIGN,
  TOKENIZER_CONFIG_FILE,
  TOKENIZER_FILE,
  type ExpertPart,
  type PleTableEntry,
  type TensorEntry,
} from "./manifest.ts";
import { errnoOf, FILE_LIMITS, readRegularFile, readTextFile } from "./safe-read.ts";
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
  /** The stored bytes of a dense tensor, read from the held dense.bin and checked against its checksum. */
  denseBytes(name: string): Uint8Array;
  /**
   * Reads dense.bin (its first into.length bytes) into `into`, checking every tensor's
   * checksum as it lands (ChecksumMismatchError naming the tensor).
   */
  readDenseInto(into: Uint8Array, onBytes?: (n: number) => void): void;
  /** The same for ple.bin. */
  readPleInto(into: Uint8Array, onBytes?: (n: number) => void): void;
  /** Throws a ChecksumMismatchError (file, layer, expert) unless `record` matches record (layer, e)'s checksum. */
  verifyRecord(layer: number, e: number, record: Uint8Array): void;
  /** Record (layer, e)'s checksum in the index (16 hex digits). */
  recordChecksum(layer: number, e: number): string;
  /** Device and inode of a file held open since openModel (null: the model has no such file). */
  fileIdentity(file: "dense" | "experts" | "ple"): { dev: number; ino: number; size: number } | null;
  /** Byte offset of record (l, e) in experts.bin. */
  expertOffset(layer: number, e: number): number;
  /** The stored bytes of record (l, e), read from experts.bin (stride bytes) and checked against its checksum. */
  readExpertRecord(layer: number, e: number, into?: Uint8Array): Uint8Array;
  /**
   * What no checksum covers in this directory, each naming the file and why (an unsealed
   * cherenkov/1 index, a tokenizer file the index records no checksum for); empty when
   * every file is sealed. Loading warns with it; `cherenkov seal` records what is missing.
   */
  readonly unverified: string[];
  /**
   * Checks every checksum (the tokenizer files' included, where recorded); throws a
   * ModelFormatError naming the first tensor, record, table or file that fails.
   */
  verify(onProgress?: VerifyProgress): Promise<void>;
  close(): void;
}

/** Bytes of dequantized (f32) experts the reference keeps by default. */
export const DEFAULT_EXPERT_CACHE_BYTES = 256 << 20;

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
  const model = new ModelDirectory(dir, manifest, opts.expertCacheBytes ?? DEFAULT_EXPERT_CACHE_BYTES);
  if (opts.verify) await model.verify();
  return model;
}

/** A checkpoint as `cherenkov convert` takes it: config.json beside safetensors files. */
function isCheckpoint(dir: string): boolean {
  try {
    return existsSync(join(dir, "config.json")) && readdirSync(dir).some((f) => f.endsWith(".safetensors") || f === "model.safetensors.index.json");
  } catch {
    return false;
  }
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
    text = readTextFile(path, MANIFEST_FILE, FILE_LIMITS.manifest);
  } catch (e) {
    if (errnoOf(e) === "ENOENT") {
      if (isCheckpoint(dir))
        return fail(`${MANIFEST_FILE} is missing in ${dir}: it holds a Hugging Face or MLX checkpoint (config.json, *.safetensors); convert it first: cherenkov convert ${dir} OUT_DIR`, MANIFEST_FILE);
      return fail(`${MANIFEST_FILE} is missing in ${dir} (not a model directory, or an unfinished write)`, MANIFEST_FILE);
    }
    throw e;
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (e) {
    return fail(`${MANIFEST_FILE}: not valid JSON: ${(e as Error).message}`, MANIFEST_FILE);
  }
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) return fail(`${MANIFEST_FILE}: not a JSON object`, MANIFEST_FILE);
  const rawObj = raw as Record<string, unknown>;
  if (!(FORMATS as readonly unknown[]).includes(rawObj.format))
    return fail(`${MANIFEST_FILE}: format ${JSON.stringify(rawObj.format)} is not supported (this cherenkov reads ${FORMATS.join(", ")})`, MANIFEST_FILE, {
      field: "format",
    });
  if (rawObj.format !== "cherenkov/1") {
    // cherenkov/2 and later seal the index: any changed value is refused before it is used.
    if (typeof rawObj.manifest_checksum !== "string")
      return fail(`${MANIFEST_FILE}: manifest_checksum is missing (format ${JSON.stringify(rawObj.format)} requires it)`, MANIFEST_FILE, { field: "manifest_checksum" });
    const want = manifestChecksum(rawObj);
    if (rawObj.manifest_checksum !== want)
      return fail(
        `${MANIFEST_FILE}: manifest checksum mismatch (expected ${rawObj.manifest_checksum}, got ${want}): the index was changed or corrupted after it was written`,
        MANIFEST_FILE,
        { field: "manifest_checksum" },
      );
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
  checkDisjoint(m.tensors.map((t, i) => ({ name: t.name, offset: t.offset, bytes: t.bytes, field: `tensors.${i}.offset` })), "tensor");
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

/** Refuses blocks of one file that share bytes (two tensors must never alias). */
function checkDisjoint(blocks: { name: string; offset: number; bytes: number; field: string }[], what: string) {
  const sorted = [...blocks].sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < sorted.length; i++) {
    const a = sorted[i - 1]!;
    const b = sorted[i]!;
    if (b.offset < a.offset + a.bytes)
      fail(`${MANIFEST_FILE}: ${what} ${b.name} at ${b.offset} overlaps ${a.name} (${a.offset}..${a.offset + a.bytes})`, MANIFEST_FILE, {
        tensor: b.name,
        field: b.field,
      });
  }
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
  // Parts in order, aligned, and apart: an overlap would make two matrices share bytes.
  x.parts.forEach((p, i) => {
    const tensor = `experts.${p.name}`;
    if (p.offset % PART_ALIGN !== 0)
      fail(`${MANIFEST_FILE}: expert part ${p.name}: offset ${p.offset} is not a multiple of ${PART_ALIGN}`, MANIFEST_FILE, { tensor, field: `experts.parts.${i}.offset` });
    const prev = x.parts[i - 1];
    if (prev && p.offset < prev.offset + prev.bytes)
      fail(`${MANIFEST_FILE}: expert part ${p.name} at ${p.offset} overlaps or precedes ${prev.name} (${prev.offset}..${prev.offset + prev.bytes})`, MANIFEST_FILE, {
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
  checkDisjoint(
    m.ple.tables.map((t, i) => ({ name: key(t), offset: t.offset, bytes: t.bytes, field: `ple.tables.${i}.offset` })),
    "PLE table",
  );
  if (m.ple.tables.length !== plan.tables.length)
    fail(`${MANIFEST_FILE}: ple.tables has ${m.ple.tables.length} entries, the config needs ${plan.tables.length}`, MANIFEST_FILE, { field: "ple.tables" });
}

function fileSize(dir: string, file: string): number {
  let st;
  try {
    st = statSync(join(dir, file));
  } catch (e) {
    return fail(openFailure(file, dir, e), file);
  }
  if (!st.isFile()) fail(`${file}: ${join(dir, file)} is not a regular file (a device, FIFO or directory)`, file);
  return st.size;
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

/**
 * Dequantized experts, least recently used first, bounded in bytes. An expert that does not
 * fit takes over the storage of the ones it evicts (every record has the same shapes): a
 * large model cycles hundreds of experts per token, and fresh arrays for each would leave
 * gigabytes of garbage ahead of the collector (the reference measured 19.9 GB of RSS on the
 * 80b-a3b shape that way, twice what it holds).
 */
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
  /** Makes room for an entry of `size` bytes; returns the storage of the last expert evicted, if any, to reuse. */
  evictFor(size: number): ExpertWeights | undefined {
    let spare: ExpertWeights | undefined;
    for (const [k, old] of this.map) {
      if (this.bytes + size <= this.limit) break;
      this.map.delete(k);
      this.bytes -= entryBytes(old);
      spare = old;
    }
    return spare;
  }
  set(key: string, v: ExpertWeights) {
    this.map.set(key, v);
    this.bytes += entryBytes(v);
  }
  clear() {
    this.map.clear();
    this.bytes = 0;
  }
}

const entryBytes = (w: ExpertWeights) => (w.gate.length + w.up.length + w.down.length) * 4;

/** A model file held open from openModel on: renames and rewrites of the path are invisible. */
interface HeldFile {
  readonly fd: number;
  readonly size: number;
  readonly dev: number;
  readonly ino: number;
}

function holdFile(dir: string, file: string): HeldFile {
  const path = join(dir, file);
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch (e) {
    return fail(openFailure(file, dir, e), file);
  }
  const st = fstatSync(fd);
  if (!st.isFile()) {
    closeSync(fd);
    return fail(`${file}: ${path} is not a regular file`, file);
  }
  return { fd, size: st.size, dev: st.dev, ino: st.ino };
}

/**
 * Why `file` of `dir` did not open, by errno: only ENOENT is "missing"; a file that is there but
 * not readable (mode 000, another owner) is named as unreadable, so nobody goes looking for a
 * file that exists.
 */
export function openFailure(file: string, dir: string, e: unknown): string {
  const code = (e as NodeJS.ErrnoException).code;
  if (code === "ENOENT") return `${file} is missing in ${dir} (ENOENT)`;
  if (code === "EACCES" || code === "EPERM") return `${file} in ${dir} exists but cannot be read (${code}: permission denied; check its mode and owner)`;
  return `${file} in ${dir} cannot be opened (${code ?? String(e)})`;
}

/** Reads exactly `into.length` bytes at `position`; a short read (the file shrank) is an error naming `what`. */
function preadExactly(held: HeldFile, into: Uint8Array, position: number, file: string, what: string, tensor?: string): Uint8Array {
  let got = 0;
  while (got < into.length) {
    const n = readSync(held.fd, into, got, Math.min(into.length - got, 1 << 30), position + got);
    if (n === 0) fail(`${file}: short read of ${what} (${got} of ${into.length} bytes at offset ${position}): the file was truncated after it was opened`, file, { tensor });
    got += n;
  }
  return into;
}

class ModelDirectory implements ModelFiles {
  readonly config: ModelConfig;
  readonly expertLayout: ExpertLayout;
  readonly paths: { dense: string; experts: string; ple: string | null };
  private readonly byName: Map<string, TensorEntry>;
  private readonly pleByName: Map<string, PleTableEntry>;
  private held: { dense: HeldFile; experts: HeldFile; ple: HeldFile | null } | null;
  private readonly cache = new Map<string, Float32Array>();
  private readonly experts: ExpertCache;
  readonly unverified: string[];
  /** One record's bytes, reused by every expert() read. */
  private recordScratch: Uint8Array<ArrayBuffer> | null = null;
  /** The stored bytes of the tensor get() decodes, reused (as large as the largest so far). */
  private denseScratch: Uint8Array<ArrayBuffer> | null = null;

  constructor(readonly dir: string, readonly manifest: ValidManifest, expertCacheBytes: number) {
    this.config = manifest.config;
    const x = manifest.experts;
    this.expertLayout = { stride: x.stride, parts: x.parts, layers: x.layers, perLayer: x.per_layer };
    this.paths = { dense: join(dir, DENSE_FILE), experts: join(dir, EXPERTS_FILE), ple: manifest.ple ? join(dir, PLE_FILE) : null };
    this.byName = new Map(manifest.tensors.map((t) => [t.name, t]));
    this.pleByName = new Map((manifest.ple?.tables ?? []).map((t) => [pleTableName(t.layer, t.order_index, t.head), t]));
    // Every file is opened now and held until close(): a writer that replaces them later
    // (rename) leaves this model on the files it validated. Nothing is mapped: a file
    // truncated in place gives a clean short-read error here, never SIGBUS.
    const opened: HeldFile[] = [];
    try {
      const hold = (f: string) => {
        const h = holdFile(dir, f);
        opened.push(h);
        return h;
      };
      this.held = { dense: hold(DENSE_FILE), experts: hold(EXPERTS_FILE), ple: manifest.ple ? hold(PLE_FILE) : null };
      checkHeldSizes(manifest, this.held);
    } catch (e) {
      for (const h of opened) closeSync(h.fd);
      throw e;
    }
    this.experts = new ExpertCache(expertCacheBytes);
    this.unverified = unverifiedFiles(dir, manifest);
  }

  private files() {
    if (!this.held) return fail(`model ${this.dir} is closed`, this.dir);
    return this.held;
  }

  /** Identity of a held file (device, inode): lets another opener check it reads the same file. */
  fileIdentity(file: "dense" | "experts" | "ple"): { dev: number; ino: number; size: number } | null {
    const h = this.files()[file];
    return h ? { dev: h.dev, ino: h.ino, size: h.size } : null;
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
    const bytes = preadExactly(this.files().dense, new Uint8Array(t.bytes), t.offset, DENSE_FILE, `tensor ${name}`, name);
    verifyBytes(bytes, t.checksum, DENSE_FILE, `tensor ${name}`, { tensor: name });
    return bytes;
  }

  readDenseInto(into: Uint8Array, onBytes?: (n: number) => void): void {
    readVerifiedInto(
      this.files().dense,
      into,
      this.manifest.tensors.map((t) => ({ offset: t.offset, bytes: t.bytes, checksum: t.checksum, what: `tensor ${t.name}`, tensor: t.name })),
      DENSE_FILE,
      onBytes,
    );
  }

  readPleInto(into: Uint8Array, onBytes?: (n: number) => void): void {
    const h = this.files().ple;
    if (!h || !this.manifest.ple) return fail(`${PLE_FILE}: this model has no PLE tables`, PLE_FILE);
    const tables = this.manifest.ple.tables.map((t) => {
      const name = pleTableName(t.layer, t.order_index, t.head);
      return { offset: t.offset, bytes: t.bytes, checksum: t.checksum, what: `table ${name}`, tensor: name };
    });
    readVerifiedInto(h, into, tables, PLE_FILE, onBytes);
  }

  get(name: string): Float32Array {
    let v = this.cache.get(name);
    if (!v) {
      const t = this.tensorInfo(name);
      // The stored bytes go through one reused buffer: a fresh array per tensor left the whole
      // stored dense.bin (1.7 GB on the 80b-a3b shape) as garbage behind the reference's load.
      if (!this.denseScratch || this.denseScratch.length < t.bytes) this.denseScratch = new Uint8Array(t.bytes);
      const bytes = preadExactly(this.files().dense, this.denseScratch.subarray(0, t.bytes), t.offset, DENSE_FILE, `tensor ${name}`, name);
      verifyBytes(bytes, t.checksum, DENSE_FILE, `tensor ${name}`, { tensor: name });
      this.cache.set(name, (v = decode(bytes, t.shape, t.dtype)));
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
    if (into.length !== this.expertLayout.stride)
      fail(`${EXPERTS_FILE}: record buffer of ${into.length} bytes, the stride is ${this.expertLayout.stride}`, EXPERTS_FILE);
    preadExactly(this.files().experts, into, offset, EXPERTS_FILE, `record layer ${layer} expert ${e}`, expertName(layer, e));
    verifyExpertRecord(this.manifest, into, layer, e);
    return into;
  }

  recordChecksum(layer: number, e: number): string {
    this.expertOffset(layer, e);
    return this.manifest.experts.checksums[layer * this.expertLayout.perLayer + e]!;
  }

  verifyRecord(layer: number, e: number, record: Uint8Array): void {
    this.expertOffset(layer, e);
    verifyExpertRecord(this.manifest, record, layer, e);
  }

  expert(layer: number, e: number): ExpertWeights {
    const key = expertName(layer, e);
    let w = this.experts.get(key);
    if (!w) {
      const { stride, parts } = this.expertLayout;
      const record = this.readExpertRecord(layer, e, (this.recordScratch ??= new Uint8Array(stride)));
      // An expert is used right after this call (one MoE row), so evicted storage can be reused.
      const spare = this.experts.evictFor(parts.reduce((s, p) => s + p.shape.reduce((a, b) => a * b, 1) * 4, 0));
      const [gate, up, down] = parts.map((p, i) =>
        decode(record.subarray(p.offset, p.offset + p.bytes), p.shape, p.dtype, spare && [spare.gate, spare.up, spare.down][i]),
      );
      w = { gate: gate!, up: up!, down: down! };
      this.experts.set(key, w);
    }
    return w;
  }

  pleTable(layer: number, o: number, j: number): Float32Array {
    const name = pleTableName(layer, o, j);
    let v = this.cache.get(name);
    if (!v) {
      const t = this.pleByName.get(name);
      const h = this.files().ple;
      if (!t || !h) return fail(`${PLE_FILE}: no table ${name} in this model`, PLE_FILE, { tensor: name });
      const bytes = preadExactly(h, new Uint8Array(t.bytes), t.offset, PLE_FILE, `table ${name}`, name);
      verifyBytes(bytes, t.checksum, PLE_FILE, `table ${name}`, { tensor: name });
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
    const step = (n: number) => {
      done += n;
      onProgress?.(done, total);
    };
    for (const t of m.tensors) {
      this.denseBytes(t.name);
      step(t.bytes);
    }
    // Records are checked in batches of about 64 MiB read with one positional read each.
    const batch = Math.max(1, Math.floor((64 << 20) / x.stride));
    const buf = new Uint8Array(batch * x.stride);
    const held = this.files().experts;
    const readAt = (off: number, len: number, pos: number) =>
      new Promise<number>((resolve, reject) => read(held.fd, buf, off, len, pos, (err, n) => (err ? reject(err) : resolve(n))));
    for (let first = 0; first < records; first += batch) {
      const count = Math.min(batch, records - first);
      const want = count * x.stride;
      let got = 0;
      while (got < want) {
        const n = await readAt(got, want - got, first * x.stride + got);
        if (n === 0) break;
        got += n;
      }
      for (let k = 0; k < count; k++) {
        const i = first + k;
        verifyExpertRecord(m, buf.subarray(k * x.stride, Math.min(got, (k + 1) * x.stride)), Math.floor(i / x.perLayer), i % x.perLayer);
      }
      step(want);
    }
    for (const t of pleTables) {
      this.cache.delete(pleTableName(t.layer, t.order_index, t.head));
      this.pleTable(t.layer, t.order_index, t.head);
      step(t.bytes);
    }
    for (const [file, expected] of Object.entries(m.files ?? {})) {
      const cap = file === TOKENIZER_FILE ? FILE_LIMITS.tokenizer : FILE_LIMITS.tokenizerConfig;
      let bytes: Uint8Array;
      try {
        bytes = readRegularFile(join(this.dir, file), file, cap);
      } catch (e) {
        if (errnoOf(e) === "ENOENT") fail(`${file} is missing in ${this.dir} (${MANIFEST_FILE} records its checksum)`, file);
        throw e;
      }
      verifyBytes(bytes, expected, file, "the file");
    }
  }

  close(): void {
    if (this.held) for (const h of [this.held.dense, this.held.experts, this.held.ple]) if (h) closeSync(h.fd);
    this.held = null;
    this.cache.clear();
    this.experts.clear();
    this.recordScratch = this.denseScratch = null;
  }
}

/**
 * The files of `dir` that no checksum covers, each with the reason: a cherenkov/1 index is
 * not sealed, and a tokenizer file present without a recorded checksum can change unnoticed.
 */
export function unverifiedFiles(dir: string, m: Manifest): string[] {
  const out: string[] = [];
  if (m.format === "cherenkov/1") out.push(`${MANIFEST_FILE} (format cherenkov/1: the index and config are not sealed)`);
  for (const f of [TOKENIZER_FILE, TOKENIZER_CONFIG_FILE]) {
    if (m.files?.[f] !== undefined) continue;
    try {
      statSync(join(dir, f));
    } catch {
      continue; // absent: nothing to verify
    }
    out.push(`${f} (no checksum recorded in ${MANIFEST_FILE})`);
  }
  return out;
}

/** Checks the held files are long enough for the index (they may differ from the paths' stat). */
function checkHeldSizes(m: ValidManifest, held: { dense: HeldFile; experts: HeldFile; ple: HeldFile | null }) {
  const denseEnd = Math.max(0, ...m.tensors.map((t) => t.offset + t.bytes));
  if (held.dense.size < denseEnd) fail(`${DENSE_FILE} is truncated: ${held.dense.size} bytes, the index needs ${denseEnd}`, DENSE_FILE);
  const x = m.experts;
  const expertsEnd = x.layers * x.per_layer * x.stride;
  if (held.experts.size < expertsEnd) fail(`${EXPERTS_FILE} is truncated: ${held.experts.size} bytes, the index needs ${expertsEnd}`, EXPERTS_FILE);
  if (m.ple && held.ple) {
    const pleEnd = Math.max(0, ...m.ple.tables.map((t) => t.offset + t.bytes));
    if (held.ple.size < pleEnd) fail(`${PLE_FILE} is truncated: ${held.ple.size} bytes, the index needs ${pleEnd}`, PLE_FILE);
  }
}

/** Throws a ChecksumMismatchError naming `what` when `bytes` do not hash to `expected`. */
export function verifyBytes(
  bytes: Uint8Array,
  expected: string,
  file: string,
  what: string,
  info: { tensor?: string; layer?: number; expert?: number } = {},
): void {
  const got = checksum(bytes);
  if (got !== expected)
    throw new ChecksumMismatchError(`${file}: ${what}: checksum mismatch (expected ${expected}, got ${got})`, { file, ...info });
}

/** Verifies expert record (layer, e) (`stride` bytes) against the index. */
export function verifyExpertRecord(m: Manifest, record: Uint8Array, layer: number, e: number): void {
  const expected = m.experts.checksums[layer * m.experts.per_layer + e]!;
  verifyBytes(record, expected, EXPERTS_FILE, `record layer ${layer} expert ${e}`, { tensor: expertName(layer, e), layer, expert: e });
}

/**
 * Reads the blocks of a held file into `into` (the file's first into.length bytes; gaps are
 * read too), checking each block's checksum as it lands. One pass: the load reads these
 * bytes anyway, so the check costs only the hash.
 */
function readVerifiedInto(
  held: HeldFile,
  into: Uint8Array,
  blocks: { offset: number; bytes: number; checksum: string; what: string; tensor: string }[],
  file: string,
  onBytes?: (n: number) => void,
): void {
  const chunk = 64 << 20;
  const sorted = [...blocks].sort((a, b) => a.offset - b.offset);
  let next = 0;
  const end = Math.min(into.length, held.size);
  for (let pos = 0; pos < end; pos += chunk) {
    const n = Math.min(chunk, end - pos);
    preadExactly(held, into.subarray(pos, pos + n), pos, file, `bytes ${pos}..${pos + n}`);
    // Every block that now lies wholly in memory.
    while (next < sorted.length && sorted[next]!.offset + sorted[next]!.bytes <= pos + n) {
      const b = sorted[next++]!;
      verifyBytes(into.subarray(b.offset, b.offset + b.bytes), b.checksum, file, b.what, { tensor: b.tensor });
    }
    onBytes?.(n);
  }
  if (next < sorted.length) {
    const b = sorted[next]!;
    fail(`${file}: ${b.what} ends at ${b.offset + b.bytes}, past the ${into.length} bytes read`, file, { tensor: b.tensor });
  }
}
