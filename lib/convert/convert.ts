// The converter: a Hugging Face or MLX checkpoint directory of Qwen3-Next / Qwen3.5-MoE in,
// a cherenkov model directory out. It plans every tensor first (so a bad checkpoint fails
// before anything is written), then streams tensor by tensor and expert by expert: memory
// stays at about one source tensor, never the model.
import { existsSync } from "node:fs";
import { basename, join } from "node:path";
import { encode } from "../model/codec.ts";
import { readTextFile } from "../model/safe-read.ts";
import type { DType, ModelConfig } from "../model/config.ts";
import type { Manifest } from "../model/manifest.ts";
import { denseTensorSpecs, numel, storageDType, type TensorSpec } from "../model/tensors.ts";
import { ModelWriter, plannedBytes } from "../model/writer.ts";
import {
  architectureOf,
  ConvertError,
  hasMtp,
  HfSource,
  hfModelConfig,
  planConversion,
  type Architecture,
  type ConversionPlan,
  type Piece,
  type TensorSource,
} from "./hf.ts";
import { isMlxCheckpoint, MlxSource } from "./mlx.ts";
import type { RowMatrix } from "./rows.ts";
import { Checkpoint } from "./safetensors.ts";
import { workerFile } from "../worker-file.ts";

const EXPERT_WORKER = workerFile("./expert-worker.ts", import.meta.url);

export interface ConvertOptions {
  /** Checkpoint directory: config.json and *.safetensors (+ tokenizer files). */
  src: string;
  /** Model directory to write. */
  out: string;
  /** Write into a non-empty `out`, replacing its model files (default: refuse). */
  force?: boolean;
  /** Storage of the weights (default q4). */
  weights?: DType;
  /** Attention KV cache type recorded in the config (default q8). */
  kvCache?: "q8" | "f32";
  /** Convert the MTP head when the checkpoint has one (default true). */
  mtp?: boolean;
  /** Bytes written so far and in total, after each tensor or expert record. */
  onProgress?: (doneBytes: number, totalBytes: number) => void;
  /** Informational lines (what was found, ignored, rounded). */
  log?: (line: string) => void;
  /**
   * Worker threads that encode expert records (0 or 1: this thread). Default: one per core, at
   * most 8, when the experts take 256 MB or more (this thread mostly writes meanwhile).
   */
  workers?: number;
}

export interface ConvertResult {
  architecture: Architecture;
  format: "hf" | "mlx";
  config: ModelConfig;
  manifest: Manifest;
  /** Bytes written (dense.bin + experts.bin). */
  bytes: number;
  /** Bytes of the source tensors. */
  sourceBytes: number;
  seconds: number;
}

/** Size cap of a checkpoint's JSON and template files (real ones are at most tens of MB). */
const JSON_CAP = 256 << 20;

