/**
 * Routing traces: per step, the tokens, the routed expert ids and weights of every layer and
 * row, and which experts missed the pool. Written as JSON lines (one step per line) so a
 * long run can be dumped as it goes and read back by benchmarks (bench:pool) and research
 * scripts.
 *
 * Line format (an object; readers also accept the seed's tuple `[tokens, experts, weights, misses]`):
 * ```json
 * {"tokens":[17],"experts":[[[3,9]],...],"weights":[[[0.6,0.4]],...],"misses":[[9],...]}
 * ```
 * experts/weights are [layer][row][k] in rank order (the reference's RouteStep); misses is
 * [layer] of missed expert ids (empty when nothing missed or nothing was tracked); the
 * optional `predicted` is [layer] of the lookahead's predicted union for that layer.
 */
import { closeSync, openSync, readFileSync, writeSync } from "node:fs";

/** One step of a routing trace. */
export interface TraceStep {
  tokens: number[];
  /** [layer][row][k] expert ids. */
  experts: number[][][];
  /** [layer][row][k] routing weights. */
  weights: number[][][];
  /** [layer] expert ids that missed the pool this step. */
  misses: number[][];
  /** [layer] the lookahead's predicted union for that layer, when one ran. */
  predicted?: number[][];
}

/** Appends steps to a JSON-lines file as they happen (synchronous: a crash loses nothing written). */
export class TraceWriter {
  private fd: number | null;
  steps = 0;

  private constructor(
    readonly path: string,
    fd: number,
  ) {
    this.fd = fd;
  }

