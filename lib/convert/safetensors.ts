// Reads safetensors checkpoints tensor by tensor with positional reads: one file, or a
// directory of shards listed by model.safetensors.index.json. Only the JSON headers are held
// in memory; a tensor's bytes are read when asked for. Every error names the file and tensor.
import { closeSync, constants, existsSync, fstatSync, openSync, readdirSync, readSync, writeSync } from "node:fs";
import { basename, isAbsolute, join, relative, resolve, sep } from "node:path";
import { bf16ToF32, f16ToF32 } from "../model/dtype.ts";
import { readTextFile } from "../model/safe-read.ts";

/** safetensors dtype names and their element sizes. */
export const ST_DTYPE_BYTES: Record<string, number> = {
  F64: 8, F32: 4, F16: 2, BF16: 2, I64: 8, I32: 4, I16: 2, I8: 1, U64: 8, U32: 4, U16: 2, U8: 1, BOOL: 1,
  F8_E4M3: 1, F8_E5M2: 1, F8_E8M0: 1, F4: 1,
};

export class CheckpointError extends Error {
  override name = "CheckpointError";
  constructor(message: string, readonly file: string, readonly tensor?: string) {
    super(message);
  }
}

export interface StTensorInfo {
  name: string;
  dtype: string;
  shape: number[];
  /** Absolute byte offset of the data in the file. */
  offset: number;
  bytes: number;
  file: string;
}

const numel = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);
const MAX_HEADER = 256 << 20;

/** Reads exactly `length` bytes at `position` of fd into a new buffer (readSync may return less). */
function readExact(fd: number, length: number, position: number, file: string): Uint8Array {
  const out = new Uint8Array(length);
  let done = 0;
  while (done < length) {
    const n = readSync(fd, out, done, Math.min(length - done, 1 << 30), position + done);
    if (n === 0) throw new CheckpointError(`${file}: unexpected end of file at byte ${position + done}`, file);
    done += n;
  }
  return out;
}

/** One .safetensors file: its header, and positional reads of its tensors. */
export class SafetensorsFile {
  readonly tensors = new Map<string, StTensorInfo>();
  readonly metadata: Record<string, string> = {};
  private fd: number;

  constructor(readonly path: string) {
    const file = basename(path);
    try {
      // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below)
      this.fd = openSync(path, constants.O_RDONLY | (constants.O_NONBLOCK ?? 0));
    } catch (e) {
      throw new CheckpointError(`cannot open ${path}: ${(e as NodeJS.ErrnoException).code ?? e}`, file);
    }
    try {
      if (!fstatSync(this.fd).isFile()) throw new CheckpointError(`${file}: ${path} is not a regular file (a FIFO, device or directory); refusing to read it`, file);
      this.parseHeader(file);
    } catch (e) {
      closeSync(this.fd);
      throw e;
    }
  }

  private parseHeader(file: string) {
    const size = fstatSync(this.fd).size;
    if (size < 8) throw new CheckpointError(`${file}: ${size} bytes is too short for a safetensors file`, file);
    const lenBytes = readExact(this.fd, 8, 0, file);
    const headerLen = Number(new DataView(lenBytes.buffer).getBigUint64(0, true));
    if (headerLen > MAX_HEADER || 8 + headerLen > size)
      throw new CheckpointError(`${file}: header length ${headerLen} does not fit in the file (${size} bytes); not a safetensors file?`, file);
    let header: Record<string, unknown>;
    try {
      header = JSON.parse(new TextDecoder().decode(readExact(this.fd, headerLen, 8, file)));
    } catch (e) {
      throw new CheckpointError(`${file}: the header is not valid JSON: ${(e as Error).message}`, file);
    }
    if (typeof header !== "object" || header === null || Array.isArray(header))
      throw new CheckpointError(`${file}: the header is not a JSON object`, file);
    const dataStart = 8 + headerLen;
    for (const [name, raw] of Object.entries(header)) {
      if (name === "__metadata__") {
        Object.assign(this.metadata, raw as object);
        continue;
      }
      const e = raw as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
      const bad = (why: string) => new CheckpointError(`${file}: tensor ${name}: ${why}`, file, name);
      if (typeof e.dtype !== "string" || !(e.dtype in ST_DTYPE_BYTES)) throw bad(`unknown dtype ${JSON.stringify(e.dtype)}`);
      if (!Array.isArray(e.shape) || !e.shape.every((d) => Number.isInteger(d) && d >= 0)) throw bad(`bad shape ${JSON.stringify(e.shape)}`);
      const off = e.data_offsets;
      if (!Array.isArray(off) || off.length !== 2 || !off.every((o) => Number.isInteger(o) && o >= 0) || off[1] < off[0])
        throw bad(`bad data_offsets ${JSON.stringify(off)}`);
      const bytes = off[1] - off[0];
      const want = e.dtype === "F4" ? numel(e.shape) / 2 : numel(e.shape) * ST_DTYPE_BYTES[e.dtype]!;
      if (bytes !== want) throw bad(`data_offsets span ${bytes} bytes, ${e.dtype} [${e.shape.join(", ")}] needs ${want}`);
      if (dataStart + off[1] > size) throw bad(`data ends at byte ${dataStart + off[1]}, past the end of the file (${size} bytes; truncated?)`);
      this.tensors.set(name, { name, dtype: e.dtype, shape: e.shape as number[], offset: dataStart + off[0], bytes, file });
    }
  }

