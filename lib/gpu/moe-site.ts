// The MoE sub-layer of a step, split where the host steps in (DESIGN.md "One command buffer
// per step"): `encodeMoeRoute` is the site's read, norm and router (and the grouping of the
// routed pairs); the caller then records the handshake (signal, wait for the slot table) or,
// for a resident layer, nothing; `encodeMoeCompute` runs the routed experts through the
// route's slot table, the shared expert, the combine and the site's write. Both take the
// site's route (SitePlan.open): where its router writes and which table its experts read.
// A resident decode site (foldsRouter) has no host step to serve, so its softmax + top-k
// moves into the gate and up: the route ends at the logits, the experts write ids/weights.
// `encodeLookaheadRoute` is the next layer's read + norm + router on the current streams: a
// prediction the host prefetches from, never used as a result.
import type { ModelConfig } from "../model/config.ts";
import { bind, type EncodeContext, type RowsRef, type TensorRef } from "./dispatch.ts";
import {
  encodeExpertLists,
  encodeMoeCombine,
  encodeRoutedExperts,
  encodeRouter,
  encodeRouterLogits,
  encodeSharedExpert,
  fusesDownCombine,
  type ExpertPool as KernelPool,
} from "./experts.ts";
import type { SiteRoute } from "./handshake.ts";
import { encodeSiteRead, encodeWriteOf, siteWrite, type HcConfig, type HcFold, type HcSiteRefs } from "./hyperconnection.ts";
import { deferSiteRead } from "./site-read.ts";
import type { MoeRefs } from "./refs.ts";
import type { Scratch } from "./scratch.ts";

export interface MoeSiteArgs {
  config: ModelConfig;
  /** The residual: streams [nb][n][d] with their hyper-connection site, or the plain [nb][d] (site null, n = 1). */
  X: RowsRef;
  site: HcSiteRefs | null;
  hc: HcConfig;
  norm: TensorRef;
  moe: MoeRefs;
  scratch: Scratch;
  nb: number;
  /** Record dtype of the routed experts. */
  expertDType: string;
  /** The site's raw products, left by the write before (lib/gpu/hc-fold.ts); absent: hc_mix_partials. */
  folded?: RowsRef;
  /** The next site's raw products the site's write leaves (hcFold). */
  fold?: HcFold;
}

const routerConfig = (c: ModelConfig) => ({ experts: c.moe.experts, top_k: c.moe.top_k, norm_topk_prob: c.moe.norm_topk_prob });

/**
 * Whether the site's softmax + top-k runs inside its gate and up (moe_gate_up_pairs_routed)
 * rather than in router_topk: a step that ends in moe_down_combine on `pool`, at a resident
 * site (no host step between the router and the experts that would read the ids).
 */
export function foldsRouter(pool: KernelPool, nb: number, route: SiteRoute): boolean {
  return route.resident && fusesDownCombine(pool, nb);
}

/**
 * The site's read + norm into scratch.xn, the router (into the route's ids/weights) and the
 * pair lists, which a step that ends in moe_down_combine on `pool` does not need (its gate and
 * up run per routed pair from the ids). A folded router (foldsRouter) stops at the logits.
 */
export function encodeMoeRoute(ctx: EncodeContext, a: MoeSiteArgs, pool: KernelPool, route: SiteRoute): void {
  const { config: c, nb, scratch: s } = a;
  const d = c.hidden_size;
  // The router's dispatch encodes the read (site-read.ts: formed by it where it can take it,
  // which needs the partials a folded write left); the experts then read s.xn.
  const read = deferSiteRead(ctx, a.X, a.site, s.hc, s.xn, nb, a.hc, d, { w: a.norm, eps: c.rms_norm_eps }, a.folded);
  const m = s.moe;
  // The shared expert's gate logit rides in the router's dispatch (the same input).
  const sharedGate = a.moe.shared ? { w: a.moe.shared.expertGate, sg: m.sg } : undefined;
  if (foldsRouter(pool, nb, route)) {
    encodeRouterLogits(ctx, a.moe.router, s.xn, m.logits, nb, routerConfig(c), sharedGate, read);
    return;
  }
  const ids = bind(route.ids.buffer, route.ids.offset);
  encodeRouter(ctx, a.moe.router, s.xn, m.logits, { ids, weights: bind(route.weights.buffer, route.weights.offset) }, nb, routerConfig(c), sharedGate, read);
  if (fusesDownCombine(pool, nb)) return;
  const L = m.lists;
  encodeExpertLists(
    ctx,
    ids,
    { offsets: bind(L.offsets.buffer, L.offsets.offset), pairs: bind(L.pairs.buffer, L.pairs.offset), active: bind(L.active.buffer, L.active.offset) },
    nb,
    c.moe.top_k,
    c.moe.experts,
  );
}

/**
 * Routed experts through the route's slot table, the shared expert, the combine into scratch.y,
 * and the site's write (a decode step's moe_down_combine does the write itself).
 */
export function encodeMoeCompute(ctx: EncodeContext, a: MoeSiteArgs, pool: KernelPool, route: SiteRoute): void {
  const { config: c, nb, scratch: s } = a;
  const d = c.hidden_size;
  const k = c.moe.top_k;
  const m = s.moe;
  const L = m.lists;
  const x = s.xn;
  // The shared expert first: a decode step's fused down + combine adds its output.
  let shared: { s: RowsRef; sg: RowsRef } | undefined;
  if (a.moe.shared) {
    encodeSharedExpert(ctx, a.moe.shared, x, { h: m.sh, s: m.s, sg: m.sg }, nb, { gate: false }); // sg: encodeMoeRoute
    shared = { s: m.s, sg: m.sg };
  }
  const weights = bind(route.weights.buffer, route.weights.offset);
  const fused = fusesDownCombine(pool, nb);
  const write = siteWrite(a.X, a.site, s.hc, a.hc, d, a.fold);
  encodeRoutedExperts(
    ctx,
    pool,
    route.slotTable,
    fused ? null : { offsets: bind(L.offsets.buffer, L.offsets.offset), pairs: bind(L.pairs.buffer, L.pairs.offset), active: bind(L.active.buffer, L.active.offset) },
    x,
    { h: m.h, o: m.o },
    nb,
    k,
    c.moe.experts,
    fused
      ? {
          ids: bind(route.ids.buffer, route.ids.offset),
          weights,
          y: s.y,
          shared,
          into: write,
          route: foldsRouter(pool, nb, route) ? { logits: m.logits, norm_topk_prob: c.moe.norm_topk_prob } : undefined,
        }
      : undefined,
  );
  if (fused) return;
  encodeMoeCombine(ctx, weights, m.o, s.y, nb, k, d, shared);
  encodeWriteOf(ctx, write, s.y, nb);
}

/**
 * The next layer's MoE read + norm + router on the current streams (its own scratch:
 * scratch.la), leaving predicted ids in scratch.la.ids.
 */
export function encodeLookaheadRoute(ctx: EncodeContext, a: MoeSiteArgs): void {
  const { config: c, nb, scratch: s } = a;
  if (a.folded) throw new Error("lookahead route: the next layer's site has no folded partials (its own hc_mix_partials runs)");
  const d = c.hidden_size;
  const la = s.la;
  encodeSiteRead(ctx, a.X, a.site, la.hc, la.xn, nb, a.hc, d, { w: a.norm, eps: c.rms_norm_eps });
  encodeRouter(
    ctx,
    a.moe.router,
    la.xn,
    la.logits,
    { ids: bind(la.ids.buffer, la.ids.offset), weights: bind(la.weights.buffer, la.weights.offset) },
    nb,
    routerConfig(c),
  );
}
