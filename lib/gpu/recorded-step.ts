// Recorded steps (issue 18, item 4). Encoding a decode step in TypeScript costs ~2 ms on the
// H200's host for ~900 dispatches, while the GPU needs ~7 ms: the GPU waited for it every token.
// A step whose dispatches are the same from token to token is recorded once on a tape
// (tape.ts) and replayed: its words go to the shim in one ck_encode_tape call, and only the
// dispatches that depend on the position (`live` in dispatch.ts: embedding, RoPE, KV append,
// attention, the PLE gather, the final read into the sequence's hidden rows) are encoded again.
//
// What a recording may assume, and how each holds:
// - Every buffer, weight and scratch region it binds is the same: the recordings belong to one
//   sequence of one engine (a released buffer voids it: Tape.releasedBuffer).
// - The step's shape: the key (rows, layers run, the lookahead) chosen by the caller.
// - No host handshake: the step is recorded only when every expert layer is held resident
//   (SitePlan.encode refuses a handshake on a tape; the step is then encoded directly), and its
//   sites (their router outputs' regions) are the recording's (SitePlan.adopt).
// - Every position-dependent value is encoded inside `live`: CHERENKOV_CHECK_RECORDING=1 (the
//   tests set `StepRecordings.check`) encodes each replayed step afresh too and fails on the first
//   word that differs, naming the kernel.
import type { EncodeContext } from "./dispatch.ts";
import { NotRecordable, SitePlan, type PlannedSite } from "./handshake.ts";
import { Tape, type StepVars } from "./tape.ts";

/** Encodes a step for `vars` (the position-dependent parts inside `live`). */
export type StepEncode = (ctx: EncodeContext, plan: SitePlan, vars: StepVars) => void;

interface Recording {
  readonly tape: Tape;
  readonly sites: readonly PlannedSite[];
  readonly routeBytes: number;
}

/**
 * Recordings a sequence keeps (the least recently used goes first): a decode row, the prompt
 * chunks', and a speculative run's cycles: for each draft count k, one per (pending rollback
 * row, catch-up rows) and one after plain steps, k + 2 of them (engine.ts cycleKey; all made at
 * load by Engine.warmSteps: 13 with the decode row for drafts "auto" over 1..3), which a
 * generation's prompt shapes must not push out.
 */
export const MAX_RECORDINGS = 32;

/** Distinguishes the shape keys of different sequences' recordings (they bind different buffers). */
let nextSalt = 1;

/** FNV-1a of `text` to a nonzero 32-bit number. */
function hash32(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return h >>> 0 || 1;
}

export class StepRecordings {
  /** Compare every replay with a fresh encode (tests; CHERENKOV_CHECK_RECORDING=1). */
  static check = process.env.CHERENKOV_CHECK_RECORDING === "1";
  /** CHERENKOV_RECORDED_STEPS=0 encodes every step directly. */
  static enabled = process.env.CHERENKOV_RECORDED_STEPS !== "0";

  readonly #byKey = new Map<string, Recording>();
  readonly #salt = nextSalt++;

  constructor(
    /** Steps recorded and replayed so far (shared by the recordings of an engine's sequences). */
    readonly counts: { recorded: number; replayed: number } = { recorded: 0, replayed: 0 },
  ) {}

