// The engine: a loaded model (EngineGpu) and its sequences. Steps of every sequence run one
// at a time (one event, one scratch): each public operation takes the engine's lock for the
// steps it runs. A failed step (IO error, GPU wait timeout) resets the sequence it ran for,
// so the caller can replay its tokens, and leaves the engine usable.
import { forwardRange, throwIfAborted, type ForwardOptions, type ForwardResult, type RowRange, type RowsResult, type SampleRequest, type SpeculativeResult } from "../api/backend.ts";
import { Draw, PenaltyCounts } from "../reference/sampling.ts";
import { NonFiniteError } from "../model/errors.ts";
import type { ModelFiles } from "../model/format.ts";
import { checkTokens } from "../reference/model.ts";
import type { Backend, Buffer, CommandBuffer } from "../shim.ts";
import { bind, runNow, shiftedLive, type EncodeContext } from "./dispatch.ts";
import { encodeTrunkStep, type TrunkStep } from "./decode.ts";
import { attentionBreakpoints } from "./attention.ts";
import { encodeDrafts, encodeMtpCatchUp } from "./draft.ts";
import { loadEngine, type EngineGpu, type EngineOptions, type LoadProgress } from "./load.ts";
import { runChunked } from "./prefill.ts";
import { RouteRecorder } from "./route-trace.ts";
import { f32View, i32View, LOGIT_ROWS, rowAt } from "./scratch.ts";
import { encodeSample, SamplingScratch } from "./sampling.ts";
import { SequenceState, type StateImage } from "./state.ts";
import { runStep, type EventCounter, type PreparedStep } from "./step.ts";
import { GpuStepError, SitePlan } from "./handshake.ts";
import { MAX_RECORDINGS, StepRecordings } from "./recorded-step.ts";
import { envOnOff } from "./env-switch.ts";
import type { StepVars } from "./tape.ts";
import { TraceWriter } from "./trace.ts";
import type { LoadedEngineStats } from "./telemetry.ts";

/** A step encoded ahead for a sequence (Engine.prepared). */
interface PreparedEntry {
  readonly pos0: number;
  readonly key: string;
  /** The request whose draft draws the step holds (a sampled cycle), else undefined. */
  readonly draws: SampleRequest | undefined;
  readonly step: PreparedStep;
}

export class Engine {
  private readonly counter: EventCounter = { value: 0 };
  private lock: Promise<unknown> = Promise.resolve();
  private closed = false;
  private readonly trace: TraceWriter | null;
  private readonly sequences = new Set<EngineSequence>();
  private sampling: SamplingScratch | null = null;
  /** Whose last row the logits scratch still holds (a trunk step's last logits block), for resample. */
  private logitsHeld: { seq: SequenceState; length: number; row: number } | null = null;
  /** Storage of the penalty counts handed out (the kernel binds the buffer). */
  private readonly countBuffers = new WeakMap<PenaltyCounts, Buffer>();
  /** Each sequence's recorded steps (recorded-step.ts). */
  private readonly recordings = new WeakMap<SequenceState, StepRecordings>();
  private readonly recordingTotals = { recorded: 0, replayed: 0 };
  /**
   * Each sequence's next step, encoded (replayed from its recording) right after the previous
   * step was committed, while the GPU ran it: a decode row after a decode step, or after a
   * speculative cycle the next cycle for each accept count it may have (docs/engine.md
   * "Recorded steps", "The speculative cycle"). The step that comes commits the one that is
   * exactly it at once instead of encoding first; the others are released.
   */
  private readonly prepared = new Map<SequenceState, PreparedEntry[]>();
  /**
   * Prepared command buffers a step did not use: released once the next step is committed
   * (releasing one unreferences every buffer it binds: host time better spent while the GPU works).
   */
  private readonly unused: CommandBuffer[] = [];
  /** Decode steps that committed a prepared command buffer (stats; tests). */
  private preparedUsed = 0;
  /**
   * A partial accept's rollback not run yet (docs/engine.md "The speculative cycle"): the
   * lengths are already cut; the fixed-size state is restored from the planes of `row` at the
   * start of the sequence's next step, in its command buffer, or on its own (runNow) before
   * anything else touches the state or the planes (another sequence's step, a checkpoint).
   */
  private pendingRollback: { seq: SequenceState; row: number } | null = null;
  /** Speculative cycles run, those encoded from a recording (replayed or just recorded), and those prepared ahead (stats; tests). */
  private readonly cycleCounts = { cycles: 0, recorded: 0, prepared: 0 };
  /** Per draft count k, how often a cycle accepted a drafts (index a, from 1 each): the order the next cycles are prepared in. */
  private readonly acceptTally = new Map<number, number[]>();

  private constructor(readonly gpu: EngineGpu, tracePath: string | undefined) {
    this.trace = tracePath ? TraceWriter.open(tracePath) : null;
  }

  static async load(files: ModelFiles, backend: Backend, opts: EngineOptions = {}, onProgress?: LoadProgress): Promise<Engine> {
    const warm = envOnOff("CHERENKOV_WARM_STEPS", true);
    const rounds = warmReplayRounds(backend);
    const gpu = await loadEngine(files, backend, opts, onProgress);
    let engine: Engine;
    try {
      engine = new Engine(gpu, opts.trace);
    } catch (e) {
      await gpu.close();
      throw e;
    }
    if (warm) {
      try {
        engine.warmSteps(rounds);
      } catch (e) {
        await engine.close();
        throw e;
      }
    }
    return engine;
  }

