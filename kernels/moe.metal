// MoE (MODEL.md "MoE"): the router's softmax + top-k, the grouping of a step's (row, k)
// pairs by expert, routed experts read through the layer's slot table from the expert
// pool, the dense shared expert, and the weighted combine. Projections use matvec.h, so a
// routed expert's weights are read once for all the rows routed to it.
#include <metal_stdlib>
#include "params.h"
#include "matvec.h"
#include "hc.h"

using namespace metal;

#define MOE_MAX_EXPERTS 1024
#define MOE_MAX_TOPK 32
#define ROUTER_SG 4  // rows (simdgroups) per threadgroup

// Per row: p = softmax(logits); the top_k experts by logit (equal logits: lower id first),
// weights p_k (or p_k / sum of the chosen p). One simdgroup per row; expert e lives in
// lane e % 32, slot e / 32. Each pick is one butterfly over (logit, id) pairs: five steps of
// two shuffles, where a max then a min of the ids took ten dependent steps.
#define MOE_SLOTS (MOE_MAX_EXPERTS / 32)
// Slots a lane holds in registers (experts <= 32 * slots): a fixed count, so the slot loops
// unroll and index the logits by constants. Two sizes, so 128 experts (the 30b shape) do not
// pay for 512's compares: unrolling to all MOE_SLOTS made 128 experts slower, and a
// runtime-indexed array lives in local memory, re-read at every pick.
#define ROUTER_FAST_SLOTS 4
#define ROUTER_WIDE_SLOTS 16

// The best (logit, id) of the simdgroup: the highest logit, the lower id on a tie.
inline void router_merge(thread float& best, thread int& best_e) {
  for (ushort off = 16; off >= 1; off >>= 1) {
    const float ob = simd_shuffle_xor(best, off);
    const int oe = simd_shuffle_xor(best_e, off);
    if (ob > best || (ob == best && oe < best_e)) {
      best = ob;
      best_e = oe;
    }
  }
}

// Logit of expert e (slot s of this lane), e < experts: from registers (PER > 0) or memory.
template <int PER>
inline float router_logit(thread const float* v, device const float* l, int s, int e) {
  return PER > 0 ? v[s] : l[e];
}

// The routing of one row (logits l[0 .. experts)) by one simdgroup: `picks` picks (<= top_k);
// returns pick `want`'s expert on every lane. With `write` (picks = top_k), stores the row's
// ids[0 .. top_k) and weights[0 .. top_k) as router_topk_f32 does. PER > 0: the lane's logits
// in PER registers (experts <= 32 * PER); PER = 0: any count, each pick re-reads the row from
// memory (cached) rather than a local-memory array. Both make the same comparisons and sums in
// the same order, so the same bits.
template <int PER>
inline int router_row(device const float* l, int experts, int top_k, bool norm, int picks, int want, bool write,
                      device int* ids, device float* weights, ushort lane) {
  const int n = PER > 0 ? PER : (experts + 31) / 32;
  float v[PER > 0 ? PER : 1];
  if (PER > 0) {
    for (int s = 0; s < n; s++) {
      const int e = s * 32 + int(lane);
      v[s] = e < experts ? l[e] : -INFINITY;
    }
  }
  float m = -INFINITY;
  float sum = 0.0f;
  if (write) {  // uniform per simdgroup
    for (int s = 0; s < n; s++) {
      const int e = s * 32 + int(lane);
      m = max(m, e < experts ? router_logit<PER>(v, l, s, e) : -INFINITY);
    }
    m = simd_max(m);
    for (int s = 0; s < n; s++) {
      const int e = s * 32 + int(lane);
      if (e < experts) {
        sum += exp(router_logit<PER>(v, l, s, e) - m);
      }
    }
    sum = simd_sum(sum);
  }
  uint taken = 0;
  float total = 0.0f;
  float mine = 0.0f;  // lane k keeps pick k's p (top_k <= 32)
  int wanted = 0;
  for (int k = 0; k < picks; k++) {
    float best = -INFINITY;
    int best_e = 0x7FFFFFFF;
    for (int s = 0; s < n; s++) {
      const int e = s * 32 + int(lane);
      if (e < experts && (taken & (1u << s)) == 0) {
        const float x = router_logit<PER>(v, l, s, e);
        if (x > best || best_e == 0x7FFFFFFF) {
          best = x;
          best_e = e;
        }
      }
    }
    router_merge(best, best_e);
    const int e = best_e;
    if (e % 32 == int(lane)) {
      taken |= 1u << (e / 32);
    }
    if (k == want) {
      wanted = e;
    }
    if (write) {
      const float chosen = exp(best - m) / sum;
      total += chosen;
      if (int(lane) == k) {
        mine = chosen;
      }
      if (lane == 0) {
        ids[k] = e;
      }
    }
  }
  if (write && int(lane) < top_k) {
    weights[int(lane)] = norm ? mine / total : mine;
  }
  return wanted;
}

