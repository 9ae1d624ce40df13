// A worker of the synthesizer: builds whole expert records (init + encode) so that large
// presets use every core. The records are identical to the ones built on the main thread.
import type { ModelConfig } from "../model/config.ts";
import type { ExpertsIndex } from "../model/manifest.ts";
import { synthRecord } from "./synth.ts";

export type WorkerRequest =
  | { type: "init"; config: ModelConfig; seed: number; layout: Omit<ExpertsIndex, "checksums"> }
  | { type: "record"; index: number };
export type WorkerReply = { index: number; record: Uint8Array<ArrayBuffer> };

declare const self: Worker;

let job: Extract<WorkerRequest, { type: "init" }> | null = null;

self.onmessage = (event: MessageEvent<WorkerRequest>) => {
  const m = event.data;
  if (m.type === "init") {
    job = m;
    return;
  }
  if (!job) throw new Error("synth worker: record requested before init");
  const record = synthRecord(job.config, job.seed, job.layout, m.index);
  self.postMessage({ index: m.index, record } satisfies WorkerReply, [record.buffer]);
};