  /**
   * Records, on the state the next new sequence takes (the spare), the steps a generation
   * replays: the decode row and, with an MTP head, each draft count's cycles (after a prompt or
   * plain steps, and after each accept count), and primes their CUDA graphs (built by the
   * backend's builder thread meanwhile). A new engine's first cycles otherwise recorded them
   * (TypeScript, JIT-cold: on the H200 the tiny model's first two cycles took 8-10 and 5-6 ms
   * against ~0.8 steady) and launched them directly until their graphs were built. Only where
   * steps can be recorded (every expert layer held resident). Then replays them
   * `replayRounds` times, host work only (warmReplays). Returns the steps recorded.
   */
  warmSteps(replayRounds = 0): number {
    const gpu = this.gpu;
    if (!StepRecordings.enabled || this.closed) return 0;
    gpu.resident.refresh();
    const logits = { from: 0, count: 1 };
    const decodeKey = this.recordingKey(1, false, logits);
    if (decodeKey === null) return 0;
    const state = (this.spare ??= new SequenceState(gpu.device, gpu.config, gpu.maxContext));
    const positions = warmPositions(gpu, state.capacity);
    const steps: WarmStep[] = [];
    if (gpu.refs.mtp && gpu.snapshots && state.mtp) {
      for (let k = 1; k <= gpu.maxDrafts && positions[0]! + 1 + k <= state.capacity; k++) {
        const after = [{ rollback: null, catchUp: 1 }, ...Array.from({ length: k + 1 }, (_, a) => cycleAfter(a, k))];
        for (const { rollback, catchUp } of after) {
          const key = this.cycleKey(rollback, catchUp, k);
          if (key !== null) steps.push({ key, drafts: k, encode: (pos0) => (ctx, plan) => this.encodeCycle(ctx, plan, state, key, { pos0, catchUp, drafts: k, rollback }) });
        }
      }
    }
    // The decode row last (the recordings' least recently used go first), and room left for a
    // generation's prompt shapes: with many drafts the largest counts' cycles are left out.
    const room = MAX_RECORDINGS - WARM_ROOM - 1;
    steps.splice(room, steps.length - room);
    steps.push({ key: decodeKey, drafts: 0, encode: (pos0) => (ctx, plan) => this.encodeTrunk(ctx, plan, state, decodeKey, { nb: 1, pos0, verify: false, logits }) });
    const recordings = this.recordingsOf(state);
    const { recorded, replayed } = recordings.counts;
    try {
      // Never committed: the recording and the graphs primed from it are what stay. Recorded at
      // the first position, replayed at the others: each structure's graph primed.
      for (const pos0 of positions) {
        for (const step of steps) {
          if (pos0 + 1 + step.drafts > state.capacity) continue;
          this.encodeAhead(state, step.key, true, step.encode(pos0)).cb.release();
        }
      }
      this.warmReplays(state, steps.map((step) => ({ key: step.key, encode: step.encode(positions[0]!) })), replayRounds);
    } finally {
      recordings.counts.replayed = replayed;
    }
    return recordings.counts.recorded - recorded;
  }

  /**
   * Replays each of `steps` `rounds` times into command buffers released uncommitted (and
   * encodes an MTP catch-up directly as often): host work only, so that the JavaScript engine
   * has optimized the replay code before a generation needs it (warmReplayRounds says what it
   * bought on the H200).
   */
  private warmReplays(state: SequenceState, steps: readonly { key: string; encode: (ctx: EncodeContext, plan: SitePlan) => void }[], rounds: number): void {
    const gpu = this.gpu;
    const catchUpRows = Math.min(gpu.scratch.rows, gpu.maxDrafts + 1);
    const catchUp = gpu.refs.mtp && state.mtp ? (ctx: EncodeContext, plan: SitePlan) => encodeMtpCatchUp(ctx, gpu, state, plan, { pos0: 0 }, catchUpRows) : null;
    for (let r = 0; r < rounds; r++) {
      for (const step of steps) this.encodeAhead(state, step.key, false, step.encode).cb.release();
      if (catchUp) this.encodeAhead(state, "", false, catchUp).cb.release(); // not primed: no recording key
    }
  }

  /** Runs `fn` once every earlier operation has finished (steps never overlap). */
  exclusive<T>(fn: () => Promise<T>): Promise<T> {
    this.queued++;
    const run = this.lock.then(async () => {
      try {
        if (this.closed) throw new Error("the engine is closed");
        return await fn();
      } finally {
        this.queued--;
      }
    });
    this.lock = run.catch(() => {});
    return run;
  }

  /** Operations queued or running under the lock (exclusive): 0 when nothing can touch a sequence's state. */
  private queued = 0;
  /**
   * The state of a disposed sequence, reset, kept for the next newSequence (at most one). A
   * Model's generate() runs each call in a new sequence: each allocated its own state (~6.5 MB
   * on qwen4-exp-tiny, zero-filled; far more at the 30b shape), recorded its steps again (the
   * recordings are the state's), and the last call's state was released only after the next
   * one's was allocated, so consecutive calls alternated between two sets of buffers (and of
   * CUDA graph shapes, whose bindings are addresses). Reused, every call runs on the same state,
   * as a Session after reset() does.
   */
  private spare: SequenceState | null = null;

  /** A new sequence, empty or continuing from a checkpoint of this engine's sequences. */
  newSequence(from?: EngineCheckpoint): EngineSequence {
    if (this.closed) throw new Error("the engine is closed");
    if (from && from.engine !== this) throw new Error("the checkpoint was made by another engine (another model): it resumes only where it was made");
    const state = this.spare ?? new SequenceState(this.gpu.device, this.gpu.config, this.gpu.maxContext);
    this.spare = null;
    state.forgotten = false;
    try {
      if (from) state.restoreImage(from.image);
    } catch (e) {
      this.retire(state);
      throw e;
    }
    const s = new EngineSequence(this, state);
    this.sequences.add(s);
    return s;
  }

  /** Zeroed penalty counts in a device buffer (the sampling kernel reads them). */
  penaltyCounts(): PenaltyCounts {
    const vocab = this.gpu.config.vocab_size;
    const buffer = this.gpu.device.buffer(2 * vocab * 4);
    const counts = new PenaltyCounts(vocab, buffer.i32.subarray(0, 2 * vocab), () => buffer.release());
    this.countBuffers.set(counts, buffer);
    return counts;
  }

  /** The sampling kernel's buffers: rows for a verify batch, a distribution per draft. */
  private samplingScratch(): SamplingScratch {
    const g = this.gpu;
    this.sampling ??= new SamplingScratch(g.device, g.config.vocab_size, 1 + g.maxDrafts, g.maxDrafts);
    return this.sampling;
  }

  private countsBinding(sample: SampleRequest): Buffer | null {
    if (!sample.counts) return null;
    const b = this.countBuffers.get(sample.counts);
    if (!b) throw new Error("sampling: the penalty counts were not made by this engine (use the backend's penaltyCounts())");
    return b;
  }

  private recordingsOf(seq: SequenceState): StepRecordings {
    let r = this.recordings.get(seq);
    if (!r) this.recordings.set(seq, (r = new StepRecordings(this.recordingTotals)));
    return r;
  }

  /** Encodes `step` for `seq` through its recordings (replayed, recorded, or directly when key is null). */
  private encodeTrunk(ctx: EncodeContext, plan: SitePlan, seq: SequenceState, key: string | null, step: TrunkStep): void {
    const gpu = this.gpu;
    this.recordingsOf(seq).encode(ctx, plan, key, step, (ctx, plan, { pos0 }) => encodeTrunkStep(ctx, gpu, seq, { ...step, pos0 }, plan));
  }