  /** Creates (truncates) `path`, or appends with `append: true`. */
  static open(path: string, opts: { append?: boolean } = {}): TraceWriter {
    let fd: number;
    try {
      fd = openSync(path, opts.append ? "a" : "w");
    } catch (e) {
      throw new Error(`routing trace: cannot open ${path} for writing: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
    }
    return new TraceWriter(path, fd);
  }

  write(step: TraceStep): void {
    if (this.fd === null) throw new Error(`routing trace ${this.path}: already closed`);
    const line: TraceStep = { tokens: step.tokens, experts: step.experts, weights: step.weights, misses: step.misses };
    if (step.predicted) line.predicted = step.predicted;
    writeSync(this.fd, JSON.stringify(line) + "\n");
    this.steps++;
  }

  close(): void {
    if (this.fd === null) return;
    closeSync(this.fd);
    this.fd = null;
  }
}

const isIntArray = (x: unknown): x is number[] => Array.isArray(x) && x.every((v) => Number.isInteger(v));
const isNumArray = (x: unknown): x is number[] => Array.isArray(x) && x.every((v) => typeof v === "number");
const isIds3 = (x: unknown): x is number[][][] => Array.isArray(x) && x.every((l) => Array.isArray(l) && l.every(isIntArray));
const isNums3 = (x: unknown): x is number[][][] => Array.isArray(x) && x.every((l) => Array.isArray(l) && l.every(isNumArray));
const isIds2 = (x: unknown): x is number[][] => Array.isArray(x) && x.every(isIntArray);

/** Checks and normalises one step (object or tuple form); `where` names the file and line in errors. */
export function parseTraceStep(raw: unknown, where: string): TraceStep {
  const o: Record<string, unknown> | null = Array.isArray(raw)
    ? { tokens: raw[0], experts: raw[1], weights: raw[2], misses: raw[3] }
    : (raw as Record<string, unknown> | null);
  if (!o || typeof o !== "object") throw new Error(`${where}: a trace step must be an object or a [tokens, experts, weights, misses] tuple`);
  const tokens = o.tokens;
  const experts = o.experts;
  if (!isIntArray(tokens)) throw new Error(`${where}: tokens must be an array of integers`);
  if (!isIds3(experts)) throw new Error(`${where}: experts must be [layer][row][k] integers`);
  const weights = o.weights ?? [];
  if (!isNums3(weights)) throw new Error(`${where}: weights must be [layer][row][k] numbers`);
  const misses = o.misses ?? [];
  if (!isIds2(misses)) throw new Error(`${where}: misses must be [layer] arrays of expert ids`);
  experts.forEach((rows, l) => {
    if (rows.length !== tokens.length && rows.length !== 0)
      throw new Error(`${where}: layer ${l} has ${rows.length} rows of experts for ${tokens.length} tokens`);
  });
  const step: TraceStep = { tokens, experts, weights, misses };
  if (o.predicted !== undefined) {
    if (!isIds2(o.predicted)) throw new Error(`${where}: predicted must be [layer] arrays of expert ids`);
    step.predicted = o.predicted;
  }
  return step;
}

/**
 * Reads a routing trace: JSON lines (this module's format), or a JSON document holding an
 * array of steps, `{trace: [...]}` or `{steps: [...]}` (the reference's Generation), or a
 * training-run trace (spec/train/traces: see {@link fromExcerptTrace}); gzipped when the
 * name ends in .gz.
 */
export function readTrace(path: string): TraceStep[] {
  return parseTrace(readTraceText(path), path);
}

/** The text of a trace file, gunzipped when its name ends in .gz. */
export function readTraceText(path: string): string {
  let bytes: Uint8Array<ArrayBuffer>;
  try {
    bytes = readFileSync(path) as Uint8Array<ArrayBuffer>;
  } catch (e) {
    throw new Error(`routing trace: cannot read ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  if (!path.endsWith(".gz")) return new TextDecoder().decode(bytes);
  try {
    return new TextDecoder().decode(Bun.gunzipSync(bytes));
  } catch (e) {
    throw new Error(`routing trace: ${path} is not valid gzip: ${(e as Error).message}`);
  }
}

/** {@link readTrace} on text already read; `source` names it in errors. */
export function parseTrace(text: string, source: string): TraceStep[] {
  const trimmed = text.trim();
  if (trimmed === "") return [];
  // A whole JSON document first (arrays and objects), else JSON lines.
  let doc: unknown;
  let isDoc = false;
  if (trimmed.startsWith("[") || trimmed.startsWith("{")) {
    try {
      doc = JSON.parse(trimmed);
      isDoc = true;
    } catch {
      isDoc = false;
    }
  }
  if (isDoc) {
    if (isExcerptTrace(doc)) return fromExcerptTrace(doc, source);
    const steps = Array.isArray(doc) ? doc : ((doc as { trace?: unknown; steps?: unknown }).trace ?? (doc as { steps?: unknown }).steps);
    // A single JSON-lines step is also a valid document: tell them apart by shape.
    if (!Array.isArray(doc) && steps === undefined && (doc as { experts?: unknown }).experts !== undefined) return [parseTraceStep(doc, `${source}:1`)];
    if (!Array.isArray(steps)) throw new Error(`${source}: expected an array of trace steps, {trace: [...]} or {steps: [...]}`);
    if (Array.isArray(doc) && doc.length > 0 && isIntArray(doc[0])) return [parseTraceStep(doc, `${source}:1`)]; // one tuple
    return steps.map((s, i) => parseTraceStep(s, `${source}: step ${i}`));
  }
  const out: TraceStep[] = [];
  trimmed.split("\n").forEach((line, i) => {
    if (line.trim() === "") return;
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch (e) {
      throw new Error(`${source}:${i + 1}: not valid JSON: ${(e as Error).message}`);
    }
    out.push(parseTraceStep(raw, `${source}:${i + 1}`));
  });
  return out;
}

/**
 * The traces recorded by the training runs (spec/train/measure.ts): one-row decode steps,
 * per excerpt `experts[step]` and `weights[step]` flattened [layer][k], and
 * `predicted[step]` the lookahead's sets for layers 1..layers-1 flattened [layer-1][k].
 */
export interface ExcerptTrace {
  model?: string;
  layers: number;
  topK: number;
  /** Routed experts per layer. */
  experts: number;
  excerpts: { path?: string; tokens: number[]; experts: number[][]; weights?: number[][]; predicted?: number[][] }[];
}

function isExcerptTrace(doc: unknown): doc is ExcerptTrace {
  const d = doc as Partial<ExcerptTrace> | null;
  return !!d && typeof d === "object" && Array.isArray(d.excerpts) && Number.isInteger(d.layers) && Number.isInteger(d.topK);
}

/** Converts a training-run trace to steps, excerpts back to back. */
export function fromExcerptTrace(doc: ExcerptTrace, source: string): TraceStep[] {
  const { layers, topK } = doc;
  const out: TraceStep[] = [];
  const byLayer = <T>(flat: T[], count: number): T[][] => Array.from({ length: count }, (_, l) => flat.slice(l * topK, (l + 1) * topK));
  doc.excerpts.forEach((ex, x) => {
    const where = `${source}: excerpt ${x}${ex.path ? ` (${ex.path})` : ""}`;
    if (!isIntArray(ex.tokens) || !Array.isArray(ex.experts) || ex.experts.length !== ex.tokens.length)
      throw new Error(`${where}: needs tokens and one experts entry per token`);
    ex.tokens.forEach((token, t) => {
      const flat = ex.experts[t]!;
      if (!isIntArray(flat) || flat.length !== layers * topK)
        throw new Error(`${where}: step ${t}: experts has ${Array.isArray(flat) ? flat.length : "no"} ids, expected layers x topK = ${layers * topK}`);
      const w = ex.weights?.[t];
      const step: TraceStep = {
        tokens: [token],
        experts: byLayer(flat, layers).map((ids) => [ids]),
        weights: w ? byLayer(w, layers).map((ws) => [ws]) : [],
        misses: [],
      };
      const p = ex.predicted?.[t];
      if (p) {
        if (!isIntArray(p) || p.length !== (layers - 1) * topK)
          throw new Error(`${where}: step ${t}: predicted has ${Array.isArray(p) ? p.length : "no"} ids, expected (layers - 1) x topK = ${(layers - 1) * topK}`);
        step.predicted = [[], ...byLayer(p, layers - 1)];
      }
      out.push(step);
    });
  });
  return out;
}
