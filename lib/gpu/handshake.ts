// The GPU/host handshake of a step (DESIGN.md "One command buffer per step"). Every MoE site
// of a command buffer that the host serves gets two event values: the GPU signals the first
// after the site's router and waits for the second, which the host sets once the slot table
// is published. A site of a resident layer (resident.ts) gets none: its experts read the
// layer's own table and the host reads its routing after the step. Values increase
// monotonically across steps (one event per engine); the host only ever sets a site's
// release value after seeing its signal, so the event never goes backwards.
import type { Binding, CommandBuffer, Event } from "../shim.ts";
import { bind, type EncodeContext, type RowsRef } from "./dispatch.ts";
import type { ResidentLayers } from "./resident.ts";
import type { Scratch } from "./scratch.ts";

/** A handshake point: the MoE site of one expert layer over `rows` rows. */
export interface SiteInfo {
  /** Expert layer (trunk layer l, or num_layers for the MTP head). */
  layer: number;
  rows: number;
  /** The expert layer whose predicted ids the GPU left in scratch.la.ids (lookahead), or null. */
  predicts: number | null;
  /** Trunk layer index for routing traces; null for the MTP head. */
  trunkLayer: number | null;
}

/** Where a site's router writes and which slot table its experts read. */
export interface SiteRoute {
  /** The site's router outputs ([rows][k] ids and weights). */
  ids: RowsRef;
  weights: RowsRef;
  /** The held layer's own table (resident), or the shared one the host writes at the handshake. */
  slotTable: Binding;
  /** No handshake: the layer is held resident (its table cannot go stale within the step). */
  resident: boolean;
}

/** A site of the command buffer, as recorded. */
export interface PlannedSite extends SiteInfo {
  route: SiteRoute;
  /** Index among the handshake sites (their event values), or -1 for a resident site. */
  handshake: number;
}

/** What the plan routes sites with: the scratch's regions and the resident layers. */
export interface SiteSources {
  scratch: Scratch;
  resident: ResidentLayers | null;
}

/** The sites of one command buffer and their event values. */
export class SitePlan {
  readonly sites: PlannedSite[] = [];
  /** Sites served at a handshake. */
  handshakes = 0;
  /** Bytes of scratch.moe.routes handed to resident sites so far (they are packed from its start). */
  routeBytes = 0;
  private opened: SiteRoute | null = null;
  constructor(
    readonly event: Event,
    /** The event's value before this command buffer: its values start above it. */
    readonly base: number,
    /** Serve every site at a handshake, resident or not (a caller that reads state mid-step). */
    readonly handshakeAll = false,
  ) {}

  /**
   * The next site's route, for expert layer `layer` over `rows` rows: resident when the layer
   * is held and its router outputs fit in scratch.moe.routes beside the earlier resident
   * sites' (they stay until the host reads them), else served at a handshake.
   */
  open(src: SiteSources, layer: number, rows: number): SiteRoute {
    if (this.opened) throw new Error("SitePlan.open: the previous site was opened but not encoded");
    const m = src.scratch.moe;
    // ids [rows][k] i32, then the weights, each from a 16-byte boundary.
    const bytes = Math.ceil((rows * m.ids.stride) / 16) * 16;
    const table = this.handshakeAll || this.routeBytes + 2 * bytes > m.routes.bytes ? null : (src.resident?.binding(layer) ?? null);
    if (table === null) {
      this.opened = { ids: m.ids, weights: m.weights, slotTable: bind(m.slotTable.buffer, m.slotTable.offset), resident: false };
      return this.opened;
    }
    const at = m.routes.offset + this.routeBytes;
    const stride = m.ids.stride;
    this.opened = { ids: { buffer: m.routes.buffer, offset: at, stride }, weights: { buffer: m.routes.buffer, offset: at + bytes, stride }, slotTable: table, resident: true };
    this.routeBytes += 2 * bytes;
    return this.opened;
  }