// router_row in the smallest form that holds the experts (a uniform branch).
inline int router_route(device const float* l, int experts, int top_k, bool norm, int picks, int want, bool write,
                        device int* ids, device float* weights, ushort lane) {
  if (experts <= 32 * ROUTER_FAST_SLOTS) {
    return router_row<ROUTER_FAST_SLOTS>(l, experts, top_k, norm, picks, want, write, ids, weights, lane);
  }
  if (experts <= 32 * ROUTER_WIDE_SLOTS) {
    return router_row<ROUTER_WIDE_SLOTS>(l, experts, top_k, norm, picks, want, write, ids, weights, lane);
  }
  return router_row<0>(l, experts, top_k, norm, picks, want, write, ids, weights, lane);
}

[[max_total_threads_per_threadgroup(128)]] kernel void router_topk_f32(
    constant RouterParams& p  [[buffer(0)]],
    device const uchar* logits [[buffer(1)]],
    device int* ids           [[buffer(2)]],
    device float* weights     [[buffer(3)]],
    uint tg                   [[threadgroup_position_in_grid]],
    ushort sg                 [[simdgroup_index_in_threadgroup]],
    ushort lane               [[thread_index_in_simdgroup]]) {
  int row = int(tg) * ROUTER_SG + int(sg);
  if (row >= p.rows) {
    return;  // uniform per simdgroup
  }
  device const float* l = (device const float*)(logits + ulong(row) * p.logits_stride);
  router_route(l, p.experts, p.top_k, p.norm_topk != 0, p.top_k, 0, true, ids + row * p.top_k, weights + row * p.top_k, lane);
}

