// A worker of the converter: encodes expert records (reads the source slices, reorders,
// quantizes) so that several run at once; the main thread writes them in order.
import { expertRecord, openCheckpoint, PieceReader, type RecordParts } from "./convert.ts";

declare const self: Worker;

let ctx: { open: ReturnType<typeof openCheckpoint>; reader: PieceReader; parts: RecordParts } | null = null;

self.onmessage = (ev: MessageEvent) => {
  const m = ev.data;
  try {
    if (m.type === "init") {
      const open = openCheckpoint(m.src, { kvCache: m.kvCache, mtp: m.mtp });
      ctx = { open, reader: new PieceReader(open.source), parts: m.parts };
      return;
    }
    if (!ctx) throw new Error("expert worker: job before init");
    const record = expertRecord(ctx.open.plan, ctx.reader, ctx.parts, m.l, m.e);
    const owned = Object.values(record).filter((b) => b.byteOffset === 0 && b.byteLength === b.buffer.byteLength);
    self.postMessage({ type: "done", i: m.i, record }, owned.map((b) => b.buffer as ArrayBuffer));
  } catch (e) {
    self.postMessage({ type: "error", message: e instanceof Error ? e.message : String(e) });
  }
};
