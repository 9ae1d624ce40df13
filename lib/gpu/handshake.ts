// The GPU/host handshake of a step (DESIGN.md "One command buffer per step"). Every MoE site
// of a command buffer gets two event values: the GPU signals the first after the site's
// router and waits for the second, which the host sets once the slot table is published.
// Values increase monotonically across steps (one event per engine); the host only ever
// sets a site's release value after seeing its signal, so the event never goes backwards.
import type { CommandBuffer, Event } from "../shim.ts";
import type { EncodeContext } from "./dispatch.ts";

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

/** The sites of one command buffer and their event values. */
export class SitePlan {
  readonly sites: SiteInfo[] = [];
  constructor(
    readonly event: Event,
    /** The event's value before this command buffer: its values start above it. */
    readonly base: number,
  ) {}

  /** Records the handshake of `site` at this point of the command buffer. */
  encode(ctx: EncodeContext, site: SiteInfo): void {
    const i = this.sites.length;
    this.sites.push(site);
    ctx.cb.signal(this.event, this.signalValue(i));
    ctx.cb.wait(this.event, this.releaseValue(i));
  }

  signalValue(i: number): number {
    return this.base + 2 * i + 1;
  }

  releaseValue(i: number): number {
    return this.base + 2 * i + 2;
  }

  /** The event's value once every site is released: the next command buffer's base. */
  get end(): number {
    return this.base + 2 * this.sites.length;
  }
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
    try {
      cb.waitUntilCompleted(WAIT_SLICE_MS);
      return;
    } catch (e) {
      if (cb.status === "failed") throw new GpuStepError(`GPU step failed: ${cb.error}`);
      if (!/did not complete/.test((e as Error).message)) throw e;
    }
    await yieldToEventLoop();
  }
}