  /**
   * What a trunk step's recording depends on besides its sequence (recorded-step.ts), or null
   * when it cannot be recorded: a layer that is not held resident (its site needs the host).
   * A verify batch's snapshot planes are the engine's, the same every time. Called after
   * runStep's residency refresh.
   */
  private recordingKey(nb: number, verify: boolean, logits: RowRange): string | null {
    const g = this.gpu;
    if (!g.resident.allHeld()) return null;
    return `${verify ? "verify" : "rows"}/${nb}/${logits.from}/${logits.count}/${g.layersRun}/${g.lookahead && !g.pool.fullyResident(g.layersRun)}`;
  }

  /**
   * The key of a speculative cycle's recording: the pending rollback's row, the MTP head's
   * catch-up rows and the drafts, and the verify batch's key; null when the verify cannot be
   * recorded or the catch-up is longer than a cycle leaves (after a prompt: a one-off shape).
   */
  private cycleKey(rollbackRow: number | null, catchUp: number, drafts: number): string | null {
    const verify = this.recordingKey(1 + drafts, true, { from: 0, count: 1 + drafts });
    if (verify === null || catchUp > this.gpu.maxDrafts + 1) return null;
    return `cycle/${rollbackRow ?? "-"}/${catchUp}/${drafts}/${verify}`;
  }

  /** Steps recorded and replayed (prepared ahead or not) so far over every sequence, and the prepared steps committed (stats; tests). */
  get recordedSteps(): { recorded: number; replayed: number; preparedUsed: number } {
    return { ...this.recordingTotals, preparedUsed: this.preparedUsed };
  }

  /** Speculative cycles run, those encoded from a recording, and those that committed a prepared command buffer (stats; tests). */
  get speculativeCycles(): { cycles: number; recorded: number; prepared: number } {
    return { ...this.cycleCounts };
  }

  /** Runs the pending rollback now, on its own, unless it is `seq`'s (whose next step encodes it). Lock held, or no step in flight. */
  private settleRollback(except: SequenceState | null = null): void {
    const p = this.pendingRollback;
    if (!p || p.seq === except) return;
    this.pendingRollback = null;
    if (p.seq.disposed) return;
    try {
      runNow(this.gpu.device, (ctx) => this.gpu.snapshots!.encodeRestore(ctx, p.seq, p.row));
    } catch (e) {
      p.seq.reset();
      throw e;
    }
  }

  /** `seq`'s pending rollback row (no longer pending: the caller encodes it), or null. */
  private takeRollback(seq: SequenceState): number | null {
    const p = this.pendingRollback;
    if (!p || p.seq !== seq) return null;
    this.pendingRollback = null;
    return p.row;
  }

  /** @internal Runs `seq`'s pending rollback, if any (a checkpoint or a test reads the state; no step in flight). */
  settle(seq: SequenceState): void {
    if (this.pendingRollback?.seq === seq) this.settleRollback();
  }

  /** Forgets `seq`'s pending rollback (its state is being reset or released). */
  private dropRollback(seq: SequenceState): void {
    if (this.pendingRollback?.seq === seq) this.pendingRollback = null;
  }

  /** A failed step leaves `seq` half-written: forgotten, so the caller can replay its tokens. */
  private resetState(seq: SequenceState): void {
    this.dropRollback(seq);
    seq.reset();
  }

  /**
   * The step prepared for `seq` when one is exactly this one (position, shape, the request its
   * draft draws are for, event value), else null; either way none is held any more.
   */
  private takePrepared(seq: SequenceState, pos0: number, key: string | null, draws?: SampleRequest): PreparedStep | null {
    const list = this.prepared.get(seq);
    if (!list) return null;
    this.prepared.delete(seq);
    let found: PreparedStep | null = null;
    for (const p of list) {
      const same = key !== null && p.pos0 === pos0 && p.key === key && p.draws === draws && p.step.plan.base === this.counter.value;
      if (found === null && same) found = p.step;
      else this.unused.push(p.step.cb);
    }
    return found;
  }

  /** Holds `step` as one of `seq`'s prepared steps. */
  private holdPrepared(seq: SequenceState, entry: PreparedEntry): void {
    let list = this.prepared.get(seq);
    if (!list) this.prepared.set(seq, (list = []));
    list.push(entry);
  }

  /** Releases every step prepared for `seq`. */
  private dropPrepared(seq: SequenceState): void {
    for (const p of this.prepared.get(seq) ?? []) p.step.cb.release();
    this.prepared.delete(seq);
  }

  private releaseUnused(): void {
    for (const cb of this.unused.splice(0)) cb.release();
  }

  /** Encodes `seq`'s decode row at pos0 ahead (uncommitted), when it can be replayed. Never throws: a step it cannot prepare is encoded when it comes. */
  private prepareNext(seq: SequenceState, pos0: number): void {
    const logits = { from: 0, count: 1 };
    const key = this.recordingKey(1, false, logits);
    if (key !== null && StepRecordings.enabled && !seq.disposed) {
      this.dropPrepared(seq);
      this.prepareOne(seq, pos0, key, undefined, (ctx, plan) => this.encodeTrunk(ctx, plan, seq, key, { nb: 1, pos0, verify: false, logits }));
    }
    this.releaseUnused();
  }

  /**
   * After a prompt whose caller drafts next (trunkStep's nextDrafts): the first cycle of k drafts
   * at pos0, and when its MTP catch-up is split (speculateCycle) the catch-up of the rows before
   * pos0 - 1 too, encoded ahead (uncommitted) while the prompt runs, so that neither is encoded
   * while the GPU waits. Never throws: what it cannot prepare is encoded when it comes.
   */
  private prepareFirstCycle(seq: SequenceState, pos0: number, k: number, sample: SampleRequest | undefined): void {
    try {
      const gpu = this.gpu;
      if (!StepRecordings.enabled || seq.disposed || !gpu.refs.mtp || !gpu.snapshots || !seq.mtp || k > gpu.maxDrafts) return;
      this.dropPrepared(seq);
      const behind = pos0 - seq.mtpLength;
      if (behind < 1 || pos0 + 1 + k > seq.capacity) return;
      const split = this.splitsCatchUp(seq, pos0, null, k);
      const catchUp = split ? 1 : behind;
      const key = this.cycleKey(null, catchUp, k);
      if (key === null) return;
      if (split) {
        const from = seq.mtpLength;
        const rows = behind - 1;
        let step: PreparedStep;
        try {
          step = this.encodeAhead(seq, "", false, (ctx, plan) => encodeMtpCatchUp(ctx, gpu, seq, plan, { pos0: from }, rows));
        } catch {
          return;
        }
        this.holdPrepared(seq, { pos0: from, key: catchUpKey(rows), draws: undefined, step });
      }
      this.prepareOne(seq, pos0, key, sample, (ctx, plan) => this.encodeCycle(ctx, plan, seq, key, { pos0, catchUp, drafts: k, rollback: null, draw: this.draftDraw(pos0, sample) }));
    } finally {
      this.releaseUnused();
    }
  }

