// Runs one command buffer with MoE sites: encode, commit, then per site wait for the GPU's
// signal, decide the layer's slots (hits, misses and their reads, the lookahead's prefetch),
// publish the slot table, await the reads, release the GPU; finally wait for completion.
// Sites of resident layers (resident.ts) have no handshake: the host checks and records their
// routing once the GPU is past them (at the next handshake, or after completion).
// A failure (a read error, a pool error, the GPU giving up waiting) fails the step with a
// clear error after the command buffer has finished: the remaining sites are released with
// empty slot tables (their experts write NaN, never read outside the pool), so nothing hangs.
import { NonFiniteError } from "../model/errors.ts";
import type { CommandBuffer } from "../shim.ts";
import type { EncodeContext } from "./dispatch.ts";
import { GpuStepError, SitePlan, waitForCompletion, waitForSignal, yieldToEventLoop, type PlannedSite, type SiteInfo } from "./handshake.ts";
import type { EngineGpu } from "./load.ts";
import { StepTimeline } from "./phases.ts";
import type { Acquired } from "./residency.ts";
import { f32View, i32View } from "./scratch.ts";

/** What the host saw at a site (for routing traces). */
export interface SiteObservation {
  site: SiteInfo;
  /** Routed ids [rows][k] and weights, copies. */
  ids: Int32Array;
  weights: Float32Array;
  misses: readonly number[];
  /** The lookahead's predicted ids for `site.predicts` (copy), or null. */
  predicted: Int32Array | null;
}

export type SiteObserver = (o: SiteObservation) => void;

/** A step encoded ahead (uncommitted): its command buffer and the plan of its sites. */
export interface PreparedStep {
  readonly cb: CommandBuffer;
  readonly plan: SitePlan;
}

/** The engine-wide event counter: every command buffer's values start above the last one's. */
export interface EventCounter {
  value: number;
}

/** Decides, publishes and awaits one site's experts; returns the milliseconds spent awaiting reads. */
async function serveSite(gpu: EngineGpu, site: PlannedSite, observe: SiteObserver | undefined): Promise<number> {
  const s = gpu.scratch;
  const count = site.rows * gpu.config.moe.top_k;
  const { ids, weights } = checkedRouting(gpu, site);
  const acquired: Acquired = gpu.pool.acquire(site.layer, ids);
  let predicted: Int32Array | null = null;
  if (site.predicts !== null) {
    predicted = i32View(s.la.ids, count);
    gpu.pool.prefetch(site.predicts, predicted);
  }
  gpu.pool.writeSlotTable(site.layer, i32View(s.moe.slotTable, gpu.pool.slotTableStride));
  gpu.activity.record(site.layer, site.rows, ids, weights);
  observe?.({ site, ids: ids.slice(), weights: weights.slice(), misses: acquired.missIds, predicted: predicted?.slice() ?? null });
  const t0 = performance.now();
  await acquired.ready;
  return performance.now() - t0;
}

/**
 * The host's part of a resident site, after the GPU has run it: the same checks and records
 * as a served site (non-finite router weights, hits, activity, observers), no decision.
 */
function accountResidentSite(gpu: EngineGpu, site: PlannedSite, observe: SiteObserver | undefined): void {
  const { ids, weights } = checkedRouting(gpu, site);
  gpu.pool.countHits(site.layer, ids);
  gpu.activity.record(site.layer, site.rows, ids, weights);
  observe?.({ site, ids: ids.slice(), weights: weights.slice(), misses: [], predicted: null });
}

/** A site's routed ids and weights (views of where its router wrote), its weights checked. */
function checkedRouting(gpu: EngineGpu, site: PlannedSite): { ids: Int32Array; weights: Float32Array } {
  const count = site.rows * gpu.config.moe.top_k;
  const weights = f32View(site.route.weights, count);
  checkRouting(gpu, site, weights);
  return { ids: i32View(site.route.ids, count), weights };
}

/**
 * NaN or infinity in the router's input makes its weights non-finite and its ids meaningless
 * (the kernel's argmax finds no maximum): name the layer instead of failing on a bogus id.
 */
function checkRouting(gpu: EngineGpu, site: SiteInfo, weights: Float32Array): void {
  for (let i = 0; i < weights.length; i++) {
    if (Number.isFinite(weights[i]!)) continue;
    const where = site.trunkLayer === null ? "the MTP head" : `layer ${site.layer}`;
    throw new NonFiniteError(
      `${where}: non-finite router weights (${weights[i]}) at the MoE site: the weights or activations of ${where} (or an earlier layer) are NaN or infinite`,
      site.trunkLayer === null ? gpu.config.num_layers : site.layer,
    );
  }
}

/** An all-empty slot table: the site's experts write NaN and read nothing. */
function publishEmptyTable(gpu: EngineGpu): void {
  const t = i32View(gpu.scratch.moe.slotTable, gpu.pool.slotTableStride);
  t.fill(-1);
  t[t.length - 1] = 0;
}