  /** `length` bytes of tensor `name` starting `start` bytes into its data. */
  read(name: string, start = 0, length?: number): Uint8Array {
    const t = this.tensors.get(name);
    if (!t) throw new CheckpointError(`${basename(this.path)}: no tensor ${name}`, basename(this.path), name);
    const len = length ?? t.bytes - start;
    if (start < 0 || start + len > t.bytes)
      throw new CheckpointError(`${t.file}: tensor ${name}: read of ${len} bytes at ${start} is outside its ${t.bytes} bytes`, t.file, name);
    return readExact(this.fd, len, t.offset + start, t.file);
  }

  close(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
  }
}

export const INDEX_FILE = "model.safetensors.index.json";

/**
 * Refuses a file name from the checkpoint's index that leaves the checkpoint directory (an
 * absolute path, a `..` step). Names are checked, not where symlinks lead: Hugging Face caches
 * link shards to blobs elsewhere, and that is the caller's own directory layout.
 */
export function checkConfined(dir: string, name: string, tensor: string): void {
  const inside = relative(resolve(dir), resolve(dir, name));
  if (isAbsolute(name) || name.split(/[\\/]/).includes("..") || inside === "" || inside === ".." || inside.startsWith(".." + sep) || isAbsolute(inside))
    throw new CheckpointError(`${INDEX_FILE}: weight_map names ${JSON.stringify(name)} for ${tensor}, outside the checkpoint directory ${dir}; refusing to open it`, INDEX_FILE, tensor);
}

/**
 * The tensors of a checkpoint directory: the shards named by model.safetensors.index.json,
 * or else every *.safetensors file in it. Names must be unique across files.
 */
export class Checkpoint {
  private files: SafetensorsFile[] = [];
  private byName = new Map<string, SafetensorsFile>();

  constructor(readonly dir: string) {
    const shardNames = this.shardList();
    try {
      for (const f of shardNames) {
        const st = new SafetensorsFile(join(dir, f));
        this.files.push(st);
        for (const name of st.tensors.keys()) {
          const other = this.byName.get(name);
          if (other) throw new CheckpointError(`tensor ${name} is in both ${basename(other.path)} and ${f}`, f, name);
          this.byName.set(name, st);
        }
      }
    } catch (e) {
      this.close();
      throw e;
    }
  }

  private shardList(): string[] {
    const indexPath = join(this.dir, INDEX_FILE);
    if (existsSync(indexPath)) {
      let index: { weight_map?: Record<string, string> };
      let text: string;
      try {
        text = readTextFile(indexPath, INDEX_FILE, MAX_HEADER);
      } catch (e) {
        throw new CheckpointError((e as Error).message, INDEX_FILE);
      }
      try {
        index = JSON.parse(text);
      } catch (e) {
        throw new CheckpointError(`${INDEX_FILE}: not valid JSON: ${(e as Error).message}`, INDEX_FILE);
      }
      if (!index.weight_map || typeof index.weight_map !== "object")
        throw new CheckpointError(`${INDEX_FILE}: has no weight_map`, INDEX_FILE);
      for (const [tensor, s] of Object.entries(index.weight_map)) {
        if (typeof s !== "string" || s === "") throw new CheckpointError(`${INDEX_FILE}: weight_map entry of ${tensor} is not a file name`, INDEX_FILE, tensor);
        checkConfined(this.dir, s, tensor);
      }
      const shards = [...new Set(Object.values(index.weight_map))];
      for (const s of shards)
        if (!existsSync(join(this.dir, s)))
          throw new CheckpointError(`${INDEX_FILE} lists shard ${s}, which is missing in ${this.dir}`, String(s));
      return shards.sort();
    }
    let entries: string[];
    try {
      entries = readdirSync(this.dir);
    } catch (e) {
      throw new CheckpointError(`cannot read checkpoint directory ${this.dir}: ${(e as NodeJS.ErrnoException).code ?? e}`, this.dir);
    }
    const files = entries.filter((f) => f.endsWith(".safetensors")).sort();
    if (files.length === 0) throw new CheckpointError(`no .safetensors files in ${this.dir}`, this.dir);
    return files;
  }

