// The public face of cherenkov: Model.load(), generate(), stream(), sessions.
import type { ModelConfig } from "../model/config.ts";
import { defaultModelDir } from "../model/default-model.ts";
import { openModel, type ModelFiles } from "../model/format.ts";
import { loadTokenizer, MissingTokenizerError, type ChatMessage, type TextTokenizer } from "../model/tokenizer.ts";
import { encodeChat } from "../model/chat-encode.ts";
import { BackendUnavailableError, throwIfAborted, type Backend, type BackendSequence, type BackendStats, type SampleRequest, type TokenLogprobs } from "./backend.ts";
import { checkSeed, hasPenalties, isPlainGreedy, samplingParams, type PenaltyCounts, type SamplingOptions } from "../reference/sampling.ts";
import { ReferenceBackend } from "./reference-backend.ts";
import { EngineBackend, type EngineOptions } from "./engine-backend.ts";
import { DraftController } from "./draft-controller.ts";
import { Checkpoint } from "./checkpoint.ts";
import { StopHoldback } from "./stop-holdback.ts";
import { checkGenerateOptions, parsePrompt } from "./validate.ts";
import { SessionBusyError, SessionClosedError } from "./session-errors.ts";
import { loadShim } from "../shim.ts";
import { autoBackend, gpuProblem } from "./auto-backend.ts";
import { checkFits, engineMinimumFootprint, memoryBudget, referenceFootprint } from "./footprint.ts";
import { ModelClosedError } from "./errors.ts";
import { ContextFullError } from "../gpu/state.ts";

export type BackendName = "auto" | "reference" | "cpu" | "metal" | "cuda";

export interface LoadOptions {
  /**
   * Which backend runs the model: "cpu" / "metal" run the engine through metal-shim,
   * "reference" the pure-TypeScript oracle; "auto" (default) takes the best one available.
   */
  backend?: BackendName;
  /** Verify every checksum while loading (reads the whole model once). */
  verify?: boolean;
  /** Rows per prefill chunk. */
  prefillChunk?: number;
  /**
   * Engine options: pool size (`pool: "50%"`, `poolSlots`, `poolBytes`), `backing` ("wired" |
   * "mapped"), `ioMode` ("direct" | "cached"), `lookahead`, `preload` ("auto" | boolean: read
   * every expert record at load), `maxContext`, `trace` (a file for routing traces) and more;
   * see docs/engine.md. The reference backend takes `maxContext`
   * only (its sequences then hold as many positions); it has no pool to set.
   */
  engine?: EngineOptions;
  /** Progress of long loads, in bytes. */
  onProgress?: (done: number, total: number) => void;
  /**
   * Where load warnings go (default: console.warn), e.g. files of the directory that no
   * checksum covers (a cherenkov/1 index, an unrecorded tokenizer file; `cherenkov seal`
   * records them).
   */
  onWarning?: (message: string) => void;
}

/** What to generate from: text, token ids, or chat messages (rendered with the model's chat template). */
export type Prompt = string | number[] | ChatMessage[];

/** Tokens generated when a request names no maximum: the API, `cherenkov run` and the server alike. */
export const DEFAULT_MAX_TOKENS = 256;

export interface GenerateOptions extends SamplingOptions {
  /** Tokens to generate at most (default {@link DEFAULT_MAX_TOKENS}, 256). */
  maxTokens?: number;
  /** Stop at the end-of-sequence token (default true). */
  stopAtEos?: boolean;
  /**
   * Stop when the text contains one of these; the stop string is not returned, and stream()
   * holds back text that may begin one until it is known (so its chunks add up to the text).
   */
  stop?: string[];
  /**
   * MTP drafts per step (speculative decoding; the output is identical to plain greedy).
   * "auto": each step picks the count (0 included) with the most expected tokens per second
   * from the measured acceptance and step times (lib/api/draft-controller.ts).
   */
  drafts?: number | "auto";
  /** Cancels generation: generate() rejects and stream() throws an AbortError. */
  signal?: AbortSignal;
  /** Integer in [0, 2^53): the same seed and inputs give the same tokens on every backend (default: a random seed). */
  seed?: number;
  /** Report each token's log-probability (log_softmax of the raw logits) in `logprobs`. */
  logprobs?: boolean;
  /** With logprobs: also the most likely alternatives per token, 0..20 (default 0). */
  topLogprobs?: number;
}

/** A token's log-probability under the model (log_softmax of its raw logits), with the most likely alternatives. */
export interface TokenLogprob {
  id: number;
  /** The token's own text (special tokens included). */
  text: string;
  logprob: number;
  /** The `topLogprobs` most likely tokens at this position, most likely first (ties: lower id first). */
  top: Array<{ id: number; text: string; logprob: number }>;
}

