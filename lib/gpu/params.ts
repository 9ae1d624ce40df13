/**
 * Kernel parameter structs: the single source of truth for the bytes bound at
 * [[buffer(0)]] of every kernel. kernels/params.h is generated from this file
 * (`bun lib/gpu/params-gen.ts`); a test fails when it is stale.
 *
 * Rules (ggml's): counts are i32, byte offsets and strides u64, f32 for
 * scalars, u32 for ids and flags. Padding is explicit (fields named `_pad*`):
 * a field must sit at a multiple of its own size and the struct's size must be
 * a multiple of its largest field, so C, Metal and this file agree without
 * compiler-inserted padding.
 *
 * To add a struct: add one entry to `Params` below (the key is the struct's
 * name without the `Params` suffix), then run `bun lib/gpu/params-gen.ts`.
 */

import { denseParams } from "./params-dense.ts";
import { sequenceParams } from "./params-sequence.ts";

const FIELD_BYTES = { i32: 4, u32: 4, f32: 4, u64: 8 } as const;
export type FieldType = keyof typeof FIELD_BYTES;

export interface FieldSpec {
  readonly name: string;
  readonly type: FieldType;
  /** Fixed-length array of `count` elements. */
  readonly count?: number;
  readonly doc?: string;
}

export interface FieldLayout extends FieldSpec {
  readonly offset: number;
  readonly count: number;
  readonly bytes: number;
  readonly isArray: boolean;
}

export interface ParamStruct<F extends readonly FieldSpec[] = readonly FieldSpec[]> {
  /** Base name ("RmsNorm"); the C type is `${name}Params`. */
  readonly name: string;
  readonly cName: string;
  readonly doc: string;
  readonly specs: F;
  readonly fields: readonly FieldLayout[];
  readonly size: number;
  /** The fields packParams writes (not padding), and the padding it zeroes: split once here. */
  readonly named: readonly FieldLayout[];
  readonly padding: readonly FieldLayout[];
}

type FieldValue<F extends FieldSpec> = F extends { count: number }
  ? F["type"] extends "f32"
    ? readonly number[] | Float32Array
    : readonly number[]
  : F["type"] extends "u64"
    ? number | bigint
    : number;

/** The JS object packParams takes for a struct: every non-padding field. */
export type ParamValues<S extends ParamStruct> = {
  [F in S["specs"][number] as F["name"] extends `_${string}` ? never : F["name"]]: FieldValue<F>;
};

export function isPadding(name: string): boolean {
  return name.startsWith("_");
}

/** Lays a struct out and checks the alignment rules (errors name the field). */
export function defineParams<const F extends readonly FieldSpec[]>(name: string, doc: string, specs: F): ParamStruct<F> {
  const cName = `${name}Params`;
  if (!/^[A-Z][A-Za-z0-9]*$/.test(name)) throw new Error(`params struct name "${name}" must be PascalCase`);
  if (specs.length === 0) throw new Error(`${cName}: has no fields`);
  const fields: FieldLayout[] = [];
  const seen = new Set<string>();
  let offset = 0;
  let maxAlign = 4;
  for (const spec of specs) {
    const where = `${cName}.${spec.name}`;
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(spec.name)) throw new Error(`${where}: not a C identifier`);
    if (seen.has(spec.name)) throw new Error(`${where}: declared twice`);
    seen.add(spec.name);
    const align = FIELD_BYTES[spec.type];
    if (align === undefined) throw new Error(`${where}: unknown type ${spec.type}`);
    const count = spec.count ?? 1;
    if (!Number.isInteger(count) || count < 1) throw new Error(`${where}: count must be a positive integer`);
    if (offset % align !== 0)
      throw new Error(`${where}: at offset ${offset}, not a multiple of ${align}: add a u32 padding field (_padN) before it`);
    fields.push({ ...spec, offset, count, bytes: align * count, isArray: spec.count !== undefined });
    offset += align * count;
    maxAlign = Math.max(maxAlign, align);
  }
  if (offset % maxAlign !== 0)
    throw new Error(`${cName}: size ${offset} is not a multiple of ${maxAlign}: add a trailing u32 padding field (_padN)`);
  return { name, cName, doc, specs, fields, size: offset, named: fields.filter((f) => !isPadding(f.name)), padding: fields.filter((f) => isPadding(f.name)) };
}

const I32_MIN = -(2 ** 31);
const U32_MAX = 2 ** 32 - 1;
const U64_MAX = 2n ** 64n - 1n;

const fieldName = (struct: string, field: string, index: number) => (index < 0 ? `${struct}.${field}` : `${struct}.${field}[${index}]`);