/**
 * Encodes a command buffer with `encode` (which records its handshakes into the plan), runs
 * it with the host side of every site, and resolves once it has completed. Rejects with the
 * first failure after the command buffer has finished.
 */
export async function runStep(
  gpu: EngineGpu,
  counter: EventCounter,
  encode: (ctx: EncodeContext, plan: SitePlan) => void,
  observe?: SiteObserver,
  opts: {
    /** Serve every site at a handshake, resident layers too (a caller whose observer reads state mid-step). */
    handshakeAll?: boolean;
    /** A command buffer already holding (part of) the step, encoded while the GPU ran the step before (PreparedSteps); `encode` adds the rest. */
    prepared?: PreparedStep | null;
    /** Runs once the step is committed, while the GPU works on `running` (the engine prepares the next step). Must not throw. */
    afterCommit?: (running: CommandBuffer) => void;
  } = {},
): Promise<StepTimeline> {
  const timeline = new StepTimeline();
  // Layers that became resident since the last step get their tables (the GPU is idle here).
  gpu.resident.refresh();
  const prepared = opts.prepared ?? null;
  if (prepared && (prepared.plan.base !== counter.value || prepared.plan.handshakeAll !== (opts.handshakeAll ?? false)))
    throw new Error("runStep: the prepared step was planned for another event value or handshake mode");
  const plan = prepared?.plan ?? new SitePlan(gpu.event, counter.value, opts.handshakeAll ?? false);
  const cb = prepared?.cb ?? gpu.device.commandBuffer();
  let failure: unknown = null;
  let acquired: number | null = null;
  /** Resident sites before this index are accounted for. */
  let accounted = 0;
  /** scratch.moe.routes is on the host up to this offset (device storage: downloaded). */
  const routes = gpu.scratch.moe.routes;
  let onHost = routes.offset;
  const accountUpTo = (end: number) => {
    if (failure !== null) return;
    // The resident sites' router outputs, in one download (the GPU is past them).
    let until = onHost;
    for (let i = accounted; i < end; i++) {
      const r = plan.sites[i]!.route;
      if (r.resident) until = Math.max(until, 2 * r.weights.offset - r.ids.offset);
    }
    if (until > onHost && routes.buffer.storage === "device") routes.buffer.download(onHost, until - onHost);
    onHost = until;
    for (; accounted < end; accounted++) {
      const site = plan.sites[accounted]!;
      if (site.route.resident && failure === null) accountResidentSite(gpu, site, observe);
    }
  };
  try {
    encode({ device: gpu.device, cb }, plan);
    counter.value = plan.end;
    cb.commit();
    timeline.markCommitted();
    if (opts.afterCommit) {
      const t0 = performance.now();
      opts.afterCommit(cb);
      timeline.markPrepared(performance.now() - t0, cb.status === "completed");
    }
    for (let i = 0; i < plan.sites.length; i++) {
      const site = plan.sites[i]!;
      if (site.handshake < 0) continue;
      const what = site.trunkLayer === null ? "the MTP head's router" : `layer ${site.layer}'s router`;
      const t0 = performance.now();
      await waitForSignal(cb, gpu.event, plan.signalValue(site.handshake), what);
      const t1 = performance.now();
      let ioMs = 0;
      // The GPU is past the previous site's experts: its slots may move again.
      if (acquired !== null) gpu.pool.release(acquired);
      acquired = null;
      if (failure === null) {
        try {
          // The GPU is past every earlier site: the resident ones are checked and recorded first.
          accountUpTo(i);
          ioMs = await serveSite(gpu, site, observe);
          acquired = site.layer;
        } catch (e) {
          failure = e;
          gpu.pool.releaseAll();
          publishEmptyTable(gpu);
        }
      } else publishEmptyTable(gpu);
      if (failure === null && cb.status === "failed")
        failure = new GpuStepError(`the GPU gave up waiting for ${site.trunkLayer === null ? "the MTP head's" : `layer ${site.layer}'s`} slot table: ${cb.error}`);
      gpu.event.set(plan.releaseValue(site.handshake));
      timeline.site({ layer: site.layer, waitMs: t1 - t0, handshakeMs: performance.now() - t1 - ioMs, ioMs });
    }
    await waitForCompletion(cb);
    accountUpTo(plan.sites.length);
  } catch (e) {
    failure ??= e;
  } finally {
    gpu.pool.releaseAll();
    cb.release();
  }
  if (failure !== null) throw failure;
  timeline.finish(gpu.stats.phases, gpu.handshakes);
  // One event-loop turn per step: on a fast GPU no wait ever runs out its slice, and timers
  // (a close() or an abort scheduled mid-generation) would otherwise wait for the stream's end.
  await yieldToEventLoop();
  return timeline;
}
