// Per-row snapshot planes of the fixed-size sequence state (DESIGN.md "Sequence state"):
// a verify batch of 1 + drafts rows stores each DeltaNet S, DeltaNet conv window and PLE
// conv history after every row, so a partial accept rolls back exactly by copying the
// plane of the last accepted row over the live state. Caches (KV, index keys) only grow
// and roll back by length, so they have no planes.
//
// Layout: for one piece of state of `floats` values, SNAPSHOT_PLANES planes of the same
// layout as the live state, `stride` bytes apart (a multiple of 256), plane r = the state
// after row r of the batch that wrote them. A kernel writes planes 0 .. snap_rows - 1.
import type { Binding, Buffer, Device, Storage } from "../shim.ts";
import { bind, dispatch, type EncodeContext } from "./dispatch.ts";
import { MAX_SNAP } from "./limits.ts";
import { Params } from "./params.ts";

/** Planes per piece of state: one per row of the largest verify batch (1 + MAX_SNAP drafts). */
export const SNAPSHOT_PLANES = MAX_SNAP + 1;

const PLANE_ALIGN = 256;

/** The snapshot planes of one piece of sequence state. */
export interface SnapshotPlanes {
  readonly buffer: Buffer;
  /** Byte offset of plane 0 in `buffer`. */
  readonly offset: number;
  /** Floats per plane (the size of the live state). */
  readonly floats: number;
  /** Bytes between planes. */
  readonly stride: number;
}

/** Bytes between planes, and in all, for a state of `floats` values. */
export function planesLayout(floats: number): { stride: number; bytes: number } {
  if (!Number.isInteger(floats) || floats <= 0) throw new Error(`snapshot planes: ${floats} floats per plane must be a positive integer`);
  const stride = Math.ceil((floats * 4) / PLANE_ALIGN) * PLANE_ALIGN;
  return { stride, bytes: stride * SNAPSHOT_PLANES };
}

/** Planes over `buffer` from `offset` (which must hold planesLayout(floats).bytes). */
export function planesAt(buffer: Buffer, floats: number, offset = 0): SnapshotPlanes {
  const { stride, bytes } = planesLayout(floats);
  if (offset % 16 !== 0) throw new Error(`snapshot planes: offset ${offset} is not a multiple of 16`);
  if (offset + bytes > buffer.length)
    throw new Error(`snapshot planes: ${bytes} bytes from offset ${offset} exceed the buffer (${buffer.length} bytes)`);
  return { buffer, offset, floats, stride };
}

/**
 * Planes of one piece inside a larger plane (the engine's: every piece of a sequence's
 * fixed-size state, laid out as SequenceState.fixed is): plane r at offset + r * stride.
 */
export function planesWithin(buffer: Buffer, offset: number, floats: number, stride: number): SnapshotPlanes {
  if (offset % 16 !== 0 || stride % PLANE_ALIGN !== 0) throw new Error(`snapshot planes: offset ${offset} or stride ${stride} is misaligned`);
  if (floats * 4 > stride) throw new Error(`snapshot planes: ${floats} floats do not fit a stride of ${stride} bytes`);
  if (offset + floats * 4 + (SNAPSHOT_PLANES - 1) * stride > buffer.length)
    throw new Error(`snapshot planes: ${SNAPSHOT_PLANES} planes of stride ${stride} from offset ${offset} exceed the buffer (${buffer.length} bytes)`);
  return { buffer, offset, floats, stride };
}

/** A new buffer holding the planes of a state of `floats` values ("device": only kernels touch it; readPlane downloads). */
export function allocatePlanes(device: Device, floats: number, storage: Storage = "shared"): SnapshotPlanes {
  return planesAt(device.buffer(planesLayout(floats).bytes, storage), floats);
}

/** Binding of plane r. */
export function planeBinding(planes: SnapshotPlanes, r: number): Binding {
  if (!Number.isInteger(r) || r < 0 || r >= SNAPSHOT_PLANES) throw new RangeError(`snapshot plane ${r} outside 0..${SNAPSHOT_PLANES - 1}`);
  return bind(planes.buffer, planes.offset + r * planes.stride);
}

/** The float values of plane r, read on the host (tests, debugging). */
export function readPlane(planes: SnapshotPlanes, r: number): Float32Array {
  planeBinding(planes, r); // range check
  const start = (planes.offset + r * planes.stride) / 4;
  planes.buffer.download(start * 4, planes.floats * 4);
  return planes.buffer.f32.slice(start, start + planes.floats);
}

/**
 * What a kernel with per-sequence state needs to snapshot a batch: the planes, and how
 * many of the batch's first rows to store (at most SNAPSHOT_PLANES).
 */
export interface SnapshotRequest {
  readonly planes: SnapshotPlanes;
  readonly rows: number;
}

/** The kernel fields (snap_rows, plane_stride) and the binding of plane 0 for a request. */
export function snapshotArgs(
  req: SnapshotRequest | undefined,
  floats: number,
  nb: number,
  fallback: Binding,
  what: string,
): { snapRows: number; planeStride: number; binding: Binding } {
  if (!req) return { snapRows: 0, planeStride: 0, binding: fallback };
  const { planes, rows } = req;
  if (planes.floats !== floats) throw new Error(`${what}: snapshot planes hold ${planes.floats} floats, the state has ${floats}`);
  if (!Number.isInteger(rows) || rows < 0 || rows > SNAPSHOT_PLANES || rows > nb)
    throw new RangeError(`${what}: snapshot rows ${rows} must be in 0..min(${SNAPSHOT_PLANES}, nb = ${nb})`);
  return { snapRows: rows, planeStride: planes.stride, binding: planeBinding(planes, 0) };
}

/** One piece of state to roll back: plane `plane` of `planes` copied over `live`. */
export interface RestoreRegion {
  readonly planes: SnapshotPlanes;
  readonly plane: number;
  /** The live state (planes.floats values). */
  readonly live: Binding;
}

/**
 * Rolls one or two pieces of state back to a snapshot plane in one dispatch (a DeltaNet
 * layer passes S and its conv window; a PLE layer its history).
 */
export function encodeRestore(ctx: EncodeContext, first: RestoreRegion, second?: RestoreRegion): void {
  const n0 = first.planes.floats;
  const n1 = second ? second.planes.floats : 0;
  const src1 = second ? planeBinding(second.planes, second.plane) : planeBinding(first.planes, first.plane);
  const dst1 = second ? second.live : first.live;
  const total = n0 + n1;
  const tg = 256;
  dispatch(
    ctx,
    "snapshot_restore_f32",
    Params.SnapshotRestore,
    { n0, n1 },
    [planeBinding(first.planes, first.plane), first.live, src1, dst1],
    Math.ceil(total / tg),
    tg,
  );
}