  /**
   * Whether `seq`'s cycle of k drafts at pos0 runs the long part of its MTP catch-up first, in a
   * command buffer of its own, the cycle keeping a recorded shape (catch-up 1): after a prompt or
   * plain steps, unless CHERENKOV_MTP_CATCHUP_SPLIT=0 or that shape cannot be recorded.
   */
  private splitsCatchUp(seq: SequenceState, pos0: number, rollback: number | null, k: number): boolean {
    return pos0 - seq.mtpLength > this.gpu.maxDrafts + 1 && splitCatchUp() && this.cycleKey(rollback, 1, k) !== null;
  }

  /** The MTP catch-up of rows from .. from + rows - 1 when prepareFirstCycle encoded exactly it (taken out of the prepared list), else null. */
  private takeCatchUp(seq: SequenceState, from: number, rows: number): PreparedStep | null {
    const list = this.prepared.get(seq);
    const i = list?.findIndex((p) => p.key === catchUpKey(rows) && p.pos0 === from && p.step.plan.base === this.counter.value) ?? -1;
    if (i < 0) return null;
    return list!.splice(i, 1)[0]!.step;
  }

  /**
   * After a cycle at pos0 with k drafts is committed: the next cycle of k drafts for the
   * accept counts a it may end with (catch-up a + 1 rows at pos0 + a + 1, the rollback of row
   * a when a < k), each replayed into a command buffer of its own while the GPU runs
   * `running`. The likeliest counts go first (acceptTally), and once `running` is done the
   * rest are left out: replaying all k + 1 (~0.35 ms each on this host) could outlast the
   * GPU's cycle and hold the next one back; a cycle not prepared is encoded when it comes.
   * Under sampling its draft draws are `sample`'s (a generation keeps one request; the
   * verifying draw is added when the cycle comes).
   */
  private prepareCycles(seq: SequenceState, pos0: number, k: number, sample: SampleRequest | undefined, running?: CommandBuffer): void {
    try {
      this.prepareCyclesFor(seq, pos0, k, sample, running);
    } finally {
      this.releaseUnused();
    }
  }

  private prepareCyclesFor(seq: SequenceState, pos0: number, k: number, sample: SampleRequest | undefined, running?: CommandBuffer): void {
    if (!StepRecordings.enabled || seq.disposed) return;
    this.dropPrepared(seq);
    const most = preparedCyclesLimit();
    let held = 0;
    for (const a of this.likelyAccepts(k)) {
      if (held >= most || (held > 0 && running && running.status !== "committed")) return;
      const { rollback, catchUp } = cycleAfter(a, k);
      const key = this.cycleKey(rollback, catchUp, k);
      if (key === null) return;
      const next = pos0 + a + 1;
      if (next + 1 + k > seq.capacity) continue;
      this.prepareOne(seq, next, key, sample, (ctx, plan) =>
        this.encodeCycle(ctx, plan, seq, key, { pos0: next, catchUp, drafts: k, rollback, draw: this.draftDraw(next, sample) }),
      );
      held++;
    }
  }

  /** The accept counts 0..k of a k-draft cycle, the most often seen first (ties: more accepted first). */
  private likelyAccepts(k: number): number[] {
    const tally = this.acceptTally.get(k);
    const order = Array.from({ length: k + 1 }, (_, i) => k - i);
    return tally ? order.sort((x, y) => tally[y]! - tally[x]!) : order;
  }

  /** Counts a k-draft cycle that accepted a drafts. */
  private noteAccepted(k: number, a: number): void {
    let tally = this.acceptTally.get(k);
    if (!tally) this.acceptTally.set(k, (tally = new Array<number>(k + 1).fill(1)));
    tally[a]!++;
  }

  /** Encodes one step ahead into a command buffer of its own and holds it. Never throws. */
  private prepareOne(seq: SequenceState, pos0: number, key: string, draws: SampleRequest | undefined, encode: (ctx: EncodeContext, plan: SitePlan) => void): void {
    let step: PreparedStep;
    try {
      // Under sampling the verifying draw is added at commit: the structure is not final here.
      step = this.encodeAhead(seq, key, draws === undefined, encode);
    } catch {
      return; // past the capacity, say: the step itself will say why if it comes
    }
    this.holdPrepared(seq, { pos0, key, draws, step });
  }

  /**
   * Encodes a step of `seq`'s recording `key` into a command buffer of its own, not committed,
   * and with `prime` has its CUDA graph built in the background (used or not, a step of this
   * key is likely to come). The command buffer is released if encoding throws.
   */
  private encodeAhead(seq: SequenceState, key: string, prime: boolean, encode: (ctx: EncodeContext, plan: SitePlan) => void): PreparedStep {
    const gpu = this.gpu;
    const cb = gpu.device.commandBuffer();
    const plan = new SitePlan(gpu.event, this.counter.value);
    try {
      encode({ device: gpu.device, cb }, plan);
      if (prime) cb.hint(this.recordingsOf(seq).shapeKey(key), true);
    } catch (e) {
      cb.release();
      throw e;
    }
    return { cb, plan };
  }

  /** @internal Resets `seq`'s state (lock held): a pending rollback of it is dropped. */
  resetSequence(seq: SequenceState): void {
    this.resetState(seq);
  }

  /** @internal */
  forget(s: EngineSequence): void {
    this.sequences.delete(s);
    this.dropRollback(s.state);
    s.state.forgotten = true;
    this.dropPrepared(s.state);
    this.releaseUnused();
  }

  /**
   * @internal The state of a forgotten sequence: reset and kept as the spare (or released when
   * there is one already, or the engine is closed). At once when no operation is queued or
   * running (none of its steps can be in flight or waiting), else at the lock's next turn.
   */
  retire(state: SequenceState): void {
    state.forgotten = true;
    const keep = () => {
      if (this.logitsHeld?.seq === state) this.logitsHeld = null;
      if (this.closed || this.spare !== null) return state.dispose();
      try {
        state.reset();
      } catch {
        return state.dispose();
      }
      this.spare = state;
    };
    if (this.queued === 0) keep();
    else void this.exclusive(async () => keep()).catch(() => state.dispose());
  }

