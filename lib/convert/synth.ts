// Seeded synthetic models: every tensor drawn from its own (seed, name) stream (init.ts),
// written one tensor or expert record at a time: the 51 GB q4 80b-a3b-shape preset peaks at
// its largest dense tensor (the f32 embedding before quantization, 1.2 GB) plus a few records.
// The values are exactly those of RandomWeights before the storage dtype is applied.
import { availableParallelism } from "node:os";
import type { DType, ModelConfig } from "../model/config.ts";
import { initPleTable, initTensor } from "../model/init.ts";
import type { ExpertsIndex, Manifest } from "../model/manifest.ts";
import { denseTensorSpecs, expertPartSpecs } from "../model/tensors.ts";
import { expertName, pleTableName } from "../model/weights.ts";
import { encodeExpertRecord, ModelWriter, plannedBytes } from "../model/writer.ts";
import { byteTokenizer } from "./byte-tokenizer.ts";
import { presetConfig, type Features, type PresetName } from "./presets.ts";
import type { WorkerReply, WorkerRequest } from "./synth-worker.ts";
import { workerFile } from "../worker-file.ts";

const SYNTH_WORKER = workerFile("./synth-worker.ts", import.meta.url);

export interface SynthOptions {
  preset: PresetName;
  features?: Features;
  /**
   * A config of your own, derived from `preset` (tests at shapes between the presets, such as
   * the 80b trunk at a small hidden size); replaces preset and features, recorded as custom.
   */
  config?: ModelConfig;
  /**
   * Generate only the first N expert layers; later layers repeat them (layer l gets layer
   * l mod N's records). For benchmarks of models too large to fill with random weights in
   * reasonable time (bench:scale): streaming and routing behave as in a full model, since each
   * layer's router is its own. Recorded in the source. Default: every layer distinct.
   */
  distinctExpertLayers?: number;
  seed: number;
  out: string;
  weights: DType;
  /** Write into a non-empty `out`, replacing its model files (default: refuse). */
  force?: boolean;
  /** Called after each tensor, record or table with bytes written so far and in total. */
  onProgress?: (doneBytes: number, totalBytes: number) => void;
  /**
   * Worker threads building expert records; 0 builds them on this thread. Default: every core
   * when the experts take more than 64 MB, else 0 (starting workers costs more than it saves).
   */
  workers?: number;
}

export interface SynthResult {
  manifest: Manifest;
  bytes: number;
  seconds: number;
}

/** Record `index` (= l * per_layer + e) of a synthetic model, encoded (also run in synth-worker.ts). */
export function synthRecord(config: ModelConfig, seed: number, layout: Omit<ExpertsIndex, "checksums">, index: number): Uint8Array<ArrayBuffer> {
  const l = Math.floor(index / layout.per_layer);
  const e = index % layout.per_layer;
  const [gate, up, down] = expertPartSpecs(config).map((p) => initTensor({ ...p, name: `${expertName(l, e)}.${p.name}` }, seed));
  const record = new Uint8Array(layout.stride);
  encodeExpertRecord(layout, { gate: gate!, up: up!, down: down! }, record, `expert layer ${l} expert ${e}`);
  return record;
}