  /** Whether expert layer `layer` would be resident at the next site (the lookahead skips predicting it). */
  wouldBeResident(src: SiteSources, layer: number): boolean {
    return !this.handshakeAll && src.resident?.binding(layer) != null;
  }

  /** Records the opened site at this point of the command buffer: its handshake unless it is resident. */
  encode(ctx: EncodeContext, site: SiteInfo): void {
    const route = this.opened;
    if (!route) throw new Error("SitePlan.encode: open() the site first (its router writes where open() said)");
    this.opened = null;
    if (route.resident) {
      this.sites.push({ ...site, predicts: null, route, handshake: -1 });
      return;
    }
    // A recorded step replays without the host: it cannot hold a handshake.
    if (ctx.tape) throw new NotRecordable(`expert layer ${site.layer}'s site needs a handshake`);
    const h = this.handshakes++;
    this.sites.push({ ...site, route, handshake: h });
    ctx.cb.signal(this.event, this.signalValue(h));
    ctx.cb.wait(this.event, this.releaseValue(h));
  }

  /** The sites a recorded step's replay holds (all resident), into this empty plan. */
  adopt(sites: readonly PlannedSite[], routeBytes: number): void {
    if (this.sites.length > 0 || this.opened) throw new Error("SitePlan.adopt: the plan already holds sites");
    if (sites.some((s) => s.handshake >= 0)) throw new Error("SitePlan.adopt: a replayed step cannot hold a handshake");
    this.sites.push(...sites);
    this.routeBytes = routeBytes;
  }

  /** Forgets every site (a recording that gave up, before the step is encoded directly). */
  reset(): void {
    this.sites.length = 0;
    this.handshakes = 0;
    this.routeBytes = 0;
    this.opened = null;
  }

  signalValue(i: number): number {
    return this.base + 2 * i + 1;
  }

  releaseValue(i: number): number {
    return this.base + 2 * i + 2;
  }

  /** The event's value once every site is released: the next command buffer's base. */
  get end(): number {
    return this.base + 2 * this.handshakes;
  }
}

/** A step being recorded met something a replay cannot do (a handshake): it is encoded directly instead. */
export class NotRecordable extends Error {
  override name = "NotRecordable";
}

/** The command buffer failed (a GPU wait timed out, a dispatch failed) or ended without a signal it owed. */
export class GpuStepError extends Error {
  override name = "GpuStepError";
}

/** Milliseconds the host blocks in one event wait before it lets the event loop run IO callbacks. */
const WAIT_SLICE_MS = 2;

export const yieldToEventLoop = () => new Promise<void>((r) => setImmediate(r));

/**
 * Waits until `event` reaches `value`: blocking in short slices (a short blocking wait wakes
 * within microseconds of the signal) with the event loop run in between, so that IO
 * completions keep the scheduler going. Throws GpuStepError when the command buffer fails or
 * completes without the signal.
 */
export async function waitForSignal(cb: CommandBuffer, event: Event, value: number, what: string): Promise<void> {
  for (;;) {
    if (event.waitFor(value, WAIT_SLICE_MS)) return;
    const status = cb.status;
    if (status === "failed") throw new GpuStepError(`GPU step failed before ${what}: ${cb.error}`);
    if (status === "completed") {
      if (event.value >= value) return;
      throw new GpuStepError(`GPU step completed without signalling ${what} (event ${event.value} < ${value})`);
    }
    await yieldToEventLoop();
  }
}

/** Waits for the command buffer's completion the same way (slices + event loop); throws its error. */
export async function waitForCompletion(cb: CommandBuffer): Promise<void> {
  for (;;) {
    const status = cb.status;
    if (status === "completed") return;
    if (status === "failed") throw new GpuStepError(`GPU step failed: ${cb.error}`);
    let done: boolean;
    try {
      done = cb.waitFor(WAIT_SLICE_MS);
    } catch (e) {
      if (cb.status === "failed") throw new GpuStepError(`GPU step failed: ${cb.error}`);
      throw e;
    }
    if (done) return;
    await yieldToEventLoop();
  }
}