  /**
   * @internal Runs one trunk step of `tokens` for `seq` (lock held by the caller), with the
   * logits and argmax of the rows `logits` names only: next[i] and margins[i] are row
   * logits.from + i's. With `sample`, the sampling kernel draws from those logits on the
   * device: the last row's token. A rollback still pending for `seq` runs first, in the same
   * command buffer.
   */
  async trunkStep(seq: SequenceState, tokens: number[], verify: boolean, logits: RowRange, sample?: SampleRequest, nextDrafts = 0): Promise<RowsResult> {
    this.settleRollback(seq);
    const pos0 = seq.length;
    const nb = tokens.length;
    seq.checkRoom(nb);
    seq.writeTokens(pos0, tokens);
    // The key needs the residency as this step will see it (runStep refreshes it too: a no-op then).
    this.gpu.resident.refresh();
    const key = this.recordingKey(nb, verify, logits);
    const prepared = this.takePrepared(seq, pos0, key);
    if (prepared) this.preparedUsed++;
    // A prepared command buffer holds the step already: the rollback goes ahead on its own.
    if (prepared) this.settleRollback();
    const rollback = this.takeRollback(seq);
    return this.runTrunk(seq, {
      nb,
      logits,
      sample,
      verifyDrafts: 0,
      trace: tokens,
      prepared,
      // A recordable step is most likely followed by a decode row of the same sequence, or by
      // the cycle its caller announced.
      afterCommit: key !== null && !verify ? () => (nextDrafts > 0 ? this.prepareFirstCycle(seq, pos0 + nb, nextDrafts, sample) : this.prepareNext(seq, pos0 + nb)) : undefined,
      encode: (ctx, plan) => {
        if (rollback !== null) this.gpu.snapshots!.encodeRestore(ctx, seq, rollback);
        this.encodeTrunk(ctx, plan, seq, key, { nb, pos0, verify, logits });
      },
    });
  }

  /**
   * A trunk step of `o.nb` rows at seq.length whose tokens are in the token buffer (or put
   * there by the step itself), encoded by `o.encode` (unless prepared), then its sampling; the
   * results read back and checked. Lock held.
   */
  private async runTrunk(
    seq: SequenceState,
    o: {
      nb: number;
      logits: RowRange;
      sample: SampleRequest | undefined;
      /** Sampling: rows 0..verifyDrafts-1 verify the drafts in the token buffer (rejection sampling). */
      verifyDrafts: number;
      /** The step's tokens, for the routing trace (complete once `known` ran). */
      trace: readonly number[];
      /** Runs once the step completed, before the results are read (the cycle reads its drafts). */
      known?: () => void;
      prepared: PreparedStep | null;
      /** Runs once the step is committed, while the GPU works (prepares the next step). Must not throw. */
      afterCommit: ((running: CommandBuffer) => void) | undefined;
      encode: (ctx: EncodeContext, plan: SitePlan) => void;
    },
  ): Promise<RowsResult & { accepted?: number[] }> {
    const gpu = this.gpu;
    const pos0 = seq.length;
    const { nb, logits, sample, verifyDrafts, prepared } = o;
    const recorder = this.trace ? new RouteRecorder(o.trace, gpu.config.num_layers, gpu.config.moe.top_k) : null;
    const sampler = sample ? this.samplingScratch() : null;
    const sampleRows = verifyDrafts > 0 ? nb : 1;
    if (sampler && verifyDrafts > 0 && (nb > LOGIT_ROWS || verifyDrafts !== nb - 1)) throw new Error(`verify step: ${nb} rows for ${verifyDrafts} drafts`);
    const endsStep = logits.count > 0 && logits.from + logits.count === nb;
    if (sampler && (!endsStep || logits.count < sampleRows)) throw new Error(`step of ${nb} rows: sampling ${sampleRows} rows needs their logits (asked for rows ${logits.from}..${logits.from + logits.count - 1})`);
    // The last LOGIT_ROWS block of the step's logits stays in the logits scratch.
    const block = logits.count > 0 ? Math.floor((logits.count - 1) / LOGIT_ROWS) * LOGIT_ROWS : 0;
    await this.guarded(seq, () =>
      runStep(
        gpu,
        this.counter,
        (ctx, plan) => {
          if (!prepared) o.encode(ctx, plan);
          if (!sample || !sampler) return;
          const first = nb - sampleRows;
          encodeSample(ctx, rowAt(gpu.scratch.head.logits, first - logits.from - block), sampler, {
            params: sample.params,
            seed: sample.seed,
            rows: sampleRows,
            position: pos0 + first + 1,
            draw: Draw.sample,
            counts: this.countsBinding(sample),
            extras: verifyDrafts > 0 ? bind(seq.tokens, (pos0 + 1) * 4) : null,
            extrasBase: 0,
            verify: verifyDrafts > 0 ? { rows: verifyDrafts, drafts: bind(seq.tokens, (pos0 + 1) * 4) } : null,
            qRow: null,
            topLogprobs: sample.logprobs,
          });
        },
        recorder?.observe,
        { prepared, afterCommit: o.afterCommit },
      ),
    );
    seq.length = pos0 + nb;
    o.known?.();
    this.logitsHeld = endsStep ? { seq, length: seq.length, row: logits.count - 1 - block } : null;
    if (recorder) this.trace!.write(recorder.step());
    const s = gpu.scratch.head;
    const out: RowsResult & { accepted?: number[] } = { next: Array.from(i32View(s.next, logits.count)), margins: Array.from(f32View(s.margins, logits.count)) };
    // The argmax of NaN logits is a silent id 0: a non-finite margin means the logits are not finite.
    const bad = out.margins.findIndex((m) => !Number.isFinite(m));
    if (bad >= 0) {
      this.resetState(seq);
      throw new NonFiniteError(
        `the output logits: non-finite values at row ${logits.from + bad} (margin ${out.margins[bad]}): the weights or activations of the output head or the last layer (${gpu.config.num_layers - 1}) are NaN or infinite`,
        null,
      );
    }
    if (sampler && sample) {
      const drawn = Array.from(sampler.ids.i32.subarray(0, sampleRows));
      out.next.splice(logits.count - sampleRows, sampleRows, ...drawn);
      if (verifyDrafts > 0) out.accepted = Array.from(sampler.accepted.i32.subarray(0, verifyDrafts));
      if (sample.logprobs !== null) out.logprobs = drawn.map((_, r) => sampler.logprobs(r, sample.logprobs!));
    }
    return out;
  }