  get names(): string[] {
    return [...this.byName.keys()];
  }

  has(name: string): boolean {
    return this.byName.has(name);
  }

  info(name: string): StTensorInfo {
    const f = this.byName.get(name);
    if (!f) throw new CheckpointError(`missing tensor ${name} (not in any .safetensors file of ${this.dir})`, this.dir, name);
    return f.tensors.get(name)!;
  }

  /** Raw bytes of a tensor, or of `length` bytes from `start` (e.g. one slice along dim 0). */
  read(name: string, start = 0, length?: number): Uint8Array {
    this.info(name);
    return this.byName.get(name)!.read(name, start, length);
  }

  /** A float tensor (F32, F16, BF16, F64), or its slice `index` along dim 0, as f32. */
  readF32(name: string, index?: number): Float32Array {
    const t = this.info(name);
    const size = ST_DTYPE_BYTES[t.dtype]!;
    let start = 0;
    let count = numel(t.shape);
    if (index !== undefined) {
      const dim0 = t.shape[0] ?? 1;
      if (!Number.isInteger(index) || index < 0 || index >= dim0)
        throw new CheckpointError(`${t.file}: tensor ${name}: slice ${index} outside dim 0 of size ${dim0}`, t.file, name);
      count = numel(t.shape.slice(1));
      start = index * count * size;
    }
    return toF32(this.read(name, start, count * size), t.dtype, `${t.file}: tensor ${name}`);
  }

  close(): void {
    for (const f of this.files) f.close();
    this.files = [];
  }
}

/** Float bytes of a safetensors dtype as f32 (copies; the input may be unaligned). */
export function toF32(bytes: Uint8Array, dtype: string, what: string): Float32Array {
  const aligned = (size: number) => (bytes.byteOffset % size === 0 ? bytes : bytes.slice());
  switch (dtype) {
    case "F32": {
      const b = aligned(4);
      return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4).slice();
    }
    case "BF16": {
      const b = aligned(2);
      return bf16ToF32(new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2));
    }
    case "F16": {
      const b = aligned(2);
      return f16ToF32(new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2));
    }
    case "F64": {
      const b = aligned(8);
      return Float32Array.from(new Float64Array(b.buffer, b.byteOffset, b.byteLength / 8));
    }
    default:
      throw new Error(`${what}: dtype ${dtype} is not a float type cherenkov reads (F32, BF16, F16, F64)`);
  }
}

export interface StWriteTensor {
  dtype: string;
  shape: number[];
  data: Uint8Array;
}

/** Writes a safetensors file (tests and benchmarks make checkpoints with it). */
export function writeSafetensors(path: string, tensors: Record<string, StWriteTensor>, metadata?: Record<string, string>): void {
  const header: Record<string, unknown> = {};
  let offset = 0;
  for (const [name, t] of Object.entries(tensors)) {
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + t.data.byteLength] };
    offset += t.data.byteLength;
  }
  if (metadata) header.__metadata__ = metadata;
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (json.length % 8)) % 8);
  const head = new Uint8Array(8 + json.length);
  new DataView(head.buffer).setBigUint64(0, BigInt(json.length), true);
  head.set(new TextEncoder().encode(json), 8);
  const fd = openSync(path, "w");
  try {
    writeAll(fd, head);
    for (const t of Object.values(tensors)) writeAll(fd, t.data);
  } finally {
    closeSync(fd);
  }
}

function writeAll(fd: number, bytes: Uint8Array) {
  let done = 0;
  while (done < bytes.byteLength) done += writeSync(fd, bytes, done, Math.min(bytes.byteLength - done, 1 << 30));
}