export type FinishReason = "length" | "eos" | "stop";

export interface GenerationResult {
  text: string;
  tokens: number[];
  finishReason: FinishReason;
  usage: { promptTokens: number; completionTokens: number };
  timings: { prefillMs: number; decodeMs: number; tokensPerSecond: number };
  /** With drafts: proposed and accepted drafts, and the steps run with k drafts (index k). */
  drafts?: DraftStats;
  /** With `logprobs: true`: one entry per generated token. */
  logprobs?: TokenLogprob[];
}

export interface DraftStats {
  proposed: number;
  accepted: number;
  /** steps[k]: decode steps that ran with k drafts (the counts "auto" chose, or the fixed one). */
  steps: number[];
  /** With drafts "auto": the controller's acceptance by draft position and step times by count. */
  auto?: { acceptance: number[]; stepMs: (number | null)[] };
}

export interface StreamChunk {
  token: number;
  /**
   * Text this token completed (may be "" while a UTF-8 character is split across tokens, or
   * while the text may be the start of a stop string). The chunks' texts add up to the result's.
   */
  text: string;
  /** With `logprobs: true`: this token's entry (one element). */
  logprobs?: TokenLogprob[];
}

/** Cumulative generation counters; the backend adds its own telemetry under `backend`. */
/** What model.stats() returns: counters since load, and the backend's telemetry under `engine`. */
export interface ModelStats {
  /** The backend's name: "reference", "cpu", "metal" or "cuda" (its telemetry is `engine`). */
  backend: string;
  /** Finished generations (aborted ones are not counted). */
  generations: number;
  promptTokens: number;
  completionTokens: number;
  prefillMs: number;
  decodeMs: number;
  /** MTP draft tokens proposed and accepted. */
  drafts: { proposed: number; accepted: number };
  /** The backend's own telemetry, whatever the backend: pool, IO, lookahead, phases ... on the engine; only `backend` on the reference. */
  engine: BackendStats;
}