  /**
   * @internal One speculative cycle for `seq` after `next` (lock held), in one command buffer
   * (docs/engine.md "The speculative cycle"): the rollback the last cycle left pending, the MTP
   * head's catch-up and `drafts` chained drafts (copied into the token buffer on the GPU), the
   * verify batch [next, ...drafts] with its snapshot planes, and with `sample` the verifying
   * draw (rejection sampling; draft j is drawn with Draw.draft at position length + 1 + j).
   * Recorded and replayed as one tape, keyed by (rollback row, catch-up rows, drafts). The
   * accepted drafts and the bonus token come back; a partial accept cuts the lengths now and
   * leaves its rollback pending.
   */
  async speculateCycle(seq: SequenceState, next: number, drafts: number, sample?: SampleRequest): Promise<SpeculativeResult> {
    const gpu = this.gpu;
    const snaps = gpu.snapshots;
    if (!snaps || !gpu.refs.mtp) throw new Error("this model has no MTP head: speculative decoding is unavailable");
    this.settleRollback(seq);
    const pos0 = seq.length;
    const k = drafts;
    const nb = 1 + k;
    seq.checkRoom(nb);
    if (pos0 - seq.mtpLength < 1) throw new Error(`drafts: no trunk rows to draft from (trunk length ${pos0}, MTP length ${seq.mtpLength})`);
    seq.writeTokens(pos0, [next]); // the drafts follow it, written by the GPU
    gpu.resident.refresh();
    const rollback = this.pendingRollback?.seq === seq ? this.pendingRollback.row : null;
    // After a prompt or plain steps the catch-up is longer than any cycle's: its rows but the
    // newest run first, so the cycle keeps a recorded shape (catch-up 1).
    // Prepared with the prompt (prepareFirstCycle), it is committed and not waited for: the
    // cycle's command buffer runs after it, and its status is checked once the cycle is done.
    let catchUpAhead: PreparedStep | null = null;
    if (this.splitsCatchUp(seq, pos0, rollback, k)) {
      catchUpAhead = this.takeCatchUp(seq, seq.mtpLength, pos0 - 1 - seq.mtpLength);
      if (catchUpAhead) {
        try {
          catchUpAhead.cb.commit();
        } catch (e) {
          catchUpAhead.cb.release();
          throw e;
        }
        seq.mtpLength = pos0 - 1;
      } else await this.catchUpMtp(seq, pos0 - 1);
    }
    let result: SpeculativeResult;
    try {
      result = await this.cycleAfterCatchUp(seq, pos0, next, k, rollback, sample);
    } catch (e) {
      // The cycle's failure is the one to report; the state is reset as a failed step's is
      // (also when it failed before its step ran: the MTP length counts the catch-up as done).
      catchUpAhead?.cb.release();
      if (catchUpAhead) this.resetState(seq);
      throw e;
    }
    if (catchUpAhead) this.settleCatchUp(seq, catchUpAhead.cb);
    return result;
  }

  /**
   * A catch-up committed ahead of its cycle: done by now (the cycle after it in the stream is),
   * released; a failure resets the sequence's state and throws.
   */
  private settleCatchUp(seq: SequenceState, cb: CommandBuffer): void {
    try {
      cb.waitUntilCompleted(60_000);
    } catch (e) {
      this.resetState(seq);
      throw new GpuStepError(`the MTP head's catch-up of the prompt: ${e instanceof Error ? e.message : String(e)}`);
    } finally {
      cb.release();
    }
  }

  /** speculateCycle's cycle, the long part of its catch-up done. */
  private async cycleAfterCatchUp(seq: SequenceState, pos0: number, next: number, k: number, rollback: number | null, sample: SampleRequest | undefined): Promise<SpeculativeResult> {
    const gpu = this.gpu;
    const nb = 1 + k;
    const catchUp = pos0 - seq.mtpLength;
    const key = this.cycleKey(rollback, catchUp, k);
    // The cycle was most likely prepared while the last one ran (its rollback in it).
    const prepared = this.takePrepared(seq, pos0, key, sample);
    this.takeRollback(seq);
    const logits = { from: 0, count: nb };
    const s = gpu.scratch;
    const draw = this.draftDraw(pos0, sample);
    const trace = [next, ...new Array<number>(k).fill(-1)];
    let ds: number[] = [];
    let fromTape = prepared !== null;
    const r = await this.runTrunk(seq, {
      nb,
      logits,
      sample,
      verifyDrafts: sample ? k : 0,
      trace,
      prepared,
      // The next cycle, for each accept count this one may end with.
      afterCommit: (running) => this.prepareCycles(seq, pos0, k, sample, running),
      known: () => {
        ds = Array.from(i32View(s.mtp.drafts, k));
        trace.splice(1, k, ...ds);
      },
      encode: (ctx, plan) => {
        fromTape = this.encodeCycle(ctx, plan, seq, key, { pos0, catchUp, drafts: k, rollback, draw });
      },
    });
    seq.mtpLength = pos0;
    this.cycleCounts.cycles++;
    if (fromTape) this.cycleCounts.recorded++;
    if (prepared) this.cycleCounts.prepared++;
    let a = 0;
    // Sampling: the kernel verified each draft (rejection sampling); greedy: equal to the argmax.
    if (r.accepted) while (a < k && r.accepted[a] === 1) a++;
    else while (a < k && r.next[a] === ds[a]) a++;
    this.noteAccepted(k, a);
    if (a < k) {
      // The caches roll back by length now; the fixed-size state at the next step (or before anything else).
      seq.length = pos0 + a + 1;
      this.pendingRollback = { seq, row: a };
      gpu.activity.noteRolledBack(k - a);
    }
    const accepted = [...ds.slice(0, a), r.next[a]!];
    return { next: accepted, margins: r.margins.slice(0, a + 1), proposed: k, ...(r.logprobs ? { logprobs: r.logprobs.slice(0, a + 1) } : {}) };
  }

  /**
   * Runs the MTP head over `seq`'s trunk rows mtpLength .. upTo - 1 (K/V only, no draft) as a
   * step of its own, encoded directly: the one-off part of a long catch-up (a cycle encoded
   * with it would be a one-off shape, encoded and launched directly whole: on the H200's 30b
   * shape such a cycle took ~3 plain steps). Lock held.
   */
  private async catchUpMtp(seq: SequenceState, upTo: number): Promise<void> {
    const rows = upTo - seq.mtpLength;
    if (rows < 1) return;
    const gpu = this.gpu;
    const pos0 = seq.mtpLength;
    await this.guarded(seq, () => runStep(gpu, this.counter, (ctx, plan) => encodeMtpCatchUp(ctx, gpu, seq, plan, { pos0 }, rows)));
    seq.mtpLength = upTo;
  }