function readJson(path: string, what: string): Record<string, unknown> {
  try {
    // a regular file of bounded size: a FIFO or /dev/zero in the checkpoint is refused, never waited on
    const v = JSON.parse(readTextFile(path, what, JSON_CAP));
    if (typeof v !== "object" || v === null || Array.isArray(v)) throw new Error("not a JSON object");
    return v;
  } catch (e) {
    throw new ConvertError(`${what}: cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
}

/** Opens the checkpoint and plans the conversion; nothing is written. */
export function openCheckpoint(src: string, opts: Pick<ConvertOptions, "kvCache" | "mtp"> = {}) {
  const configPath = join(src, "config.json");
  if (!existsSync(configPath))
    throw new ConvertError(`config.json is missing in ${src} (a Hugging Face or MLX checkpoint directory has one)`);
  const raw = readJson(configPath, "config.json");
  const architecture = architectureOf(raw);
  const ckpt = new Checkpoint(src);
  try {
    const mlx = isMlxCheckpoint(raw, ckpt);
    const source: TensorSource = mlx ? new MlxSource(ckpt, raw) : new HfSource(ckpt);
    const config = hfModelConfig(raw, { kvCache: opts.kvCache, mtp: opts.mtp !== false && hasMtp(source) });
    const plan = planConversion(architecture, config, source);
    return { raw, architecture, ckpt, source, format: (mlx ? "mlx" : "hf") as "hf" | "mlx", config, plan };
  } catch (e) {
    ckpt.close();
    throw e;
  }
}

/** Reads the source matrix of a piece, keeping the last one (consecutive pieces share sources). */
export class PieceReader {
  private key = "";
  private last: RowMatrix | null = null;
  constructor(private readonly src: TensorSource) {}

  read(p: Piece): RowMatrix {
    const key = `${p.source}#${p.index ?? ""}`;
    if (key !== this.key || !this.last) {
      this.last = this.src.matrix(p.source, p.index);
      this.key = key;
    }
    return p.rows ? this.last.gather(p.rows) : this.last;
  }
}

/** The bytes of `m` in `dtype` for a tensor of `spec`'s shape: q4 rows pass through unchanged. */
export function storedBytes(m: RowMatrix, spec: Pick<TensorSpec, "name" | "shape">, dtype: DType): Uint8Array {
  if (m.rows * m.cols !== numel(spec.shape))
    throw new Error(`convert: ${spec.name}: ${m.rows * m.cols} values for shape [${spec.shape.join(", ")}]`);
  if (dtype === "q4" && m.isQ4) return m.toQ4Bytes()!;
  return encode(m.toF32(), spec.shape, dtype);
}

export async function convertCheckpoint(opts: ConvertOptions): Promise<ConvertResult> {
  const started = performance.now();
  const weights = opts.weights ?? "q4";
  const log = opts.log ?? (() => {});
  const { architecture, ckpt, source, format, config, plan, raw } = openCheckpoint(opts.src, opts);
  try {
    const sourceBytes = ckpt.names.reduce((s, n) => s + ckpt.info(n).bytes, 0);
    log(
      `${format === "mlx" ? "MLX" : "Hugging Face"} ${architecture} checkpoint: ${config.num_layers} layers, ` +
        `${config.moe.experts} experts (top ${config.moe.top_k}), hidden ${config.hidden_size}, vocab ${config.vocab_size}` +
        `${config.mtp ? ", MTP head" : ""}`,
    );
    if (source.ignored.length)
      log(`ignored ${source.ignored.length} tensor(s) outside the text model (${source.ignored.slice(0, 3).join(", ")}${source.ignored.length > 3 ? ", ..." : ""})`);
    if (plan.unused.length) log(`unused: ${plan.unused.slice(0, 5).join(", ")}${plan.unused.length > 5 ? ` and ${plan.unused.length - 5} more` : ""}`);

    const total = plannedBytes(config, weights);
    let done = 0;
    const progress = (bytes: number) => {
      done += bytes;
      opts.onProgress?.(done, total);
    };
    const w = await ModelWriter.create(opts.out, config, {
      weights,
      force: opts.force,
      source: { convert: { from: basename(opts.src), format, model_type: raw.model_type, architecture } },
    });
    try {
      const reader = new PieceReader(source);
      const specs = new Map(denseTensorSpecs(config).map((s) => [s.name, s]));
      for (const { name, piece } of plan.dense) {
        const spec = specs.get(name)!;
        const dtype = storageDType(spec, weights);
        const m = reader.read(piece);
        if (dtype === "q4" && m.isQ4) w.addDenseRaw(name, "q4", storedBytes(m, spec, dtype));
        else w.addDense(name, m.toF32());
        progress(w.lastDenseBytes);
      }
      const { layers, per_layer, stride } = w.expertLayout;
      // A bundled app carries no worker file: it encodes the records on this thread.
      const workers = EXPERT_WORKER === null ? 0 : opts.workers ?? (layers * per_layer * stride >= 256 << 20 ? Math.min(8, navigator.hardwareConcurrency) : 0);
      if (workers > 1) await writeExpertsInWorkers(w, opts, workers, () => progress(stride));
      else
        for (let l = 0; l < layers; l++)
          for (let e = 0; e < per_layer; e++) {
            w.addExpertRaw(l, e, expertRecord(plan, reader, w.expertLayout.parts, l, e));
            progress(stride);
          }
      copyTokenizer(opts.src, w, log);
      const manifest = await w.finish();
      const bytes = manifest.tensors.reduce((s, t) => s + t.bytes, 0) + layers * per_layer * stride;
      return { architecture, format, config, manifest, bytes, sourceBytes, seconds: (performance.now() - started) / 1000 };
    } catch (e) {
      w.abort();
      throw e;
    }
  } finally {
    ckpt.close();
  }
}

export type RecordParts = { name: string; dtype: DType; shape: number[] }[];

/** The stored bytes of each part of expert (l, e). */
export function expertRecord(plan: ConversionPlan, reader: PieceReader, parts: RecordParts, l: number, e: number): Record<string, Uint8Array> {
  const pieces = plan.expert(l, e);
  const record: Record<string, Uint8Array> = {};
  for (const part of parts) {
    const m = reader.read(pieces[part.name as "gate" | "up" | "down"]);
    record[part.name] = storedBytes(m, { name: `experts.${l}.${e}.${part.name}`, shape: part.shape }, part.dtype);
  }
  return record;
}

/**
 * Encodes expert records in `count` workers (each opens the checkpoint itself) and writes them
 * in order; at most two jobs per worker are in flight, so memory stays at a few records.
 */
async function writeExpertsInWorkers(w: ModelWriter, opts: ConvertOptions, count: number, progress: () => void): Promise<void> {
  const { layers, per_layer, parts } = w.expertLayout;
  const jobs = layers * per_layer;
  const pool = Array.from({ length: count }, () => new Worker(EXPERT_WORKER!));
  try {
    await new Promise<void>((resolve, reject) => {
      let next = 0;
      let written = 0;
      const done = new Map<number, Record<string, Uint8Array>>();
      const dispatch = (worker: Worker) => {
        if (next >= jobs) return;
        const i = next++;
        worker.postMessage({ type: "job", i, l: Math.floor(i / per_layer), e: i % per_layer });
      };
      for (const worker of pool) {
        worker.onmessage = (ev: MessageEvent) => {
          const m = ev.data as { type: string; i: number; record: Record<string, Uint8Array>; message: string };
          if (m.type === "error") return reject(new ConvertError(m.message));
          done.set(m.i, m.record);
          try {
            for (let rec = done.get(written); rec; rec = done.get(written)) {
              done.delete(written);
              w.addExpertRaw(Math.floor(written / per_layer), written % per_layer, rec);
              progress();
              written++;
            }
          } catch (e) {
            return reject(e);
          }
          if (written === jobs) resolve();
          else dispatch(worker);
        };
        worker.onerror = (ev: ErrorEvent) => reject(new Error(`expert worker: ${ev.message}`));
        worker.postMessage({ type: "init", src: opts.src, kvCache: opts.kvCache, mtp: opts.mtp, parts });
        dispatch(worker);
        dispatch(worker);
      }
    });
  } finally {
    for (const worker of pool) worker.terminate();
  }
}

/** tokenizer.json and tokenizer_config.json (with chat_template.jinja folded in), when present. */
function copyTokenizer(src: string, w: ModelWriter, log: (line: string) => void) {
  const tokPath = join(src, "tokenizer.json");
  if (!existsSync(tokPath)) {
    log("no tokenizer.json in the checkpoint: the model will take token ids only");
    return;
  }
  const tokenizer = readJson(tokPath, "tokenizer.json");
  const cfgPath = join(src, "tokenizer_config.json");
  const tokenizerConfig = existsSync(cfgPath) ? readJson(cfgPath, "tokenizer_config.json") : {};
  const templatePath = join(src, "chat_template.jinja");
  if (tokenizerConfig.chat_template === undefined && existsSync(templatePath))
    tokenizerConfig.chat_template = readTextFile(templatePath, "chat_template.jinja", JSON_CAP);
  w.setTokenizer(tokenizer, tokenizerConfig);
}