// The field's name is put together only for an error (this runs for every field of every
// dispatch while a step is encoded): struct.field, or struct.field[index] for an array element.
function writeScalar(view: DataView, offset: number, type: FieldType, value: unknown, struct: string, field: string, index = -1): void {
  if (type === "u64") {
    if (typeof value === "bigint") {
      if (value < 0n || value > U64_MAX) throw new Error(`${fieldName(struct, field, index)}: ${value} is outside u64`);
      view.setBigUint64(offset, value, true);
      return;
    }
    if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0)
      throw new Error(`${fieldName(struct, field, index)}: expected a non-negative safe integer or bigint, got ${String(value)}`);
    view.setUint32(offset, value % 2 ** 32, true);
    view.setUint32(offset + 4, Math.floor(value / 2 ** 32), true);
    return;
  }
  if (typeof value !== "number") throw new Error(`${fieldName(struct, field, index)}: expected a number, got ${typeof value}`);
  if (type === "f32") {
    view.setFloat32(offset, value, true);
  } else if (type === "i32") {
    if (!Number.isInteger(value) || value < I32_MIN || value > 2 ** 31 - 1)
      throw new Error(`${fieldName(struct, field, index)}: ${value} is not an i32`);
    view.setInt32(offset, value, true);
  } else {
    if (!Number.isInteger(value) || value < 0 || value > U32_MAX) throw new Error(`${fieldName(struct, field, index)}: ${value} is not a u32`);
    view.setUint32(offset, value, true);
  }
}

/**
 * Packs `values` into the struct's bytes (little-endian, as every target is).
 * Padding is zeroed. Missing, unknown or out-of-range fields throw, naming the
 * field. Pass `out` (at least `size` bytes) to reuse a buffer.
 */
export function packParams<S extends ParamStruct>(s: S, values: ParamValues<S>, out?: Uint8Array): Uint8Array {
  if (out && out.byteLength < s.size) throw new Error(`${s.cName}: output has ${out.byteLength} bytes, needs ${s.size}`);
  // A new struct starts from its own ArrayBuffer: reading `.buffer` of a fresh Uint8Array makes
  // JSC give it a separate buffer object, which was a fifth of encoding a step.
  const arrayBuffer = out ? null : new ArrayBuffer(s.size);
  const bytes = out ?? new Uint8Array(arrayBuffer!);
  const view = arrayBuffer ? new DataView(arrayBuffer) : new DataView(bytes.buffer, bytes.byteOffset, s.size);
  writeParams(s, values, bytes, view);
  return bytes;
}

/**
 * packParams into a buffer the caller reuses: `view` covers `bytes`. This runs for every
 * dispatch of every step (encoding a 48-layer decode step packs ~900 structs), so it walks the
 * fields split at definition and counts the keys without allocating.
 */
export function writeParams<S extends ParamStruct>(s: S, values: ParamValues<S>, bytes: Uint8Array, view: DataView): void {
  const record = values as Record<string, unknown>;
  const unknownKeys = () => {
    for (const key of Object.keys(record)) {
      if (!s.named.some((f) => f.name === key)) throw new Error(`${s.cName}: unknown field ${key}`);
    }
  };
  for (const f of s.padding) bytes.fill(0, f.offset, f.offset + f.bytes);
  for (const f of s.named) {
    const value = record[f.name];
    if (value === undefined) {
      unknownKeys();
      throw new Error(`${s.cName}.${f.name}: missing`);
    }
    if (!f.isArray) {
      writeScalar(view, f.offset, f.type, value, s.cName, f.name);
      continue;
    }
    // A table of f32s held as a Float32Array (RoPE's inverse frequencies, 128 per dispatch)
    // goes in with one copy instead of a checked write per element.
    if (value instanceof Float32Array && f.type === "f32" && value.length === f.count) {
      bytes.set(new Uint8Array(value.buffer, value.byteOffset, value.byteLength), f.offset);
      continue;
    }
    if (!Array.isArray(value) || value.length !== f.count)
      throw new Error(`${s.cName}.${f.name}: expected an array of ${f.count} values`);
    const step = FIELD_BYTES[f.type];
    for (let i = 0; i < value.length; i++) writeScalar(view, f.offset + i * step, f.type, value[i], s.cName, f.name, i);
  }
  // Every named field is present; any more keys are unknown ones.
  let keys = 0;
  for (const _ in record) keys++;
  if (keys !== s.named.length) unknownKeys();
}

/** A family of param structs declared as plain data in its own file (no import cycle). */
export type ParamFamily = Record<string, { readonly doc: string; readonly fields: readonly FieldSpec[] }>;
type DefinedFamily<T extends ParamFamily> = { readonly [K in keyof T & string]: ParamStruct<T[K]["fields"]> };

function defineFamily<const T extends ParamFamily>(family: T): DefinedFamily<T> {
  const out: Record<string, ParamStruct> = {};
  for (const [name, { doc, fields }] of Object.entries(family)) out[name] = defineParams(name, doc, fields);
  return out as DefinedFamily<T>;
}

const coreParams = {
  Selftest: {
    doc: "Parameters of the emulator self-test kernels (kernels/selftest.metal).",
    fields: [
      { name: "n", type: "u32", doc: "elements (threads that do work)" },
      { name: "cols", type: "u32", doc: "row length of the row-reduction kernels" },
      { name: "scale", type: "f32", doc: "multiplier applied to results" },
      { name: "_pad0", type: "u32" },
      { name: "row_stride", type: "u64", doc: "bytes between rows" },
    ],
  },
} as const satisfies ParamFamily;

/**
 * Every params struct. Keys equal the struct names. Kernel families declare theirs in
 * params-dense.ts (embedding, norms, hyper-connections, projections, MoE, output) and
 * params-sequence.ts (conv, DeltaNet, RoPE, KV cache, QSA, attention, PLE).
 */
export const Params = {
  ...defineFamily(coreParams),
  ...defineFamily(denseParams),
  ...defineFamily(sequenceParams),
} as const;

export type ParamsName = keyof typeof Params;