export async function synthesize(opts: SynthOptions): Promise<SynthResult> {
  const { preset, seed, out, weights } = opts;
  if (!Number.isInteger(seed) || seed < 0 || seed > 0xffffffff) throw new Error(`seed must be an integer in 0..2^32-1, got ${seed}`);
  const features = opts.features ?? {};
  const config = opts.config ?? presetConfig(preset, features);
  const started = performance.now();
  const total = plannedBytes(config, weights);
  let done = 0;
  const progress = (bytes: number) => {
    done += bytes;
    opts.onProgress?.(done, total);
  };

  const expertLayers = config.num_layers + (config.mtp ? 1 : 0);
  const distinct = Math.min(expertLayers, opts.distinctExpertLayers ?? expertLayers);
  if (!Number.isInteger(distinct) || distinct < 1) throw new Error(`distinctExpertLayers ${opts.distinctExpertLayers}: expected an integer >= 1`);
  const repeats = distinct < expertLayers;
  const w = await ModelWriter.create(out, config, {
    weights,
    force: opts.force,
    source: { synth: { preset, seed, ...(opts.config ? { custom: true } : { features }), ...(repeats ? { distinctExpertLayers: distinct } : {}) } },
  });
  try {
    for (const spec of denseTensorSpecs(config)) {
      w.addDense(spec.name, initTensor(spec, seed));
      progress(w.lastDenseBytes);
    }
    const layout = w.expertLayout;
    const records = layout.layers * layout.per_layer;
    const generated = distinct * layout.per_layer;
    const kept: Uint8Array[] | null = repeats ? [] : null;
    const written = (i: number, record: Uint8Array) => {
      kept?.push(record);
      progress(layout.stride);
    };
    // A bundled app carries no worker file: it builds the records on this thread.
    const workers = SYNTH_WORKER === null ? 0 : opts.workers ?? (generated * layout.stride > 64e6 ? availableParallelism() : 0);
    if (workers > 0) {
      await writeExpertsInWorkers(w, config, seed, workers, generated, written);
    } else {
      for (let i = 0; i < generated; i++) {
        const record = synthRecord(config, seed, layout, i);
        w.addExpertRecord(Math.floor(i / layout.per_layer), i % layout.per_layer, record);
        written(i, record);
      }
    }
    for (let i = generated; i < records; i++) {
      w.addExpertRecord(Math.floor(i / layout.per_layer), i % layout.per_layer, kept![i % generated]!);
      progress(layout.stride);
    }
    const ple = config.ple;
    if (ple)
      for (const layer of ple.layers)
        for (let o = 0; o < ple.orders.length; o++)
          for (let j = 0; j < ple.heads; j++) {
            const name = pleTableName(layer, o, j);
            const table = initPleTable(name, ple.rows[o]![j]!, ple.head_dim, seed);
            w.addPleTable(layer, o, j, table);
            progress(table.length * (weights === "f32" ? 4 : 2));
          }
    const { tokenizerJson, tokenizerConfig } = byteTokenizer(config.vocab_size);
    w.setTokenizer(tokenizerJson, tokenizerConfig);
    const manifest = await w.finish();
    opts.onProgress?.(total, total); // the totals count page padding that the steps above do not
    return { manifest, bytes: total, seconds: (performance.now() - started) / 1000 };
  } catch (e) {
    w.abort();
    throw e;
  }
}

/**
 * Builds expert records in `count` workers and writes them in order. At most a few records
 * per worker are in flight, so memory stays at a handful of records whatever the model size.
 */
async function writeExpertsInWorkers(w: ModelWriter, config: ModelConfig, seed: number, count: number, total: number, onRecord: (index: number, record: Uint8Array) => void) {
  const layout = w.expertLayout;
  const window = count * 3;
  const pool = Array.from({ length: count }, () => new Worker(SYNTH_WORKER!));
  try {
    await new Promise<void>((resolve, reject) => {
      const ready = new Map<number, Uint8Array>();
      const idle: Worker[] = [];
      let sent = 0;
      let written = 0;
      const feed = (worker: Worker) => {
        if (sent < total && sent - written < window) worker.postMessage({ type: "record", index: sent++ } satisfies WorkerRequest);
        else idle.push(worker);
      };
      for (const worker of pool) {
        worker.onerror = (e) => reject(new Error(`synth worker failed: ${e.message}`));
        worker.onmessage = (event: MessageEvent<WorkerReply>) => {
          try {
            ready.set(event.data.index, event.data.record);
            for (let r = ready.get(written); r; r = ready.get(written)) {
              ready.delete(written);
              w.addExpertRecord(Math.floor(written / layout.per_layer), written % layout.per_layer, r);
              onRecord(written, r);
              written++;
            }
            if (written === total) return resolve();
            feed(worker);
            while (idle.length && sent < total && sent - written < window) feed(idle.pop()!);
          } catch (e) {
            reject(e);
          }
        };
        worker.postMessage({ type: "init", config, seed, layout } satisfies WorkerRequest);
        feed(worker);
      }
    });
  } finally {
    for (const worker of pool) worker.terminate();
  }
}
