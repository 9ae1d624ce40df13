// The step's activation scratch: every intermediate of one row batch, for up to `rows` rows,
// carved out of two buffers: the regions the host reads or writes mid-step (router ids and
// weights at the MoE handshake, the slot table, next ids, drafts) in a shared one, all the
// rest in device storage (GPU memory on cuda; shared memory on Metal and the CPU backend). Sized once at load (rows = min(prefill chunk, MAX_NB)
// and what the pool allows; docs/engine.md). Regions a later op no longer needs are not
// reused for something else: the layout stays obvious and the bytes are small next to the
// weights (the logits are computed LOGIT_ROWS rows at a time to keep the largest region small).
import { dims, type ModelConfig } from "../model/config.ts";
import type { Buffer, Device } from "../shim.ts";
import type { RowsRef } from "./dispatch.ts";
import type { HcScratch } from "./hyperconnection.ts";
import { hcFoldCount } from "./hc-fold.ts";
import { hcMixCount, hcPartialCount } from "./hyperconnection.ts";
import { attentionPartialBytes, ATTN_DECODE_SPLIT, ATTN_SPLIT_ROWS } from "./attention.ts";
import { deltanetChunkBytes } from "./deltanet.ts";
import { MAX_SNAP } from "./limits.ts";

/** Rows of logits computed at once (the LM head runs over a step in blocks of this many). */
export const LOGIT_ROWS = 32;

const REGION_ALIGN = 256;
const up = (x: number, a: number) => Math.ceil(x / a) * a;
/** Bytes of a row of `floats` 4-byte values, padded to 16 (the matvec kernels' vector loads). */
export const rowBytes = (floats: number) => up(floats * 4, 16);

/** Lays regions out in one buffer; `bindAll` hands each region its place once the buffer exists. */
class Arena {
  private size = 0;
  private readonly pending: { offset: number; bind: (b: Buffer, offset: number) => void }[] = [];
  /** Reserves `bytes` and calls `bind` once the buffer exists. */
  take(bytes: number, bind: (b: Buffer, offset: number) => void): void {
    const offset = up(this.size, REGION_ALIGN);
    this.size = offset + Math.max(16, bytes);
    this.pending.push({ offset, bind });
  }
  get bytes(): number {
    return up(this.size, REGION_ALIGN);
  }
  bindAll(b: Buffer): void {
    for (const p of this.pending) p.bind(b, p.offset);
  }
}

export interface Scratch {
  /** The regions only kernels touch (device storage). */
  readonly buffer: Buffer;
  /** The regions the host reads or writes (shared). */
  readonly hostBuffer: Buffer;
  readonly bytes: number;
  /** Rows the regions hold. */
  readonly rows: number;
  /** Residual streams X [rows][n][d]. */
  X: RowsRef;
  /** A site's normalised read [rows][d]. */
  xn: RowsRef;
  /** A sub-layer's output [rows][d]. */
  y: RowsRef;
  /** Hyper-connection coefficients of the current site, and of the lookahead's read. */
  hc: HcScratch;
  /**
   * The next site's raw products as the last write into the streams left them (a fold:
   * lib/gpu/hc-fold.ts), [rows][mixes + 1][d / 4] (51 KB a row at the 30b shape); one float
   * a row when the model cannot fold (n = 1 or d % 16 != 0).
   */
  hcFold: RowsRef;
  la: { hc: HcScratch; xn: RowsRef; logits: RowsRef; ids: RowsRef; weights: RowsRef };
  /** DeltaNet rows, and the chunked form's work region (lib/gpu/deltanet.ts deltanetChunkBytes). */
  dn: { qkv: RowsRef; conv: RowsRef; z: RowsRef; b: RowsRef; a: RowsRef; o: RowsRef; work: { buffer: Buffer; offset: number; bytes: number } };
  attn: {
    q: RowsRef;
    gate: RowsRef;
    k: RowsRef;
    v: RowsRef;
    o: RowsRef;
    iq: RowsRef;
    ikRaw: RowsRef;
    ik: RowsRef;
    iw: RowsRef;
    /** QSA scores: rows * maxContext floats, rows strided per step (qsaScoreBytes). */
    scores: { buffer: Buffer; offset: number; bytes: number };
    selected: RowsRef;
    counts: RowsRef;
    partials: { buffer: Buffer; offset: number; bytes: number };
  };
  ple: { e: RowsRef; kRaw: RowsRef; k: RowsRef; q: RowsRef; vIn: RowsRef; v: RowsRef; u: RowsRef; rowIds: RowsRef };
  moe: {
    logits: RowsRef;
    /** Router output of a site the host serves at its handshake: ids [rows][k] (i32) and weights [rows][k]. */
    ids: RowsRef;
    weights: RowsRef;
    /**
     * Router outputs of the resident sites of a command buffer (no handshake: the host reads
     * them once the GPU is past them), packed one after another as SitePlan.open hands them
     * out (a site: ids [rows][k], then weights [rows][k]). Device storage: the kernels read
     * them from GPU memory, the host downloads the used bytes once. Room for a site per
     * layer (or per MTP row of a draft step) at the scratch's rows.
     */
    routes: { buffer: Buffer; offset: number; bytes: number };
    lists: { offsets: RowsRef; pairs: RowsRef; active: RowsRef };
    h: RowsRef;
    o: RowsRef;
    sh: RowsRef;
    s: RowsRef;
    sg: RowsRef;
    /** The layer's slot table (perLayer slots, then the union size), written by the host. */
    slotTable: RowsRef;
  };
  head: { hidden: RowsRef; logits: RowsRef; next: RowsRef; margins: RowsRef };
  mtp: { fuse: RowsRef; X: RowsRef; out: RowsRef; drafts: RowsRef; draftMargins: RowsRef };
  /** n floats of 1/n: the mean of the streams as a hyper-connection read (row stride 0). */
  meanCoeffs: RowsRef;
}