  /**
   * Encodes the step into ctx.cb: replayed when a recording of `key` exists, else recorded
   * (when it can be) and encoded from the tape. key null: encoded directly. Returns whether
   * the step came from a tape (replayed or just recorded).
   */
  encode(ctx: EncodeContext, plan: SitePlan, key: string | null, vars: StepVars, encode: StepEncode): boolean {
    if (key === null || !StepRecordings.enabled || ctx.tape || plan.handshakeAll) {
      encode(ctx, plan, vars);
      return false;
    }
    const known = this.#byKey.get(key);
    this.#byKey.delete(key); // re-inserted below: the map's order is the order of last use
    if (known && known.tape.releasedBuffer() === null) {
      this.#byKey.set(key, known);
      this.#replay(ctx, plan, known, vars, encode);
      ctx.cb.hint(this.shapeKey(key), false);
      return true;
    }
    const tape = new Tape();
    try {
      encode({ device: ctx.device, cb: ctx.cb, tape }, plan, vars);
    } catch (e) {
      if (!(e instanceof NotRecordable)) throw e;
      plan.reset();
      encode(ctx, plan, vars);
      return false;
    }
    ctx.cb.encodeTape(tape.words, tape.commands);
    ctx.cb.hint(this.shapeKey(key), false);
    this.#byKey.set(key, { tape, sites: plan.sites.slice(), routeBytes: plan.routeBytes });
    // A tape is ~100 KB on the 30b shape; prompts of many lengths must not pile them up.
    if (this.#byKey.size > MAX_RECORDINGS) this.#byKey.delete(this.#byKey.keys().next().value!);
    this.counts.recorded++;
    return true;
  }

  /**
   * The shape key (CommandBuffer.hint) of this sequence's recording `key`: command buffers
   * encoded from it share a replayed structure (a CUDA graph), apart from other keys' (another
   * accept count's cycle has the same kernels with other grids and bindings).
   */
  shapeKey(key: string): number {
    return hash32(`${this.#salt}/${key}`);
  }

  /** The keys held, least recently used first (tests). */
  keys(): string[] {
    return [...this.#byKey.keys()];
  }

  #replay(ctx: EncodeContext, plan: SitePlan, rec: Recording, vars: StepVars, encode: StepEncode): void {
    plan.adopt(rec.sites, rec.routeBytes);
    this.counts.replayed++;
    if (!StepRecordings.check) {
      replay(ctx, rec.tape, vars);
      return;
    }
    const replayed = new Tape();
    replay({ device: ctx.device, cb: ctx.cb, tape: replayed }, rec.tape, vars);
    const fresh = new Tape();
    const freshPlan = new SitePlan(plan.event, plan.base, plan.handshakeAll);
    encode({ device: ctx.device, cb: ctx.cb, tape: fresh }, freshPlan, vars);
    const at = fresh.firstDifference(replayed);
    if (at >= 0) {
      const { index } = fresh.commandAt(at);
      throw new Error(
        `recorded step at position ${vars.pos0}: command ${index} (${fresh.kernelName(index) ?? "past the end"}) differs from a fresh encode at word ${at} ` +
          `(replay: ${replayed.commands} commands, fresh: ${fresh.commands}): a position-dependent dispatch is outside live()`,
      );
    }
    const sitesDiffer = freshPlan.sites.length !== rec.sites.length || freshPlan.sites.some((s, i) => !sameSite(s, rec.sites[i]!));
    if (sitesDiffer) throw new Error(`recorded step at position ${vars.pos0}: its MoE sites differ from a fresh encode's`);
    ctx.cb.encodeTape(replayed.words, replayed.commands);
  }
}

/** Encodes `tape` for `vars` into ctx: its fixed ranges as recorded, its live ranges again. */
function replay(ctx: EncodeContext, tape: Tape, vars: StepVars): void {
  let at = 0;
  let command = 0;
  for (const r of tape.live) {
    emit(ctx, tape, at, r.start, r.firstCommand - command);
    r.encode(ctx, vars);
    at = r.end;
    command = r.endCommand;
  }
  emit(ctx, tape, at, tape.length, tape.commands - command);
}

function emit(ctx: EncodeContext, tape: Tape, from: number, to: number, commands: number): void {
  if (to <= from) return;
  if (ctx.tape) ctx.tape.append(tape, from, to, commands);
  else ctx.cb.encodeTape(tape.words.subarray(from, to), commands);
}

function sameSite(a: PlannedSite, b: PlannedSite): boolean {
  const r = a.route, q = b.route;
  return (
    a.layer === b.layer &&
    a.rows === b.rows &&
    a.trunkLayer === b.trunkLayer &&
    a.handshake === b.handshake &&
    r.resident === q.resident &&
    r.ids.buffer === q.ids.buffer &&
    r.ids.offset === q.ids.offset &&
    r.weights.offset === q.weights.offset
  );
}