// Groups pair q = r * top_k + k by expert ids[q]: offsets[e] .. offsets[e + 1] index
// pairs[], which lists the pairs of expert e (in no particular order: each pair's result
// does not depend on it); active[0] = the number of experts with pairs, active[1 ..] their
// ids ascending (the expert kernels' threadgroup rows). One threadgroup; ids outside
// [0, E) are left out.
kernel void moe_lists_i32(
    constant MoeListsParams& p [[buffer(0)]],
    device const int* ids      [[buffer(1)]],
    device int* offsets        [[buffer(2)]],
    device int* pairs          [[buffer(3)]],
    device int* active         [[buffer(4)]],
    uint t                     [[thread_index_in_threadgroup]],
    uint nt                    [[threads_per_threadgroup]]) {
  threadgroup atomic_uint counts[MOE_MAX_EXPERTS];
  threadgroup uint starts[MOE_MAX_EXPERTS];
  for (int e = int(t); e < p.experts; e += int(nt)) {
    atomic_store_explicit(&counts[e], 0u, memory_order_relaxed);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int q = int(t); q < p.pairs; q += int(nt)) {
    int e = ids[q];
    if (e >= 0 && e < p.experts) {
      atomic_fetch_add_explicit(&counts[e], 1u, memory_order_relaxed);
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t == 0) {
    uint run = 0;
    int used = 0;
    for (int e = 0; e < p.experts; e++) {
      starts[e] = run;
      offsets[e] = int(run);
      uint c = atomic_load_explicit(&counts[e], memory_order_relaxed);
      if (c > 0) {
        active[1 + used] = e;
        used++;
      }
      run += c;
      atomic_store_explicit(&counts[e], 0u, memory_order_relaxed);
    }
    offsets[p.experts] = int(run);
    active[0] = used;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int q = int(t); q < p.pairs; q += int(nt)) {
    int e = ids[q];
    if (e >= 0 && e < p.experts) {
      uint at = starts[e] + atomic_fetch_add_explicit(&counts[e], 1u, memory_order_relaxed);
      pairs[at] = q;
    }
  }
}

// Routed experts. Threadgroup (x, u): MV_SG * MV_R output rows of the u-th active expert e
// for every pair routed to it, MV_NR pairs per pass (the grid has min(E, pairs) rows of
// threadgroups; those past the active count return at once). The expert's record is pool slot slot_of[e]; a
// missing slot (-1 or >= slots) reads nothing and writes NaN into its pairs' outputs, for
// the engine's finite check to catch.
//   gate_up (GATE_UP): out[q] = SiLU(gate x[q / top_k]) * up x[q / top_k]
//   down:              out[q] = down x[q]
// x rows are plain rows for every record dtype.
template <typename T, bool GATE_UP, int NR>
inline void moe_experts(constant MoeExpertsParams& p, device const int* offsets, device const int* pairs,
                        device const int* active, device const int* slot_of, device const uchar* pool,
                        device const uchar* x, device uchar* y, uint2 tg, ushort sg, ushort lane) {
  if (int(tg.y) >= active[0]) {
    return;  // uniform per threadgroup
  }
  int e = active[1 + int(tg.y)];
  int begin = offsets[e];
  int end = offsets[e + 1];
  int o0 = (int(tg.x) * MV_SG + int(sg)) * MV_R;
  if (begin >= end || o0 >= p.out_dim) {
    return;  // uniform per simdgroup
  }
  int slot = slot_of[e];
  bool missing = slot < 0 || slot >= p.slots;
  device const uchar* record = pool + (missing ? 0ul : ulong(slot) * p.record_stride);
  for (int q0 = begin; q0 < end; q0 += NR) {
    ulong xoff[NR];
    for (int j = 0; j < NR; j++) {
      int q = pairs[min(q0 + j, end - 1)];
      xoff[j] = ulong(GATE_UP ? q / p.top_k : q) * p.x_stride;
    }
    int nx = min(NR, end - q0);
    float4 acc[NR];
    float4 up[NR];
    mv_clear<NR>(acc);
    mv_clear<NR>(up);
    if (!missing) {
      if (GATE_UP) {
        MvPass<T, NR>::run2(record + p.w0_offset, record + p.w1_offset, p.in_dim, o0, p.out_dim, x, xoff, nx, acc, up, lane);
        mv_reduce<NR>(up, nx);
      } else {
        MvPass<T, NR>::run(record + p.w0_offset, p.in_dim, o0, p.out_dim, x, xoff, nx, acc, lane);
      }
      mv_reduce<NR>(acc, nx);
    }
    if (lane == 0) {
      for (int j = 0; j < NR; j++) if (j < nx) {
        device float* yr = (device float*)(y + ulong(pairs[q0 + j]) * p.y_stride);
        for (int i = 0; i < MV_R && o0 + i < p.out_dim; i++) {
          float g = acc[j][i];
          float v = GATE_UP ? g / (1.0f + exp(-g)) * up[j][i] : g;
          yr[o0 + i] = missing ? NAN : v;
        }
      }
    }
  }
}

template <typename T, int NR>
[[max_total_threads_per_threadgroup(128)]] kernel void moe_gate_up(
    constant MoeExpertsParams& p [[buffer(0)]],
    device const int* offsets    [[buffer(1)]],
    device const int* pairs      [[buffer(2)]],
    device const int* active     [[buffer(3)]],
    device const int* slot_of    [[buffer(4)]],
    device const uchar* pool     [[buffer(5)]],
    device const uchar* x        [[buffer(6)]],
    device uchar* y              [[buffer(7)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  moe_experts<T, true, NR>(p, offsets, pairs, active, slot_of, pool, x, y, tg, sg, lane);
}

template <typename T, int NR>
[[max_total_threads_per_threadgroup(128)]] kernel void moe_down(
    constant MoeExpertsParams& p [[buffer(0)]],
    device const int* offsets    [[buffer(1)]],
    device const int* pairs      [[buffer(2)]],
    device const int* active     [[buffer(3)]],
    device const int* slot_of    [[buffer(4)]],
    device const uchar* pool     [[buffer(5)]],
    device const uchar* x        [[buffer(6)]],
    device uchar* y              [[buffer(7)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  moe_experts<T, false, NR>(p, offsets, pairs, active, slot_of, pool, x, y, tg, sg, lane);
}

template [[host_name("moe_gate_up_f32_f32")]] kernel decltype(moe_gate_up<float, MV_NR>) moe_gate_up<float, MV_NR>;
template [[host_name("moe_gate_up_bf16_f32")]] kernel decltype(moe_gate_up<bfloat, MV_NR>) moe_gate_up<bfloat, MV_NR>;
template [[host_name("moe_gate_up_f16_f32")]] kernel decltype(moe_gate_up<half, MV_NR>) moe_gate_up<half, MV_NR>;
template [[host_name("moe_gate_up_q4_f32")]] kernel decltype(moe_gate_up<uchar, MV_NR>) moe_gate_up<uchar, MV_NR>;
template [[host_name("moe_down_f32_f32")]] kernel decltype(moe_down<float, MV_NR>) moe_down<float, MV_NR>;
template [[host_name("moe_down_bf16_f32")]] kernel decltype(moe_down<bfloat, MV_NR>) moe_down<bfloat, MV_NR>;
template [[host_name("moe_down_f16_f32")]] kernel decltype(moe_down<half, MV_NR>) moe_down<half, MV_NR>;
template [[host_name("moe_down_q4_f32")]] kernel decltype(moe_down<uchar, MV_NR>) moe_down<uchar, MV_NR>;
// Decode forms: one pair per pass (a decode step routes one row to each of its experts).
template [[host_name("moe_gate_up_q4_r1_f32")]] kernel decltype(moe_gate_up<uchar, 1>) moe_gate_up<uchar, 1>;
template [[host_name("moe_down_q4_r1_f32")]] kernel decltype(moe_down<uchar, 1>) moe_down<uchar, 1>;

// Gate and up of routed pair q (expert e, batch row q / top_k) for this simdgroup's MV_R
// outputs from o0: h[q] = SiLU(gate_e x) * up_e x, one pair per pass. A missing slot (or an
// id outside [0, E)) reads nothing and writes NaN. P: the plain or the routed params.
// `asks` (one lane of each threadgroup of the pair's ntg): with p.prefetch_w2, the threadgroup's
// share of the expert's down rows into L2 before it reads gate and up (kernels/grid.h
// ck_prefetch), so moe_down_combine, the next dispatch, finds them there instead of waiting on
// memory; the memory is otherwise idle while this kernel routes and computes.
template <typename T, typename P>
inline void moe_gate_up_pair(constant P& p, int q, int e, int o0, device const int* slot_of, device const uchar* pool,
                             device const uchar* x, device uchar* y, ushort lane, bool asks, uint tgx, uint ntg) {
  const int slot = e >= 0 && e < p.experts ? slot_of[e] : -1;
  const bool missing = slot < 0 || slot >= p.slots;
  device const uchar* record = pool + (missing ? 0ul : ulong(slot) * p.record_stride);
  if (asks && !missing && p.prefetch_w2 != 0u) {
    // down is [in_dim rows of out_dim]: threadgroup tgx of ntg takes rows [tgx * per, ...).
    const int per = (p.in_dim + int(ntg) - 1) / int(ntg);
    const int r0 = int(tgx) * per;
    if (r0 < p.in_dim) {
      mv_prefetch_rows(record + p.w2_offset, ulong(p.out_dim), r0, min(per, p.in_dim - r0), p.in_dim, (thread const T*)nullptr);
    }
  }
  // This simdgroup's rows of gate and up into L2 (p.prefetch_tile): nvcc issues many of the
  // pass's loads one at a time between its arithmetic, and each then waits on L2, not memory.
  if (lane == 0 && !missing && p.prefetch_tile != 0u) {
    mv_prefetch_tile<T>(record + p.w0_offset, p.in_dim, o0, p.out_dim);
    mv_prefetch_tile<T>(record + p.w1_offset, p.in_dim, o0, p.out_dim);
  }
  ulong xoff[1] = {ulong(q / p.top_k) * p.x_stride};
  float4 acc[1] = {float4(0.0f)};
  float4 up[1] = {float4(0.0f)};
  if (!missing) {
    MvPass<T, 1>::run2(record + p.w0_offset, record + p.w1_offset, p.in_dim, o0, p.out_dim, x, xoff, 1, acc, up, lane);
    mv_reduce<1>(up, 1);
    mv_reduce<1>(acc, 1);
  }
  if (lane == 0) {
    device float* yr = (device float*)(y + ulong(q) * p.y_stride);
    for (int i = 0; i < MV_R && o0 + i < p.out_dim; i++) {
      float g = acc[0][i];
      yr[o0 + i] = missing ? NAN : g / (1.0f + exp(-g)) * up[0][i];
    }
  }
}

// The routed experts' gate and up for a decode step, one threadgroup row per routed pair
// (q = tg.y < rows * top_k) straight from the router's ids, without the pair lists: a decode
// row routes to top_k distinct experts, so each expert's weights are still read once, and the
// grouping kernel and its dependent reads (active -> offsets -> pairs) leave the critical
// path. The same pass and reductions as moe_gate_up_q4_r1, so the same bits. (Staging x in
// threadgroup memory, as matvec_multi_q4_r1 does, made it slower on the H200: 22-25 us against
// 18 in ncu, with or without the weights loaded before the barrier.)
template <typename T>
[[max_total_threads_per_threadgroup(128)]] kernel void moe_gate_up_pairs(
    constant MoeExpertsParams& p [[buffer(0)]],
    device const int* ids        [[buffer(1)]],
    device const int* slot_of    [[buffer(2)]],
    device const uchar* pool     [[buffer(3)]],
    device const uchar* x        [[buffer(4)]],
    device uchar* y              [[buffer(5)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    uint2 ntg                    [[threadgroups_per_grid]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  const int q = int(tg.y);
  const int o0 = (int(tg.x) * MV_SG + int(sg)) * MV_R;
  if (q >= p.rows * p.top_k || o0 >= p.out_dim) {
    return;  // uniform per simdgroup
  }
  moe_gate_up_pair<T>(p, q, ids[q], o0, slot_of, pool, x, y, lane, sg == 0 && lane == 0, tg.x, ntg.x);
}

// moe_gate_up_pairs with the router's softmax + top-k folded in (a resident decode step: no
// host step between the router and the experts), one dispatch fewer: every simdgroup routes
// its row from the logits itself (router_row<PER>: a few shuffles a pick) and takes pick
// k = q % top_k; simdgroup 0 of threadgroup (0, r * top_k) makes every pick and writes row r's
// ids and weights for moe_down_combine and the host. The same routing (router_topk_f32's bits)
// and the same pass as moe_gate_up_pairs. One kernel per router form (PER: the host picks by
// the expert count, lib/gpu/experts.ts routedGateUpKernel), not router_route's three in one:
// on sm_90 the forms a model never takes were 32 of the kernel's 118 KB of code, and ncu
// counted its warps waiting on instruction fetch for ~1.0-1.4 cycles an instruction.
template <typename T, int PER>
[[max_total_threads_per_threadgroup(128)]] kernel void moe_gate_up_pairs_routed(
    constant MoeRoutedGateUpParams& p [[buffer(0)]],
    device const uchar* logits   [[buffer(1)]],
    device int* ids              [[buffer(2)]],
    device float* weights        [[buffer(3)]],
    device const int* slot_of    [[buffer(4)]],
    device const uchar* pool     [[buffer(5)]],
    device const uchar* x        [[buffer(6)]],
    device uchar* y              [[buffer(7)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    uint2 ntg                    [[threadgroups_per_grid]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  const int q = int(tg.y);
  const int o0 = (int(tg.x) * MV_SG + int(sg)) * MV_R;
  if (q >= p.rows * p.top_k || o0 >= p.out_dim) {
    return;  // uniform per simdgroup
  }
  // The layer's slot table (a few hundred bytes the weights streaming through L2 evict between
  // tokens) into L2 while the router finishes: the lookup after the routing then waits on L2.
  if (sg == 0 && lane == 0) {
    ck_prefetch((device const uchar*)slot_of, uint(p.experts) * 4u);
  }
  ck_inputs_ready();
  const int r = q / p.top_k;
  const int k = q - r * p.top_k;
  const bool writes = tg.x == 0 && sg == 0 && k == 0;  // uniform per simdgroup
  const int picks = writes ? p.top_k : k + 1;
  device const float* l = (device const float*)(logits + ulong(r) * p.logits_stride);
  device int* row_ids = ids + r * p.top_k;
  device float* row_w = weights + r * p.top_k;
  const int e = router_row<PER>(l, p.experts, p.top_k, p.norm_topk != 0, picks, k, writes, row_ids, row_w, lane);
  moe_gate_up_pair<T>(p, q, e, o0, slot_of, pool, x, y, lane, sg == 0 && lane == 0, tg.x, ntg.x);
}

template [[host_name("moe_gate_up_pairs_q4_f32")]] kernel decltype(moe_gate_up_pairs<uchar>) moe_gate_up_pairs<uchar>;
// bench:kernels only: the pairs' loads without the q4 arithmetic (q4_loads_only, matvec.h).
template [[host_name("moe_gate_up_pairs_q4_loads_f32")]] kernel decltype(moe_gate_up_pairs<char>) moe_gate_up_pairs<char>;
// Up to 32 * ROUTER_FAST_SLOTS experts (128), up to 32 * ROUTER_WIDE_SLOTS (512), any up to MOE_MAX_EXPERTS.
template [[host_name("moe_gate_up_pairs_routed_q4_f32")]] kernel decltype(moe_gate_up_pairs_routed<uchar, ROUTER_FAST_SLOTS>) moe_gate_up_pairs_routed<uchar, ROUTER_FAST_SLOTS>;
template [[host_name("moe_gate_up_pairs_routed_wide_q4_f32")]] kernel decltype(moe_gate_up_pairs_routed<uchar, ROUTER_WIDE_SLOTS>) moe_gate_up_pairs_routed<uchar, ROUTER_WIDE_SLOTS>;
template [[host_name("moe_gate_up_pairs_routed_any_q4_f32")]] kernel decltype(moe_gate_up_pairs_routed<uchar, 0>) moe_gate_up_pairs_routed<uchar, 0>;

// The routed experts' down projections and the combine in one pass, for a decode step (one
// pair per expert): threadgroup (x, r) computes MV_R outputs of row r. Its simdgroups (nsg,
// chosen by the host: 8, or 4 so that a decode step's threadgroups fit one wave) take the
// row's top_k experts in turn, expert k on simdgroup k % nsg (a simdgroup asks L2 for its next
// expert's rows before it reads the current one's: kernels/grid.h ck_prefetch); each leaves
// its reduced outputs and routing weight in threadgroup memory, and the first lane adds
// w[r][k] * (down_e h[r*k + k]) in k order, then (SHARED) sigmoid(sg[r]) s[r]. The same
// passes, reductions and sums in the same order as moe_down_q4_r1 + moe_combine, so the same
// bits whatever nsg, without the per-pair outputs in memory or a second dispatch. A missing
// slot reads nothing and makes the row NaN.
#define MOE_DC_SG 8
#define MOE_MAX_TOP_K 64
static_assert(MOE_DC_SG * 32 == 256, "update moe_down_combine's [[max_total_threads_per_threadgroup]]");

// Expert pair q's slot, or -1 when it is missing (an id outside [0, E) or an empty slot).
template <typename P>
inline int moe_dc_slot(constant P& p, device const int* ids, device const int* slot_of, int q) {
  const int e = ids[q];
  const int slot = e >= 0 && e < p.experts ? slot_of[e] : -1;
  return slot < 0 || slot >= p.slots ? -1 : slot;
}

// The combined MV_R outputs `v` of column tg.x of row tg.y, left with every lane of
// simdgroup 0, which alone returns true (every other thread, and a threadgroup past the
// output, false): the _hc forms' epilogue runs on its lanes (hc_store_lanes). P: the plain or the _hc params (the fields read here are in both).
template <typename T, bool SHARED, typename P>
inline bool moe_down_combine_at(constant P& p, device const int* ids, device const float* w,
                                device const int* slot_of, device const uchar* pool, device const uchar* h,
                                device const uchar* s, device const uchar* sgate, uint2 tg, ushort sg, ushort nsg,
                                ushort lane, thread float4& out) {
  threadgroup float4 part[MOE_MAX_TOP_K];
  threadgroup float wk[MOE_MAX_TOP_K];
  threadgroup int miss[MOE_MAX_TOP_K];
  const int o0 = int(tg.x) * MV_R;
  const int r = int(tg.y);
  if (o0 >= p.out_dim || r >= p.rows) {
    return false;  // uniform per threadgroup
  }
  for (int k = int(sg); k < p.top_k; k += int(nsg)) {
    const int q = r * p.top_k + k;
    const int slot = moe_dc_slot(p, ids, slot_of, q);  // uniform: every lane reads the same ids and table
    const bool missing = slot < 0;
    // The simdgroup's next expert (k + nsg) into L2 while this one is read and computed: its
    // loads then wait on L2, not on memory (a no-op on Metal and the CPU backend).
    const int kn = k + int(nsg);
    if (lane == 0 && kn < p.top_k) {
      const int next = moe_dc_slot(p, ids, slot_of, r * p.top_k + kn);
      if (next >= 0) {
        mv_prefetch_tile<T>(pool + ulong(next) * p.record_stride + p.w_offset, p.in_dim, o0, p.out_dim);
      }
    }
    float4 acc[1] = {float4(0.0f)};
    if (!missing) {
      ulong xoff[1] = {ulong(q) * p.h_stride};
      // One group a lane at a time (run_split): an expert's input is narrow (768 wide, 24
      // groups, on the 30b shape), so a lane never has a second group to load early.
      MvPass<T, 1>::run_split(pool + ulong(slot) * p.record_stride + p.w_offset, p.in_dim, o0, p.out_dim, h, xoff, 1, acc, int(lane), 32);
      mv_reduce<1>(acc, 1);
    }
    if (lane == 0) {
      part[k] = acc[0];
      wk[k] = w[q];
      miss[k] = missing ? 1 : 0;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg != 0) {
    return false;
  }
  float4 v = float4(0.0f);
  bool missing = false;
  for (int k = 0; k < p.top_k; k++) {
    if (miss[k] != 0) {
      missing = true;
      continue;
    }
    v += wk[k] * part[k];
  }
  if (SHARED) {
    float gate = *((device const float*)(sgate + ulong(r) * p.sg_stride));
    device const float* sr = (device const float*)(s + ulong(r) * p.s_stride);
    float4 sv = float4(sr[min(o0, p.out_dim - 1)], sr[min(o0 + 1, p.out_dim - 1)], sr[min(o0 + 2, p.out_dim - 1)], sr[min(o0 + 3, p.out_dim - 1)]);
    v += sv / (1.0f + exp(-gate));
  }
  out = missing ? float4(NAN) : v;
  return true;
}

template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void moe_down_combine(
    constant MoeDownCombineParams& p [[buffer(0)]],
    device const int* ids        [[buffer(1)]],
    device const float* w        [[buffer(2)]],
    device const int* slot_of    [[buffer(3)]],
    device const uchar* pool     [[buffer(4)]],
    device const uchar* h        [[buffer(5)]],
    device uchar* y              [[buffer(6)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort nsg                   [[simdgroups_per_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  float4 v;
  if (moe_down_combine_at<T, false>(p, ids, w, slot_of, pool, h, h, h, tg, sg, nsg, lane, v) && lane == 0) {
    mv_store(y, p.y_stride, int(tg.y), int(tg.x) * MV_R, p.out_dim, v, false);
  }
}

template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void moe_down_combine_shared(
    constant MoeDownCombineParams& p [[buffer(0)]],
    device const int* ids        [[buffer(1)]],
    device const float* w        [[buffer(2)]],
    device const int* slot_of    [[buffer(3)]],
    device const uchar* pool     [[buffer(4)]],
    device const uchar* h        [[buffer(5)]],
    device uchar* y              [[buffer(6)]],
    device const uchar* s        [[buffer(7)]],
    device const uchar* sgate    [[buffer(8)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort nsg                   [[simdgroups_per_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  float4 v;
  if (moe_down_combine_at<T, true>(p, ids, w, slot_of, pool, h, s, sgate, tg, sg, nsg, lane, v) && lane == 0) {
    mv_store(y, p.y_stride, int(tg.y), int(tg.x) * MV_R, p.out_dim, v, false);
  }
}

// The streams target of a moe_down_combine _hc kernel's params and bindings.
inline HcTarget moe_hc_target(constant MoeDownCombineHcParams& p, device uchar* X, device const uchar* coeffs,
                              device const uchar* fold_fn, device uchar* fold_part) {
  HcTarget t = hc_fold_target(fold_fn, fold_part, p.p_stride, p.fold_mixes, p.fold_dtype);
  t.x = X;
  t.coeffs = coeffs;
  t.x_stride = p.hc_stride;
  t.c_stride = p.c_stride;
  t.streams = p.streams;
  t.c4s = p.out_dim / 4;
  t.residual = p.residual != 0;
  return t;
}

// What the _hc down-combine kernels ask of L2 before they wait (grid.h): the layer's slot
// table (as moe_gate_up_pairs_routed) and, from the first row of threadgroups, their shares of
// the fold's fn (hc_fold_prefetch).
inline void moe_dc_hc_prefetch(constant MoeDownCombineHcParams& p, device const int* slot_of, device const uchar* fold_fn, uint2 tg, uint2 ntg,
                               ushort sg, ushort lane) {
  if (sg != 0 || lane != 0) {
    return;
  }
  ck_prefetch((device const uchar*)slot_of, uint(p.experts) * 4u);
  if (tg.y == 0u) {
    hc_fold_prefetch(fold_fn, p.fold_mixes, p.streams, p.out_dim, p.fold_dtype, p.residual != 0, tg.x, ntg.x);
  }
}

// moe_down_combine writing its output into hyper-connection streams (hc.h; out_dim = d, a
// multiple of 4: a threadgroup's MV_R outputs are one whole float4 column) or, with
// p.residual, adding it to X (n = 1).
template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void moe_down_combine_hc(
    constant MoeDownCombineHcParams& p [[buffer(0)]],
    device const int* ids        [[buffer(1)]],
    device const float* w        [[buffer(2)]],
    device const int* slot_of    [[buffer(3)]],
    device const uchar* pool     [[buffer(4)]],
    device const uchar* h        [[buffer(5)]],
    device uchar* X              [[buffer(6)]],
    device const uchar* coeffs   [[buffer(7)]],
    device const uchar* fold_fn  [[buffer(8)]],
    device uchar* fold_part      [[buffer(9)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    uint2 ntg                    [[threadgroups_per_grid]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort nsg                   [[simdgroups_per_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  moe_dc_hc_prefetch(p, slot_of, fold_fn, tg, ntg, sg, lane);
  ck_inputs_ready();
  float4 v;
  if (moe_down_combine_at<T, false>(p, ids, w, slot_of, pool, h, h, h, tg, sg, nsg, lane, v)) {
    hc_store_lanes(moe_hc_target(p, X, coeffs, fold_fn, fold_part), int(tg.y), int(tg.x), v, lane);
  }
}

template <typename T>
[[max_total_threads_per_threadgroup(256)]] kernel void moe_down_combine_shared_hc(
    constant MoeDownCombineHcParams& p [[buffer(0)]],
    device const int* ids        [[buffer(1)]],
    device const float* w        [[buffer(2)]],
    device const int* slot_of    [[buffer(3)]],
    device const uchar* pool     [[buffer(4)]],
    device const uchar* h        [[buffer(5)]],
    device uchar* X              [[buffer(6)]],
    device const uchar* s        [[buffer(7)]],
    device const uchar* sgate    [[buffer(8)]],
    device const uchar* coeffs   [[buffer(9)]],
    device const uchar* fold_fn  [[buffer(10)]],
    device uchar* fold_part      [[buffer(11)]],
    uint2 tg                     [[threadgroup_position_in_grid]],
    uint2 ntg                    [[threadgroups_per_grid]],
    ushort sg                    [[simdgroup_index_in_threadgroup]],
    ushort nsg                   [[simdgroups_per_threadgroup]],
    ushort lane                  [[thread_index_in_simdgroup]]) {
  moe_dc_hc_prefetch(p, slot_of, fold_fn, tg, ntg, sg, lane);
  ck_inputs_ready();
  float4 v;
  if (moe_down_combine_at<T, true>(p, ids, w, slot_of, pool, h, s, sgate, tg, sg, nsg, lane, v)) {
    hc_store_lanes(moe_hc_target(p, X, coeffs, fold_fn, fold_part), int(tg.y), int(tg.x), v, lane);
  }
}

template [[host_name("moe_down_combine_q4_f32")]] kernel decltype(moe_down_combine<uchar>) moe_down_combine<uchar>;
template [[host_name("moe_down_combine_q4_loads_f32")]] kernel decltype(moe_down_combine<char>) moe_down_combine<char>;
template [[host_name("moe_down_combine_shared_q4_f32")]] kernel decltype(moe_down_combine_shared<uchar>) moe_down_combine_shared<uchar>;
template [[host_name("moe_down_combine_hc_q4_f32")]] kernel decltype(moe_down_combine_hc<uchar>) moe_down_combine_hc<uchar>;
template [[host_name("moe_down_combine_shared_hc_q4_f32")]] kernel decltype(moe_down_combine_shared_hc<uchar>) moe_down_combine_shared_hc<uchar>;

// Dense gated MLP input half (the shared expert): y[r] = SiLU(W_gate x[r]) * (W_up x[r]),
// tiled as matvec (rows_per_group batch rows per threadgroup).
template <typename T>
[[max_total_threads_per_threadgroup(128)]] kernel void ffn_gate_up(
    constant MatvecParams& p [[buffer(0)]],
    device const uchar* wg   [[buffer(1)]],
    device const uchar* wu   [[buffer(2)]],
    device const uchar* x    [[buffer(3)]],
    device uchar* y          [[buffer(4)]],
    uint2 tg                 [[threadgroup_position_in_grid]],
    ushort sg                [[simdgroup_index_in_threadgroup]],
    ushort lane              [[thread_index_in_simdgroup]]) {
  int o0 = (int(tg.x) * MV_SG + int(sg)) * MV_R;
  int r_begin = int(tg.y) * p.rows_per_group;
  int r_end = min(p.rows, r_begin + p.rows_per_group);
  if (o0 >= p.out_dim || r_begin >= r_end) {
    return;
  }
  for (int r0 = r_begin; r0 < r_end; r0 += MV_NR) {
    ulong xoff[MV_NR];
    mv_row_offsets<MV_NR>(xoff, r0, r_end, p.x_stride);
    int nx = min(MV_NR, r_end - r0);
    float4 g[MV_NR];
    float4 u[MV_NR];
    mv_clear<MV_NR>(g);
    mv_clear<MV_NR>(u);
    MvPass<T, MV_NR>::run2(wg, wu, p.in_dim, o0, p.out_dim, x, xoff, nx, g, u, lane);
    mv_reduce<MV_NR>(g, nx);
    mv_reduce<MV_NR>(u, nx);
    if (lane == 0) {
      for (int j = 0; j < MV_NR; j++) if (j < nx) {
        device float* yr = (device float*)(y + ulong(r0 + j) * p.y_stride);
        for (int i = 0; i < MV_R && o0 + i < p.out_dim; i++) {
          float gv = g[j][i];
          yr[o0 + i] = gv / (1.0f + exp(-gv)) * u[j][i];
        }
      }
    }
  }
}

template [[host_name("ffn_gate_up_f32_f32")]] kernel decltype(ffn_gate_up<float>) ffn_gate_up<float>;
template [[host_name("ffn_gate_up_bf16_f32")]] kernel decltype(ffn_gate_up<bfloat>) ffn_gate_up<bfloat>;
template [[host_name("ffn_gate_up_f16_f32")]] kernel decltype(ffn_gate_up<half>) ffn_gate_up<half>;
template [[host_name("ffn_gate_up_q4_f32")]] kernel decltype(ffn_gate_up<uchar>) ffn_gate_up<uchar>;

// y[r] = sum_k w[r][k] o[r * top_k + k] in k order (+ sigmoid(sg[r]) s[r] with SHARED).
template <bool SHARED>
inline void moe_combine_at(constant MoeCombineParams& p, device const float* w, device const uchar* o,
                           device const uchar* s, device const uchar* sg, device uchar* y, uint2 gid) {
  int c = int(gid.x);
  int r = int(gid.y);
  if (c >= p.cols || r >= p.rows) {
    return;
  }
  float v = 0.0f;
  for (int k = 0; k < p.top_k; k++) {
    int q = r * p.top_k + k;
    v += w[q] * ((device const float*)(o + ulong(q) * p.o_stride))[c];
  }
  if (SHARED) {
    float gate = *((device const float*)(sg + ulong(r) * p.sg_stride));
    v += ((device const float*)(s + ulong(r) * p.s_stride))[c] / (1.0f + exp(-gate));
  }
  ((device float*)(y + ulong(r) * p.y_stride))[c] = v;
}

kernel void moe_combine_f32(
    constant MoeCombineParams& p [[buffer(0)]],
    device const float* w        [[buffer(1)]],
    device const uchar* o        [[buffer(2)]],
    device uchar* y              [[buffer(3)]],
    uint2 gid                    [[thread_position_in_grid]]) {
  moe_combine_at<false>(p, w, o, o, o, y, gid);
}

kernel void moe_combine_shared_f32(
    constant MoeCombineParams& p [[buffer(0)]],
    device const float* w        [[buffer(1)]],
    device const uchar* o        [[buffer(2)]],
    device uchar* y              [[buffer(3)]],
    device const uchar* s        [[buffer(4)]],
    device const uchar* sg       [[buffer(5)]],
    uint2 gid                    [[thread_position_in_grid]]) {
  moe_combine_at<true>(p, w, o, s, sg, y, gid);
}
