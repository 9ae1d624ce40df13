// DeltaNet recurrence cases shared by the kernel tests (deltanet.test.ts: the row scan;
// deltanet-chunk.test.ts: the chunked form): random inputs, the lib/reference recurrence over
// them, and the inputs on a device with encodeDeltaNet bound to them.
import { deltanetChunkBytes, deltanetStateFloats, deltanetStateToGpu, encodeDeltaNet, type DeltaNetShape } from "../../lib/gpu/deltanet.ts";
import type { EncodeContext } from "../../lib/gpu/dispatch.ts";
import { allocatePlanes } from "../../lib/gpu/snapshots.ts";
import { deltanetStep } from "../../lib/reference/deltanet.ts";
import { l2Normalize, sigmoid, softplus } from "../../lib/reference/ops.ts";
import type { Buffer, Device } from "../../lib/shim.ts";
import { hostTensor, outputF32, randomF32, rows, uploadF32, uploadWeights } from "./harness.ts";

export interface DnCase extends DeltaNetShape {
  nb: number;
  qkv: Float32Array;
  b: Float32Array;
  a: Float32Array;
  aLog: Float32Array;
  dtBias: Float32Array;
  S: Float32Array;
}

/** Channels of a conv output row: q | k | v. */
export const width = (s: DeltaNetShape) => 2 * s.keyHeads * s.keyDim + s.valueHeads * s.valueDim;

export function dnCase(nb: number, shape: DeltaNetShape, seed: number): DnCase {
  const Hv = shape.valueHeads;
  return {
    ...shape,
    nb,
    qkv: randomF32(nb * width(shape), seed, 1, "qkv"),
    b: randomF32(nb * Hv, seed, 3, "b"),
    a: randomF32(nb * Hv, seed, 3, "a"),
    aLog: randomF32(Hv, seed, 1, "A_log"),
    dtBias: randomF32(Hv, seed, 1, "dt_bias"),
    S: randomF32(deltanetStateFloats(shape), seed, 0.5, "S"),
  };
}

/** Reference: deltanetLayer's per-row preparation from the conv output, then deltanetStep. */
export function dnReference(c: DnCase): { o: Float32Array; S: Float32Array } {
  const { keyHeads: Hk, keyDim: dk, valueHeads: Hv, valueDim: dv } = c;
  const r = Hv / Hk;
  const W = width(c);
  const S = c.S.slice();
  const o = new Float32Array(c.nb * Hv * dv);
  const qScale = 1 / Math.sqrt(dk);
  for (let t = 0; t < c.nb; t++) {
    const row = c.qkv.slice(t * W, (t + 1) * W);
    const Q = row.subarray(0, Hk * dk);
    const K = row.subarray(Hk * dk, 2 * Hk * dk);
    for (let h = 0; h < Hk; h++) {
      const qh = Q.subarray(h * dk, (h + 1) * dk);
      l2Normalize(qh);
      for (let i = 0; i < dk; i++) qh[i] = qh[i]! * qScale;
      l2Normalize(K.subarray(h * dk, (h + 1) * dk));
    }
    for (let h = 0; h < Hv; h++) {
      const kh = Math.floor(h / r);
      const beta = sigmoid(c.b[t * Hv + h]!);
      const g = -Math.exp(c.aLog[h]!) * softplus(c.a[t * Hv + h]! + c.dtBias[h]!);
      deltanetStep(
        S.subarray(h * dk * dv, (h + 1) * dk * dv),
        Q.subarray(kh * dk, (kh + 1) * dk),
        K.subarray(kh * dk, (kh + 1) * dk),
        row.subarray(2 * Hk * dk + h * dv, 2 * Hk * dk + (h + 1) * dv),
        Math.fround(beta),
        Math.fround(g),
        dk,
        dv,
        o.subarray((t * Hv + h) * dv, (t * Hv + h + 1) * dv),
      );
    }
  }
  return { o, S };
}

export interface DnGpu {
  o: Buffer;
  S: Buffer;
  planes: ReturnType<typeof allocatePlanes>;
  /** Encodes rows [first, first + n) of the case; `chunked` forces a form (default: the host's choice), `cols` the chunked scan's columns a simdgroup. */
  encode: (ctx: EncodeContext, first: number, n: number, snapRows?: number, chunked?: boolean, cols?: 2 | 4) => void;
}

/** The case's inputs and state on `dev`, with a work region for the chunked form at the case's rows. */
export function dnOnDevice(dev: Device, c: DnCase): DnGpu {
  const Hv = c.valueHeads;
  const W = width(c);
  const { refs } = uploadWeights(dev, { aLog: hostTensor(c.aLog, "f32", [Hv]), dtBias: hostTensor(c.dtBias, "f32", [Hv]) });
  const qkv = uploadF32(dev, c.qkv);
  const b = uploadF32(dev, c.b);
  const a = uploadF32(dev, c.a);
  const o = outputF32(dev, c.nb * Hv * c.valueDim);
  const S = uploadF32(dev, deltanetStateToGpu(c.S, c));
  const planes = allocatePlanes(dev, c.S.length);
  const workBytes = deltanetChunkBytes(c.nb, Hv);
  const work = { buffer: dev.buffer(Math.max(16, workBytes)), offset: 0, bytes: workBytes };
  const encode = (ctx: EncodeContext, first: number, n: number, snapRows = 0, chunked?: boolean, cols?: 2 | 4) =>
    encodeDeltaNet(ctx, {
      ...c,
      rows: n,
      qkv: rows(qkv, W, first * W * 4),
      b: rows(b, Hv, first * Hv * 4),
      a: rows(a, Hv, first * Hv * 4),
      aLog: refs.aLog,
      dtBias: refs.dtBias,
      state: S,
      o: rows(o, Hv * c.valueDim, first * Hv * c.valueDim * 4),
      snapshots: snapRows > 0 ? { planes, rows: snapRows } : undefined,
      work,
      chunked,
      chunkColumns: cols,
    });
  return { o, S, planes, encode };
}