  /** Under sampling, the draw of draft j of a cycle at pos0 (Draw.draft at position pos0 + 1 + j) over its MTP logits row. */
  private draftDraw(pos0: number, sample: SampleRequest | undefined): StepVars["draw"] {
    if (!sample) return undefined;
    const sampler = this.samplingScratch();
    const s = this.gpu.scratch;
    const counts = this.countsBinding(sample);
    return (ctx: EncodeContext, j: number) =>
      encodeSample(ctx, rowAt(s.head.logits, 0), sampler, {
        params: sample.params,
        seed: sample.seed,
        rows: 1,
        position: pos0 + 1 + j,
        draw: Draw.draft,
        counts,
        extras: bind(s.mtp.drafts.buffer, s.mtp.drafts.offset),
        extrasBase: j,
        verify: null,
        qRow: j,
        topLogprobs: null,
        ids: bind(s.mtp.drafts.buffer, s.mtp.drafts.offset + 4 * j),
      });
  }

  /**
   * Encodes a speculative cycle's trunk and MTP work through `seq`'s recordings (its sampling
   * is the caller's): the pending rollback of row `rollback`, the catch-up of `catchUp` MTP
   * rows before pos0 and the chained drafts (drafts copied after the token at pos0), the verify
   * batch of 1 + drafts rows at pos0. Returns whether it came from a tape.
   */
  private encodeCycle(
    ctx: EncodeContext,
    plan: SitePlan,
    seq: SequenceState,
    key: string | null,
    c: { pos0: number; catchUp: number; drafts: number; rollback: number | null; draw?: StepVars["draw"] },
  ): boolean {
    const gpu = this.gpu;
    const { catchUp, drafts, rollback } = c;
    const logits = { from: 0, count: 1 + drafts };
    const vars: StepVars = { pos0: c.pos0, ...(c.draw ? { draw: c.draw } : {}) };
    return this.recordingsOf(seq).encode(ctx, plan, key, vars, (ctx, plan, vars) => {
      if (rollback !== null) gpu.snapshots!.encodeRestore(ctx, seq, rollback);
      // The MTP positions lie `catchUp` rows before the verify's.
      shiftedLive(ctx, -catchUp, () => encodeDrafts(ctx, gpu, seq, plan, { ...vars, pos0: vars.pos0 - catchUp }, { rows: catchUp, drafts }));
      encodeTrunkStep(ctx, gpu, seq, { nb: 1 + drafts, pos0: vars.pos0, verify: true, logits }, plan);
    });
  }

  /**
   * @internal Draws the token after `seq`'s last row from the logits scratch when it still
   * holds that row (no other step since), else null. Lock held.
   */
  resampleLast(seq: SequenceState, sample: SampleRequest): { next: number; logprobs?: { logprob: number; top: { id: number; logprob: number }[] } } | null {
    const held = this.logitsHeld;
    if (!held || held.seq !== seq || held.length !== seq.length || seq.length === 0) return null;
    const sampler = this.samplingScratch();
    runNow(this.gpu.device, (ctx) =>
      encodeSample(ctx, rowAt(this.gpu.scratch.head.logits, held.row), sampler, {
        params: sample.params,
        seed: sample.seed,
        rows: 1,
        position: seq.length,
        draw: Draw.sample,
        counts: this.countsBinding(sample),
        extras: null,
        extrasBase: 0,
        verify: null,
        qRow: null,
        topLogprobs: sample.logprobs,
      }),
    );
    const next = sampler.ids.i32[0]!;
    return { next, ...(sample.logprobs !== null ? { logprobs: sampler.logprobs(0, sample.logprobs) } : {}) };
  }

  /** A failed step leaves the sequence's state half-written: reset it so the caller can replay. */
  private async guarded<T>(seq: SequenceState, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      this.resetState(seq);
      throw e;
    }
  }

  stats(): LoadedEngineStats {
    const g = this.gpu;
    return {
      ...g.stats.stats(),
      handshake: g.handshakes.summary(),
      resident: g.resident.stats(),
      setup: {
        device: g.device.name,
        rows: g.rows,
        prefillRows: g.prefillRows,
        maxDrafts: g.maxDrafts,
        maxContext: g.maxContext,
        layersRun: g.layersRun,
        lookahead: g.lookahead,
        notes: g.notes,
        sequences: this.sequences.size,
        trace: this.trace ? { path: this.trace.path, steps: this.trace.steps } : null,
      },
    };
  }

  /** Zeroes the phase timings and handshake histograms (benchmarks measure one phase of a run). */
  resetTimings(): void {
    this.gpu.stats.phases.reset();
    this.gpu.handshakes.reset();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.lock;
    this.closed = true;
    this.pendingRollback = null;
    for (const list of this.prepared.values()) for (const p of list) p.step.cb.release();
    this.prepared.clear();
    this.releaseUnused();
    for (const s of this.sequences) s.releaseNow();
    this.sequences.clear();
    this.spare?.dispose();
    this.spare = null;
    this.trace?.close();
    this.sampling?.release();
    await this.gpu.close();
  }
}

/** A host copy of an engine sequence's used state (BackendCheckpoint). */
export class EngineCheckpoint {
  constructor(
    /** @internal */ readonly engine: Engine,
    /** @internal */ readonly image: StateImage,
  ) {}
  get length(): number {
    return this.image.length;
  }
  get bytes(): number {
    return this.image.bytes;
  }
}

/** A sequence on the engine (the Backend's BackendSequence). */
export class EngineSequence {
  private disposed = false;
  /** Operations of this sequence in flight (a checkpoint must not copy half-written state). */
  private running = 0;

  constructor(
    private readonly engine: Engine,
    readonly state: SequenceState,
  ) {}

  get length(): number {
    return this.state.length;
  }

  private check(): void {
    if (this.disposed) throw new Error("the sequence is disposed");
  }

  async forward(tokens: number[], opts: ForwardOptions = {}): Promise<ForwardResult> {
    this.check();
    const g = this.engine.gpu;
    checkTokens(tokens, g.config.vocab_size, "token");
    if (tokens.length === 0) throw new Error("forward: no tokens");
    this.state.checkRoom(tokens.length);
    const { sample, signal } = opts;
    const logits = forwardRange(opts, tokens.length);
    // Only the last chunk's last row is sampled.
    let done = 0;
    const step = (chunk: number[], rows: RowRange) => {
      done += chunk.length;
      const last = done === tokens.length;
      return this.engine.exclusive(() => this.engine.trunkStep(this.state, chunk, false, rows, last ? sample : undefined, last ? (opts.nextDrafts ?? 0) : 0));
    };
    return this.track(runChunked(tokens, g.prefillRows, logits, step, signal));
  }