/** Why the shim of `backend` cannot be loaded here, or null when it can. */
function shimUnavailable(backend: "cpu" | "metal" | "cuda"): string | null {
  try {
    loadShim(backend);
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

/**
 * "reference": the pure-TS oracle. "cpu" / "metal" / "cuda": the engine on that metal-shim backend.
 * "auto": autoBackend() (lib/api/auto-backend.ts). A backend that cannot load is an error
 * naming what to run, never a fallback to another backend.
 */
async function openBackend(files: ModelFiles, opts: LoadOptions): Promise<{ backend: Backend; reason: string | null }> {
  let name = opts.backend ?? "auto";
  // The footprints are checked against the budget before anything is allocated (footprint.ts).
  const budget = memoryBudget(undefined, opts.engine?.hostReserveBytes);
  let reason: string | null = null;
  if (name === "auto") ({ backend: name, reason } = autoBackend({ model: { manifest: files.manifest, budget } }));
  if (name === "reference") {
    checkFits("reference", files.dir, referenceFootprint(files.manifest), budget, "Use --backend cpu (Model.load backend \"cpu\"): the engine streams the experts from disk.");
    return { backend: new ReferenceBackend(files, { prefillChunk: opts.prefillChunk, maxContext: opts.engine?.maxContext }), reason };
  }
  const engine: EngineOptions = { ...opts.engine, prefillChunk: opts.engine?.prefillChunk ?? opts.prefillChunk };
  if (name === "cpu" || name === "metal" || name === "cuda") {
    // A GPU backend must also open a device (and run a kernel): otherwise a driver's error
    // would surface mid-load as if the model were at fault.
    const why = name === "cpu" ? shimUnavailable(name) : gpuProblem(name);
    if (why) throw new BackendUnavailableError(`backend "${name}" is not available here: ${why}`);
    // The cpu device is host memory: with the pool sized by the budget, what the engine cannot
    // run without is checked before the device allocates anything (an explicit pool size is the
    // caller's override, as in planPool). Metal and CUDA plan against their device once it is open.
    const explicitPool = engine.pool !== undefined || engine.poolSlots !== undefined || engine.poolBytes !== undefined;
    if (name === "cpu" && !explicitPool)
      checkFits("cpu", files.dir, engineMinimumFootprint(files.manifest, { maxContext: engine.maxContext }), budget, "Even the smallest expert pool does not fit: use a machine with more memory, or a smaller --context.");
    return { backend: await openEngine(files, name, engine, opts), reason };
  }
  throw new BackendUnavailableError(`backend "${name}" is unknown (available: auto, reference, cpu, metal, cuda)`);
}

async function openEngine(files: ModelFiles, backend: "cpu" | "metal" | "cuda", engine: EngineOptions, opts: LoadOptions): Promise<Backend> {
  try {
    return await EngineBackend.open(files, backend, engine, opts.onProgress);
  } catch (e) {
    files.close();
    throw e;
  }
}

/**
 * A loaded model: `Model.load()` opens a model directory (the shipped qwen4-exp-tiny by
 * default) on a backend (`auto`: Metal on macOS, CUDA with an NVIDIA GPU, else the reference
 * or the cpu engine), then `generate()`, `stream()` and `session()` run it; `stats()` reports
 * the pool, IO and timings; `close()` (or `await using`) frees it. docs/engine.md and
 * docs/sampling.md describe the options.
 */
export class Model {
  private closed = false;
  private counters: Omit<ModelStats, "backend" | "engine"> = {
    generations: 0, promptTokens: 0, completionTokens: 0, prefillMs: 0, decodeMs: 0, drafts: { proposed: 0, accepted: 0 },
  };

  private constructor(
    /** The model directory. */
    readonly dir: string,
    readonly config: ModelConfig,
    /** The tokenizer, or null when the directory has none (token-id prompts only). */
    readonly tokenizer: TextTokenizer | null,
    private backend: Backend,
    /** Why "auto" chose this backend (null when the backend was named). */
    readonly backendReason: string | null = null,
  ) {}

  /**
   * Loads a model directory (the cherenkov format; `cherenkov convert` makes one from Hugging
   * Face or MLX checkpoints). Without `dir`, the embedded default model.
   */
  static async load(dir?: string, opts: LoadOptions = {}): Promise<Model> {
    const path = dir ?? (await defaultModelDir());
    const files = await openModel(path, { verify: opts.verify });
    if (files.unverified.length > 0)
      (opts.onWarning ?? ((m: string) => console.warn(`cherenkov: ${m}`)))(
        `${path}: not covered by any checksum, so damage to it would go unnoticed: ${files.unverified.join("; ")}. After checking the files, \`cherenkov seal ${path}\` records their checksums`,
      );
    let tokenizer: TextTokenizer | null = null;
    try {
      // the index openModel validated: the checksums checked are the ones the model was loaded with
      tokenizer = await loadTokenizer(path, files.manifest);
    } catch (e) {
      // No tokenizer.json: token-id prompts only. A broken tokenizer is an error, never silence.
      if (!(e instanceof MissingTokenizerError)) {
        files.close();
        throw e;
      }
    }
    let opened: { backend: Backend; reason: string | null };
    try {
      opened = await openBackend(files, opts);
    } catch (e) {
      files.close();
      throw e;
    }
    return new Model(path, files.config, tokenizer, opened.backend, opened.reason);
  }

  /** "reference", "cpu" or "metal". */
  get backendName(): string {
    return this.backend.name;
  }

  /** Token ids of a prompt. */
  encode(prompt: Prompt): number[] {
    // the shape is checked (InvalidArgumentError naming what is wrong), ids against the vocabulary
    const p = parsePrompt(prompt, this.config.vocab_size);
    if (p.kind === "ids") return p.ids.slice();
    const tok = this.requireTokenizer();
    if (p.kind === "text") return tok.encode(p.text);
    // message contents are text: a special token's string typed in them is not a control token
    return encodeChat(tok, p.messages);
  }

  decode(tokens: number[]): string {
    return this.tokenizer ? this.tokenizer.decode(tokens, { skipSpecialTokens: true }) : "";
  }

  private turnEndIds: number[] | null = null;

  /**
   * @internal The ids that close an assistant turn after `answer` (the tokens generated in it),
   * as the chat template renders the end of an assistant message (`<|im_end|>\n` for Qwen
   * templates). When the answer already ends with the close's first token (the end-of-turn
   * token it stopped at), only the rest.
   */
  turnEnd(answer: readonly number[]): number[] {
    if (this.turnEndIds === null) {
      const tok = this.requireTokenizer();
      const mark = "cherenkovTurnMark";
      const rendered = tok.applyChatTemplate([{ role: "user", content: "x" }, { role: "assistant", content: mark }], { addGenerationPrompt: false });
      const at = rendered.lastIndexOf(mark);
      if (at < 0) throw new Error(`${this.dir}: the chat template does not render an assistant message's content, so a session cannot close the assistant turn`);
      this.turnEndIds = tok.encode(rendered.slice(at + mark.length), { addSpecialTokens: false });
    }
    const end = this.turnEndIds;
    return end.length > 0 && answer[answer.length - 1] === end[0] ? end.slice(1) : end.slice();
  }

  /** @internal One token's own text, special tokens included (for logprobs). */
  tokenText(id: number): string {
    return this.tokenizer ? this.tokenizer.decode([id], { skipSpecialTokens: false }) : "";
  }

  /** @internal Zeroed penalty counts in the backend's storage. */
  penaltyCounts(): PenaltyCounts {
    return this.backend.penaltyCounts();
  }

  private requireTokenizer(): TextTokenizer {
    if (!this.tokenizer) throw new Error(`${this.dir} has no tokenizer.json: pass token ids instead of text`);
    return this.tokenizer;
  }

  private check() {
    if (this.closed) throw new ModelClosedError("the model is closed");
  }

  /** Generates a continuation of `prompt` in a fresh sequence. */
  async generate(prompt: Prompt, opts: GenerateOptions = {}): Promise<GenerationResult> {
    checkGenerateOptions(opts);
    const s = this.session();
    try {
      await s.appendFor(prompt, opts);
      return await s.generate(opts);
    } finally {
      s.close();
    }
  }

  /** Streams the continuation of `prompt` token by token. Breaking out of the loop stops generation. */
  async *stream(prompt: Prompt, opts: GenerateOptions = {}): AsyncGenerator<StreamChunk, GenerationResult> {
    checkGenerateOptions(opts);
    const s = this.session();
    try {
      await s.appendFor(prompt, opts);
      return yield* s.stream(opts);
    } finally {
      s.close();
    }
  }

  /**
   * A conversation or document that grows: append, generate, append more, ... With `from`, the
   * session continues from a checkpoint (`session.checkpoint()`) of this model without running
   * its prefix again.
   */
  session(opts: SessionOptions = {}): Session {
    this.check();
    const from = opts.from;
    const track = (s: Session) => {
      this.sessions.add(s);
      s.onClose(() => this.sessions.delete(s));
      return s;
    };
    if (from === undefined) return track(new Session(this, this.backend.newSequence(), (c) => this.account(c)));
    if (!(from instanceof Checkpoint)) throw new Error("session({ from }): `from` must be a Checkpoint made by session.checkpoint()");
    if (from.owner !== this)
      throw new Error(
        `session({ from }): the checkpoint was made by another model (${from.origin}); a checkpoint resumes only on the loaded model that made it (this is ${this.dir} on ${this.backend.name})`,
      );
    return track(new Session(this, this.backend.newSequence(from.state), (c) => this.account(c), from));
  }

  /** Open sessions: close() stops what they run before the backend goes. */
  private sessions = new Set<Session>();

  private account(c: Partial<Omit<ModelStats, "backend" | "engine">>) {
    const k = this.counters;
    k.generations += c.generations ?? 0;
    k.promptTokens += c.promptTokens ?? 0;
    k.completionTokens += c.completionTokens ?? 0;
    k.prefillMs += c.prefillMs ?? 0;
    k.decodeMs += c.decodeMs ?? 0;
    k.drafts.proposed += c.drafts?.proposed ?? 0;
    k.drafts.accepted += c.drafts?.accepted ?? 0;
  }

  /** Counters since load, and the backend's telemetry. */
  stats(): ModelStats {
    return { backend: this.backend.name, ...structuredClone(this.counters), engine: this.backend.stats() };
  }

  /** Ids that end a generation: the config's eos_token_id and the tokenizer's end tokens (e.g. <|im_end|>). */
  get stopTokens(): ReadonlySet<number> {
    const ids = new Set(this.tokenizer?.eosTokenIds ?? []);
    if (this.config.eos_token_id !== null) ids.add(this.config.eos_token_id);
    return ids;
  }

  private drafting: DraftController | null = null;

  /**
   * @internal The draft-count controller of drafts "auto": one per model, so what one
   * generation measured (acceptance, step times) serves the next.
   */
  draftController(): DraftController {
    this.drafting ??= new DraftController({ maxDrafts: this.backend.maxDrafts });
    return this.drafting;
  }

  /**
   * The most tokens one session holds (prompt and generated): `engine.maxContext` at load; null
   * on the reference without it, where only memory limits it.
   */
  get maxContext(): number | null {
    return this.backend.maxContext;
  }

  /** @internal */
  get maxDrafts(): number {
    return this.backend.maxDrafts;
  }

  /** Closes the model: a generation still running in any of its sessions stops with SessionClosedError. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const running = [...this.sessions].map((s) => s.closeFor("the model was closed"));
    await Promise.allSettled(running);
    await this.backend.close();
  }

  /** `await using model = await Model.load()` closes the model at the end of the scope. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/**
 * Incremental detokenizer: emits text only once a UTF-8 character is complete. Each token
 * decodes a short window (from the token before the last emitted text on), not the whole
 * generation, so streaming stays linear in its length.
 */
class TextStream {
  private emitted = "";
  private tokens: number[] = [];
  /** Window start: decoding from here gives `prefix` and then the new text. */
  private prefixOffset = 0;
  /** Tokens whose text has been emitted. */
  private readOffset = 0;
  constructor(private model: Model) {}
  push(token: number): string {
    this.tokens.push(token);
    const prefix = this.model.decode(this.tokens.slice(this.prefixOffset, this.readOffset));
    const text = this.model.decode(this.tokens.slice(this.prefixOffset));
    if (text.length <= prefix.length || text.endsWith("\uFFFD")) return "";
    const delta = text.slice(prefix.length);
    this.prefixOffset = this.readOffset;
    this.readOffset = this.tokens.length;
    this.emitted += delta;
    return delta;
  }
  get text() {
    return this.emitted;
  }
}

export interface SessionOptions {
  /** Continue from a checkpoint of this model (see Session.checkpoint). */
  from?: Checkpoint;
}

/**
 * One growing sequence of tokens. It runs one operation at a time: append, generate, stream,
 * checkpoint or reset while a generate or stream of the same session has not finished throws
 * SessionBusyError (never queued: a queued append would land inside the running answer).
 * Separate sessions of one model may run at once (the engine runs their steps in turn).
 * close(), of the session or of its model, stops a running operation at its next step on
 * every backend; it then fails with SessionClosedError.
 */
export class Session {
  /** Every token of the session, prompts and generated ones. */
  readonly tokens: number[] = [];
  /** Greedy next token after the last row, valid while every token has been run. */
  private prediction: number | null = null;
  private newPromptTokens = 0;
  private prefillMs = 0;
  /**
   * Where the assistant turn that the last chat append opened begins (tokens after it are its
   * answer), or -1: the next chat append closes that turn first.
   */
  private openTurn = -1;
  private closed = false;
  /** The operation running now (one at a time). */
  private running: { name: string } | null = null;
  /** The backend call in flight (a forward or speculative step), if any. */
  private inflight: Promise<unknown> | null = null;
  /** Aborted by close(): stops a running operation at its next step, on every backend. */
  private closer = new AbortController();
  private closeListeners: (() => void)[] = [];

  /** @internal */
  constructor(private model: Model, private seq: BackendSequence, private account: (c: object) => void, from?: Checkpoint) {
    if (from) {
      this.tokens.push(...from.tokens);
      this.prediction = from.prediction;
      this.openTurn = from.openTurn;
    }
  }

  /**
   * A compact copy of the session as it is now (tokens and the backend's state copy): new
   * sessions of this model continue from it with `model.session({ from })`. It stays valid
   * when this session goes on or is closed. Not while a generate() of this session is running.
   */
  checkpoint(): Checkpoint {
    this.checkIdle("checkpoint");
    return new Checkpoint(this.model, `${this.model.dir} on ${this.model.backendName}`, this.tokens.slice(), this.prediction, this.seq.checkpoint(), this.openTurn);
  }

  /**
   * Runs the tokens not yet in the sequence, then `extra`; returns the prediction after them
   * (drawn by `sample` when given). A stop inside an accepted draft run leaves rows past the
   * last token: then the sequence is rebuilt from the tokens (rare, and exact).
   */
  private async catchUp(extra: number[], signal?: AbortSignal, sample?: SampleRequest, nextDrafts = 0): Promise<{ next: number; logprobs?: TokenLogprobs }> {
    // Rows past the tokens, or nothing left to run and no prediction kept: rebuild.
    if (this.seq.length > this.tokens.length || (extra.length === 0 && this.seq.length === this.tokens.length)) this.seq.reset();
    const run = [...this.tokens.slice(this.seq.length), ...extra];
    const t0 = performance.now();
    // Only the last row's logits: the prompt's other rows only advance the state.
    const r = await this.step(this.seq.forward(run, { signal, sample, logits: "last", nextDrafts }));
    this.prefillMs += performance.now() - t0;
    return { next: r.next[0]!, logprobs: r.logprobs?.[0] };
  }

  /**
   * Runs `prompt` through the model (a prefill); generation continues after it. Options as
   * everywhere else: `{ signal }` (a bare AbortSignal is still accepted).
   */
  async append(prompt: Prompt, options?: { signal?: AbortSignal } | AbortSignal): Promise<void> {
    return this.appendThen(prompt, options instanceof AbortSignal ? options : options?.signal, 0);
  }

  /** append(), telling the backend the generation's first step (a cycle of nextDrafts drafts, or 0: a plain step). */
  private async appendThen(prompt: Prompt, signal: AbortSignal | undefined, nextDrafts: number): Promise<void> {
    const op = this.begin("append", signal);
    try {
      const ids = this.promptIds(prompt);
      if (ids.length === 0) throw new Error("append: the prompt is empty");
      this.prediction = null;
      const next = await this.catchUp(ids, op, undefined, nextDrafts);
      this.tokens.push(...ids);
      this.openTurn = isChat(prompt) ? this.tokens.length : -1;
      this.newPromptTokens += ids.length;
      this.prediction = next.next;
    } catch (e) {
      throw this.closedInstead(e);
    } finally {
      this.end();
    }
  }

  /**
   * @internal append() for a generation with `opts`: when it samples, the prompt's last token
   * is left to the generation's first step, which draws from its row (a greedy prediction
   * made here would have to be recomputed).
   */
  async appendFor(prompt: Prompt, opts: GenerateOptions): Promise<void> {
    if (!samplingRequest(opts)) return this.appendThen(prompt, opts.signal, this.firstDrafts(opts));
    const signal = this.begin("append", opts.signal);
    try {
      const ids = this.promptIds(prompt);
      if (ids.length === 0) throw new Error("append: the prompt is empty");
      this.prediction = null;
      if (this.seq.length > this.tokens.length) this.seq.reset();
      const run = [...this.tokens.slice(this.seq.length), ...ids.slice(0, -1)];
      if (run.length > 0) {
        const t0 = performance.now();
        await this.step(this.seq.forward(run, { signal, logits: "none" }));
        this.prefillMs += performance.now() - t0;
      }
      this.tokens.push(...ids);
      this.openTurn = isChat(prompt) ? this.tokens.length : -1;
      this.newPromptTokens += ids.length;
    } catch (e) {
      throw this.closedInstead(e);
    } finally {
      this.end();
    }
  }

  /**
   * The ids `prompt` appends. Chat messages after an assistant turn (opened by the last append,
   * which was chat messages too) first close that turn as the template would have rendered it,
   * whether the answer ended with the end-of-turn token or stopped on length or a stop string
   * (the answer keeps every generated token). Text and token ids are appended as they are.
   */
  private promptIds(prompt: Prompt): number[] {
    const ids = this.model.encode(prompt);
    if (!isChat(prompt) || this.openTurn < 0) return ids;
    return [...this.model.turnEnd(this.tokens.slice(this.openTurn)), ...ids];
  }

  /**
   * Starts an operation: refused when the session is closed or another operation runs.
   * Returns the signal the operation runs under (the caller's and close()).
   */
  private begin(name: string, signal?: AbortSignal): AbortSignal {
    this.checkIdle(name);
    this.running = { name };
    return signal ? AbortSignal.any([signal, this.closer.signal]) : this.closer.signal;
  }

  private end(): void {
    this.running = null;
    if (this.closed) this.seq.dispose();
  }

  /** Runs a backend call, remembered so that close() can wait for it to settle. */
  private step<T>(call: Promise<T>): Promise<T> {
    this.inflight = call;
    const clear = () => {
      if (this.inflight === call) this.inflight = null;
    };
    call.then(clear, clear);
    return call;
  }

  private checkIdle(name: string): void {
    if (this.closed) throw new SessionClosedError(`${name}: the session is closed`);
    if (this.running) throw new SessionBusyError(name, this.running.name);
  }

  /** A failure caused by close() (a disposed sequence, a closed engine) reads as SessionClosedError. */
  private closedInstead(e: unknown): unknown {
    const reason = this.closer.signal.reason;
    return this.closed && !(e instanceof SessionClosedError) && reason instanceof SessionClosedError ? reason : e;
  }

  /** Generates from the current end of the session. */
  async generate(opts: GenerateOptions = {}): Promise<GenerationResult> {
    const it = this.stream(opts);
    for (;;) {
      const r = await it.next();
      if (r.done) return r.value;
    }
  }

  /** Streams tokens from the current end of the session. */
  async *stream(opts: GenerateOptions = {}): AsyncGenerator<StreamChunk, GenerationResult> {
    checkGenerateOptions(opts);
    const signal = this.begin("generate", opts.signal);
    try {
      return yield* this.run(opts, signal);
    } catch (e) {
      throw this.closedInstead(e);
    } finally {
      this.end();
    }
  }

  /**
   * The drafts of a generation's first step after its prompt when they are fixed (run() takes
   * min(drafts, tokens left) then), else 0: a hint for the backend (ForwardOptions.nextDrafts);
   * "auto" decides later.
   */
  private firstDrafts(opts: GenerateOptions): number {
    const wanted = opts.drafts ?? 0;
    if (wanted === "auto" || !Number.isInteger(wanted) || wanted <= 0 || !this.seq.speculate) return 0;
    return Math.max(0, Math.min(wanted, this.model.maxDrafts, (opts.maxTokens ?? DEFAULT_MAX_TOKENS) - 2));
  }

  private async *run(opts: GenerateOptions, signal: AbortSignal): AsyncGenerator<StreamChunk, GenerationResult> {
    if (this.tokens.length === 0) throw new Error("generate: append a prompt first");
    const maxTokens = opts.maxTokens ?? DEFAULT_MAX_TOKENS;
    if (!Number.isInteger(maxTokens) || maxTokens < 0) throw new Error(`maxTokens ${maxTokens} must be an integer >= 0`);
    const stopAtEos = opts.stopAtEos ?? true;
    const eos = this.model.stopTokens;
    const wanted = opts.drafts ?? 0;
    const auto = wanted === "auto";
    if (!auto && (!Number.isInteger(wanted) || wanted < 0)) throw new Error(`drafts ${wanted} must be an integer >= 0 or "auto"`);
    if (!auto && wanted > 0 && (!this.seq.speculate || this.model.maxDrafts === 0))
      throw new Error("speculative decoding needs a model with an MTP head");
    const canDraft = this.seq.speculate ? this.model.maxDrafts : 0;
    const drafts = auto ? canDraft : Math.min(wanted, this.model.maxDrafts);
    const controller = auto && drafts > 0 ? this.model.draftController() : null;
    const sample = samplingRequest(opts);
    if (sample && hasPenalties(sample.params)) {
      sample.counts = this.model.penaltyCounts();
      for (const t of this.tokens) sample.counts.add(t, false);
    }
    const logprobs: TokenLogprob[] | undefined = sample?.logprobs != null ? [] : undefined;
    const entry = (id: number, lp: TokenLogprobs): TokenLogprob => ({
      id,
      text: this.model.tokenText(id),
      logprob: lp.logprob,
      top: lp.top.map((t) => ({ id: t.id, text: this.model.tokenText(t.id), logprob: t.logprob })),
    });
    // The MTP head has not seen the rows run since the last draft step (the prompt included).
    let headBehind = true;
    // The last step's draft count: a step after one of another count is a transition
    // (DraftController), and so is a generation's first step (nothing was prepared for it: on
    // the engine it records or encodes its step, several steady steps' time).
    let lastCount: number | null = null;
    const text = new TextStream(this.model);
    const held = new StopHoldback(opts.stop ?? []);
    const generated: number[] = [];
    const stats: DraftStats = { proposed: 0, accepted: 0, steps: new Array(drafts + 1).fill(0) };
    let finishReason: FinishReason = "length";
    const t0 = performance.now();
    try {
      throwIfAborted(signal);
      let queue: number[];
      let queueLogprobs: TokenLogprobs[] | undefined;
      // Sampling draws from the last row: after append()'s greedy prediction, from the row's
      // logits if the backend still holds them, else by re-running the session.
      const resampled = sample && this.prediction !== null && this.seq.length === this.tokens.length && this.seq.resample ? await this.step(this.seq.resample(sample)) : null;
      if (resampled) {
        queue = [resampled.next];
        queueLogprobs = resampled.logprobs ? [resampled.logprobs] : undefined;
      } else if (sample || this.prediction === null) {
        if (sample) this.prediction = null;
        const first = await this.catchUp([], signal, sample ?? undefined, this.firstDrafts(opts));
        queue = [first.next];
        queueLogprobs = first.logprobs ? [first.logprobs] : undefined;
      } else queue = [this.prediction];
      this.prediction = null;
      outer: while (generated.length < maxTokens) {
        for (let qi = 0; qi < queue.length; qi++) {
          const token = queue[qi]!;
          generated.push(token);
          this.tokens.push(token);
          sample?.counts?.add(token, true);
          // Text that may begin a stop string waits until it is known; at the end it is flushed.
          let out = held.push(text.push(token));
          const ends: FinishReason | null =
            stopAtEos && eos.has(token) ? "eos" : held.stoppedAt >= 0 ? "stop" : generated.length >= maxTokens ? "length" : null;
          if (ends !== null && ends !== "stop") out += held.flush();
          const lp = queueLogprobs?.[qi];
          if (logprobs && lp) {
            const e = entry(token, lp);
            logprobs.push(e);
            yield { token, text: out, logprobs: [e] };
          } else yield { token, text: out };
          if (ends !== null) {
            finishReason = ends;
            break outer;
          }
        }
        throwIfAborted(signal);
        // The newest token has not been run yet: it leads the next step.
        const last = this.tokens[this.tokens.length - 1]!;
        const left = maxTokens - generated.length - 1;
        const k = controller ? controller.choose(left) : Math.min(drafts, left);
        const stepStart = performance.now();
        if (k > 0 && this.seq.speculate) {
          const r = await this.step(this.seq.speculate(last, k, signal, sample ?? undefined));
          stats.proposed += r.proposed;
          stats.accepted += r.next.length - 1;
          queue = r.next;
          queueLogprobs = r.logprobs;
          controller?.observe(r.proposed, r.next.length - 1, performance.now() - stepStart, headBehind || (lastCount !== null && lastCount !== r.proposed));
          stats.steps[r.proposed]!++;
          headBehind = false;
          lastCount = r.proposed;
        } else {
          const r = await this.step(this.seq.forward([last], { signal, sample: sample ?? undefined, logits: "last" }));
          queue = [r.next[0]!];
          queueLogprobs = r.logprobs;
          controller?.observe(0, 0, performance.now() - stepStart, lastCount !== 0);
          stats.steps[0]!++;
          headBehind = true;
          lastCount = 0;
        }
      }
    } catch (e) {
      // The context filled mid-generation: the caller keeps what was generated.
      if (e instanceof ContextFullError) [e.tokens, e.text] = [generated.slice(), text.text];
      throw e;
    } finally {
      sample?.counts?.release();
    }
    const decodeMs = performance.now() - t0;
    const result: GenerationResult = {
      text: held.text,
      tokens: generated,
      finishReason,
      usage: { promptTokens: this.newPromptTokens, completionTokens: generated.length },
      timings: { prefillMs: this.prefillMs, decodeMs, tokensPerSecond: generated.length / Math.max(decodeMs / 1000, 1e-9) },
      ...(logprobs ? { logprobs } : {}),
      ...(drafts > 0 || auto ? { drafts: controller ? { ...stats, auto: { acceptance: controller.stats().acceptance, stepMs: controller.stats().stepMs } } : stats } : {}),
    };
    this.account({ generations: 1, promptTokens: this.newPromptTokens, completionTokens: generated.length, prefillMs: this.prefillMs, decodeMs, drafts: stats });
    this.newPromptTokens = 0;
    this.prefillMs = 0;
    return result;
  }

  /** Forgets everything: the next append starts a new sequence. */
  reset(): void {
    this.checkIdle("reset");
    this.seq.reset();
    this.tokens.length = 0;
    this.prediction = null;
    this.openTurn = -1;
  }

  /**
   * Closes the session. An operation still running stops at its next step (on every backend)
   * and fails with SessionClosedError; the sequence is freed once it has.
   */
  close(): void {
    void this.closeFor("the session was closed");
  }

  /** @internal Closes with `why`; settles once no backend call of this session is in flight. */
  closeFor(why: string): Promise<void> {
    const settled = (this.inflight ?? Promise.resolve()).then(
      () => {},
      () => {},
    );
    if (this.closed) return settled;
    this.closed = true;
    const running = this.running;
    this.closer.abort(new SessionClosedError(running ? `${running.name}: ${why} while it ran` : why));
    for (const f of this.closeListeners.splice(0)) f();
    // The sequence goes once the step in flight is done (a stream suspended between tokens
    // has none; its generator fails with SessionClosedError when it resumes). With none in
    // flight, at once: model.generate() returns after this, and the engine hands the state
    // to the next call's sequence only once it has it back (lib/gpu/engine.ts retire).
    if (this.inflight === null) {
      this.seq.dispose();
      return settled;
    }
    return settled.then(() => this.seq.dispose());
  }

  /** @internal */
  onClose(f: () => void): void {
    this.closeListeners.push(f);
  }

  /** `using chat = model.session()` closes the session at the end of the scope. */
  [Symbol.dispose](): void {
    this.close();
  }

  /** `await using` works too (the same as close()). */
  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}

/** Chat messages (rendered with the template), not text or token ids. */
function isChat(prompt: Prompt): boolean {
  return Array.isArray(prompt) && prompt.length > 0 && prompt.every((m) => typeof m === "object" && m !== null);
}

/**
 * The sample request of generation options, or null for plain greedy (temperature 0 or unset,
 * no penalties, no logprobs): then the backends' argmax path runs, unchanged.
 */
function samplingRequest(opts: GenerateOptions): SampleRequest | null {
  const params = samplingParams(opts);
  const top = opts.topLogprobs ?? 0;
  if (!Number.isInteger(top) || top < 0 || top > 20) throw new RangeError(`topLogprobs ${String(top)} must be an integer in [0, 20]`);
  if (top > 0 && opts.logprobs !== true) throw new RangeError("topLogprobs needs logprobs: true");
  if (opts.logprobs !== undefined && typeof opts.logprobs !== "boolean") throw new TypeError(`logprobs ${String(opts.logprobs)} must be a boolean`);
  const seed = opts.seed === undefined ? Math.floor(Math.random() * 2 ** 53) : checkSeed(opts.seed);
  if (isPlainGreedy(params) && opts.logprobs !== true) return null;
  return { params, seed, counts: null, logprobs: opts.logprobs === true ? top : null };
}