export interface ScratchSize {
  rows: number;
  maxContext: number;
  /** Entries of the slot table (the pool's slotTableStride; default experts + 1, a one-buffer pool). */
  slotTableEntries?: number;
}

/** Allocates the scratch of `config` for `size.rows` rows and contexts up to `size.maxContext`. */
export function allocateScratch(device: Device, config: ModelConfig, size: ScratchSize): Scratch {
  const layout = layoutScratch(config, size);
  const buffer = device.buffer(layout.deviceBytes, "device");
  let hostBuffer: Buffer;
  try {
    hostBuffer = device.buffer(layout.hostBytes);
  } catch (e) {
    buffer.release();
    throw e;
  }
  return layout.bind(buffer, hostBuffer);
}

/** Bytes the scratch of `config` takes for `size` (the budget's fixed buffers). */
export const scratchBytes = (config: ModelConfig, size: ScratchSize): number => layoutScratch(config, size).bytes;

function layoutScratch(config: ModelConfig, size: ScratchSize): { bytes: number; deviceBytes: number; hostBytes: number; bind(buffer: Buffer, hostBuffer: Buffer): Scratch } {
  const c = config;
  const D = dims(c);
  const R = size.rows;
  const d = c.hidden_size;
  const n = c.hc.streams;
  const k = c.moe.top_k;
  const E = c.moe.experts;
  const at = c.attention;
  const deviceArena = new Arena();
  const hostArena = new Arena();
  // Regions the host reads or writes between the GPU's signal and its release (or after the step).
  const HOST = new Set(["la.ids", "la.weights", "moe.ids", "moe.weights", "moe.slotTable", "head.next", "head.margins", "mtp.drafts", "mtp.draftMargins"]);
  const arenaOf = (path: string) => (HOST.has(path) ? hostArena : deviceArena);
  const out: Record<string, unknown> = {};
  // Registers a region under a dotted path of `out` ("attn.q" -> out.attn.q).
  const set = (path: string, value: unknown) => {
    const keys = path.split(".");
    let o = out as Record<string, unknown>;
    for (const key of keys.slice(0, -1)) o = (o[key] ??= {}) as Record<string, unknown>;
    o[keys[keys.length - 1]!] = value;
  };
  // `count` rows of `floats` values, each row padded to 16 bytes.
  const rows = (path: string, floats: number, count = R) => {
    const stride = rowBytes(floats);
    arenaOf(path).take(stride * count, (buffer, offset) => set(path, { buffer, offset, stride }));
  };
  // Vectors the kernels index without a stride ([rows][k] ids, counts): packed rows.
  const packed = (path: string, values: number, count = R) => {
    const stride = values * 4;
    arenaOf(path).take(stride * count, (buffer, offset) => set(path, { buffer, offset, stride }));
  };
  const raw = (path: string, bytes: number) => arenaOf(path).take(bytes, (buffer, offset) => set(path, { buffer, offset, bytes }));

  rows("X", n * d);
  rows("xn", d);
  rows("y", d);
  const mix = Math.max(1, hcMixCount(n));
  const partials = hcPartialCount(n, d);
  rows("hc.raw", partials);
  rows("hc.coeffs", mix);
  rows("hcFold", n > 1 && d % 16 === 0 ? hcFoldCount(n, d) : 1);
  rows("la.hc.raw", partials);
  rows("la.hc.coeffs", mix);
  rows("la.xn", d);
  rows("la.logits", E);
  packed("la.ids", k);
  packed("la.weights", k);

  const C = D.dnConvChannels;
  rows("dn.qkv", C);
  rows("dn.conv", C);
  rows("dn.z", D.dnValue);
  rows("dn.b", c.deltanet.value_heads);
  rows("dn.a", c.deltanet.value_heads);
  rows("dn.o", D.dnValue);
  raw("dn.work", deltanetChunkBytes(R, c.deltanet.value_heads));

  rows("attn.q", D.attnQ);
  rows("attn.gate", D.attnQ);
  rows("attn.k", D.attnKv);
  rows("attn.v", D.attnKv);
  rows("attn.o", D.attnQ);
  const qsa = at.qsa;
  rows("attn.iq", qsa ? qsa.heads * qsa.head_dim : 1);
  rows("attn.ikRaw", qsa ? qsa.head_dim : 1);
  rows("attn.ik", qsa ? qsa.head_dim : 1);
  rows("attn.iw", qsa ? qsa.heads : 1);
  // Rows are padded to 16 bytes: 4 spare positions per row.
  raw("attn.scores", qsa ? R * (size.maxContext + 4) * 4 : 16);
  packed("attn.selected", qsa ? qsa.topk : 1);
  packed("attn.counts", 1);
  // The MTP cache runs a few positions past maxContext (chained drafts).
  const splits = Math.ceil((size.maxContext + MAX_SNAP + 2) / ATTN_DECODE_SPLIT);
  raw("attn.partials", attentionPartialBytes(ATTN_SPLIT_ROWS, at.heads, at.head_dim, splits));

  const P = D.pleEmbed;
  rows("ple.e", Math.max(1, P));
  for (const name of ["kRaw", "k", "q", "vIn", "v", "u"]) rows(`ple.${name}`, d);
  packed("ple.rowIds", c.ple ? c.ple.orders.length * c.ple.heads : 1);

  rows("moe.logits", E);
  packed("moe.ids", k);
  packed("moe.weights", k);
  // A trunk step has a site per layer; a draft step one per MTP chunk and chained row.
  raw("moe.routes", Math.max(c.num_layers, MAX_SNAP + 1) * 2 * up(R * k * 4, 16));
  rows("moe.lists.offsets", E + 1, 1);
  rows("moe.lists.pairs", R * k, 1);
  rows("moe.lists.active", E + 1, 1);
  const I = c.moe.intermediate;
  rows("moe.h", I, R * k);
  rows("moe.o", d, R * k);
  const SI = Math.max(32, c.moe.shared_intermediate);
  rows("moe.sh", SI);
  rows("moe.s", d);
  rows("moe.sg", 1);
  rows("moe.slotTable", size.slotTableEntries ?? E + 1, 1);

  rows("head.hidden", d);
  rows("head.logits", c.vocab_size, Math.min(R, LOGIT_ROWS));
  packed("head.next", 1);
  packed("head.margins", 1);

  rows("mtp.fuse", 2 * d);
  rows("mtp.X", d);
  rows("mtp.out", d);
  packed("mtp.drafts", 1, MAX_SNAP + 1);
  packed("mtp.draftMargins", 1, MAX_SNAP + 1);
  // Written once by the host: shared.
  hostArena.take(rowBytes(n), (buffer, offset) => {
    buffer.f32.fill(1 / n, offset / 4, offset / 4 + n);
    set("meanCoeffs", { buffer, offset, stride: 0 });
  });

  const bytes = deviceArena.bytes + hostArena.bytes;
  return {
    bytes,
    deviceBytes: deviceArena.bytes,
    hostBytes: hostArena.bytes,
    bind(buffer: Buffer, hostBuffer: Buffer): Scratch {
      deviceArena.bindAll(buffer);
      hostArena.bindAll(hostBuffer);
      return { ...(out as unknown as Omit<Scratch, "buffer" | "hostBuffer" | "bytes" | "rows">), buffer, hostBuffer, bytes, rows: R } as Scratch;
    },
  };
}

/** The rows of a region from row `first` on. */
export const rowAt = (ref: RowsRef, first: number): RowsRef => ({ buffer: ref.buffer, offset: ref.offset + first * ref.stride, stride: ref.stride });


/** An i32 view of `count` values of a packed region (no copy). */
export const i32View = (ref: RowsRef, count: number): Int32Array => ref.buffer.i32.subarray(ref.offset / 4, ref.offset / 4 + count);

/** An f32 view of `count` values of a packed region (no copy). */
export const f32View = (ref: RowsRef, count: number): Float32Array => ref.buffer.f32.subarray(ref.offset / 4, ref.offset / 4 + count);