  private async track<T>(op: Promise<T>): Promise<T> {
    this.running++;
    try {
      return await op;
    } finally {
      this.running--;
    }
  }

  async resample(sample: SampleRequest): Promise<{ next: number; logprobs?: { logprob: number; top: { id: number; logprob: number }[] } } | null> {
    this.check();
    return this.track(this.engine.exclusive(async () => this.engine.resampleLast(this.state, sample)));
  }

  /** A host copy of the used state (between operations: none of this sequence may be in flight). */
  checkpoint(): EngineCheckpoint {
    this.check();
    if (this.running > 0) throw new Error("checkpoint: a step of this sequence is in flight (await it first)");
    this.settle();
    return new EngineCheckpoint(this.engine, this.state.capture());
  }

  /**
   * @internal Runs a rollback the last speculative cycle left pending (it waits for the next
   * step otherwise): for a reader of the device state itself. None of this sequence's steps may be in flight.
   */
  settle(): void {
    this.check();
    this.engine.settle(this.state);
  }

  /**
   * Drafts up to `drafts` tokens with the MTP head after `next`, verifies [next, ...drafts] as
   * one row batch and rolls back to the last accepted row: the same tokens as greedy decoding.
   * One command buffer (Engine.speculateCycle).
   */
  async speculate(next: number, drafts: number, signal?: AbortSignal, sample?: SampleRequest): Promise<SpeculativeResult> {
    this.check();
    throwIfAborted(signal);
    const g = this.engine.gpu;
    if (!g.snapshots || g.maxDrafts === 0) throw new Error("this model has no MTP head: speculative decoding is unavailable");
    checkTokens([next], g.config.vocab_size, "token");
    if (this.state.length === 0) throw new Error("speculate: the sequence is empty (run a prompt first)");
    const k = Math.min(drafts, g.maxDrafts);
    if (k < 1) {
      const r = await this.forward([next], { signal, sample });
      return { next: r.next, margins: r.margins, ...(r.logprobs ? { logprobs: r.logprobs } : {}), proposed: 0 };
    }
    this.state.checkRoom(1 + k);
    return this.track(this.engine.exclusive(() => this.engine.speculateCycle(this.state, next, k, sample)));
  }

  reset(): void {
    this.check();
    // Behind any step in flight for this sequence (nothing to do once the engine is closed).
    void this.engine.exclusive(async () => this.engine.resetSequence(this.state)).catch(() => {});
    this.state.length = 0;
    this.state.mtpLength = 0;
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.engine.forget(this);
    this.engine.retire(this.state);
  }

  /** @internal Frees the state now (the engine is closing, nothing is in flight). */
  releaseNow(): void {
    this.disposed = true;
    this.state.dispose();
  }
}

/**
 * The most next cycles prepared while one runs (CHERENKOV_PREPARED_CYCLES=N, read at each
 * cycle; default: every accept count, k + 1): each replay is host time (~0.25-0.35 ms a cycle
 * on the H200's host), and one that ends after the GPU is done holds the next commit back
 * (bench:decode's prepare-overran count says whether it does). 0 prepares none.
 */
export function preparedCyclesLimit(env: string | undefined = process.env.CHERENKOV_PREPARED_CYCLES): number {
  return countFromEnv("CHERENKOV_PREPARED_CYCLES", env, "cycles") ?? Infinity;
}

/** The count environment variable `name` holds (`env`, its value): undefined when unset or empty, refused by name unless an integer >= 0. */
function countFromEnv(name: string, env: string | undefined, what: string): number | undefined {
  if (env === undefined || env === "") return undefined;
  const n = Number(env);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name}: "${env}" is not a count of ${what} (an integer >= 0)`);
  return n;
}

/** The cycle after a k-draft cycle that accepted a drafts: the rollback of row a it left (none when all were accepted), a catch-up of a + 1 rows. */
function cycleAfter(a: number, k: number): { rollback: number | null; catchUp: number } {
  return { rollback: a < k ? a : null, catchUp: a + 1 };
}

/**
 * Rounds of Engine.warmReplays at load: CHERENKOV_WARM_REPLAYS, else 48 on a GPU backend and
 * none on the CPU backend, whose steps take ~100x the host's replay time. On the H200 (tiny
 * model, a fresh engine's first 64 tokens, two runs each of 2 and 3 drafts) a cycle's prepare
 * took 0.51 ms on average without, 0.49 after 16 rounds, 0.34 after 48; the load (~0.8 s
 * there, CUDA's start) did not measurably grow.
 */
export function warmReplayRounds(backend: string, env: string | undefined = process.env.CHERENKOV_WARM_REPLAYS): number {
  return countFromEnv("CHERENKOV_WARM_REPLAYS", env, "rounds") ?? (backend === "cpu" ? 0 : 48);
}

/** A step Engine.warmSteps records: its recording's key, its drafts (0: the decode row), its encode at a position. */
interface WarmStep {
  readonly key: string;
  readonly drafts: number;
  readonly encode: (pos0: number) => (ctx: EncodeContext, plan: SitePlan) => void;
}

/**
 * The positions Engine.warmSteps encodes its steps at, one per command-buffer structure a
 * step's attention may take (attentionBreakpoints): first past every catch-up's rows (the MTP
 * rows lie catch-up rows before pos0), then past each breakpoint by as much, within the
 * capacity. With the first alone, a 30b decode row after a prompt of more than 64 tokens, or a
 * tiny-model generation past QSA's topk, had no graph primed for its structure: launched
 * directly until one was built.
 */
export function warmPositions(gpu: Pick<EngineGpu, "maxDrafts" | "config">, capacity: number): number[] {
  const base = gpu.maxDrafts + 1;
  const past = attentionBreakpoints(gpu.config.attention.qsa?.topk ?? null)
    .map((b) => b + base).filter((p) => p + 1 + gpu.maxDrafts <= capacity);
  return [...new Set([base, ...past])].sort((a, b) => a - b);
}

/** Recordings Engine.warmSteps leaves to a generation's prompt shapes. */
const WARM_ROOM = 8;

/** A prepared MTP catch-up's key in the prepared list (never a recording's). */
function catchUpKey(rows: number): string {
  return `mtp-catch-up/${rows}`;
}

/** CHERENKOV_MTP_CATCHUP_SPLIT=0: a cycle after plain steps catches the MTP head up inside itself (a one-off shape, as before). */
function splitCatchUp(): boolean {
  return envOnOff("CHERENKOV_MTP_CATCHUP_SPLIT", true);
}
