// Encoding dispatches and events, shared by the CPU and CUDA runtimes: cpu/queue.cpp and cuda/runtime.cu
// include this after their runtime.h, and it uses what both backends' ck_cmdbuf, ck_pipeline,
// ck_buffer and ck::Command have in common. The messages are Metal's (metal/commands.m).
#pragma once
#include <cstring>

namespace ck {

// CK_OK while cb is still encoding; else CK_ERROR with the message set.
static int32_t check_encoding(ck_cmdbuf *cb, const char *what) {
  if (!cb) return set_error("%s: command buffer is NULL", what);
  if (cb->status.load() != CK_CMDBUF_ENCODING) return set_error("command buffer %u: %s after commit", cb->id, what);
  return CK_OK;
}

// Checks a dispatch of pipe on cb (grid in threadgroups, or in threads when grid_counts_threads)
// and fills c's kind, kernel, tg, groups and threads; CK_OK, or CK_ERROR with the message set.
static int32_t check_dispatch(ck_cmdbuf *cb, ck_pipeline *pipe, const uint32_t grid[3], const uint32_t tg[3],
                              bool grid_counts_threads, const ck_binding *bindings, uint32_t binding_count,
                              const void *params, uint32_t params_len, Command &c) {
  if (check_encoding(cb, "dispatch") != CK_OK) return CK_ERROR;
  if (!pipe) return set_error("command buffer %u: dispatch: pipeline is NULL", cb->id);
  const KernelInfo *k = pipe->info;
  const unsigned id = cb->id;
#define FAIL(fmt, ...) return set_error("command buffer %u: dispatch of '%s' (%s): " fmt, id, k->name, k->where, ##__VA_ARGS__)
  uint64_t tg_threads = uint64_t(tg[0]) * tg[1] * tg[2];
  if (tg_threads == 0) FAIL("threadgroup %ux%ux%u is empty", tg[0], tg[1], tg[2]);
  if (tg_threads > pipe->max_threads)
    FAIL("threadgroup %ux%ux%u = %llu threads exceeds the pipeline's maximum of %u", tg[0], tg[1], tg[2],
         static_cast<unsigned long long>(tg_threads), pipe->max_threads);
  if (binding_count > kMaxBuffers) FAIL("%u bindings: buffer indices go from 0 to %u", binding_count, kMaxBuffers - 1);
  if (params_len > CK_MAX_PARAMS_BYTES) FAIL("params are %u bytes, at most %u", params_len, CK_MAX_PARAMS_BYTES);
  if (params_len && !params) FAIL("params pointer is NULL with params_len %u", params_len);
  if (binding_count && !bindings) FAIL("bindings pointer is NULL with binding_count %u", binding_count);

  c.kind = Command::kDispatch;
  c.kernel = k;
  uint64_t groups_total = 1;
  for (int i = 0; i < 3; i++) {
    c.tg[i] = tg[i];
    uint64_t threads, groups;
    if (grid_counts_threads) {
      threads = grid[i];
      groups = (threads + tg[i] - 1) / tg[i];
    } else {
      groups = grid[i];
      threads = groups * tg[i];
    }
    if (threads > UINT32_MAX) FAIL("grid axis %d has %llu threads, more than 2^32 - 1", i, static_cast<unsigned long long>(threads));
    c.groups[i] = uint32_t(groups);
    c.threads[i] = uint32_t(threads);
    groups_total *= groups;
  }
  if (groups_total > UINT32_MAX) FAIL("grid has more than 2^32 - 1 threadgroups");

  uint32_t bound = 0;  // mask of indices given a buffer
  for (uint32_t i = 0; i < binding_count; i++) {
    ck_buffer *b = bindings[i].buffer;
    if (!b) continue;
    uint64_t off = bindings[i].offset;
    if (i == 0 && params_len) FAIL("[[buffer(0)]] is bound to a buffer and to params");
    if (!((k->buffer_mask >> i) & 1u)) FAIL("binds [[buffer(%u)]], which the kernel does not declare", i);
    if (off > b->length)
      FAIL("[[buffer(%u)]] offset %llu is past the end of its %zu-byte buffer", i, static_cast<unsigned long long>(off), b->length);
    if (b->length - off < k->min_bytes[i])
      FAIL("[[buffer(%u)]] has %llu bytes left after offset %llu; the kernel reads %u", i,
           static_cast<unsigned long long>(b->length - off), static_cast<unsigned long long>(off), k->min_bytes[i]);
    bound |= 1u << i;
  }
  if (params_len) {
    if (!(k->buffer_mask & 1u)) FAIL("params given, but the kernel declares no [[buffer(0)]]");
    if (params_len < k->min_bytes[0]) FAIL("params are %u bytes; the kernel reads %u at [[buffer(0)]]", params_len, k->min_bytes[0]);
  }
  uint32_t missing = k->buffer_mask & ~bound & ~(params_len ? 1u : 0u);
  if (missing) FAIL("[[buffer(%d)]] is not bound", __builtin_ctz(missing));
#undef FAIL
  return CK_OK;
}

// Checks a signal or wait of ev at value on cb and fills c's kind, event and value; CK_OK, or
// CK_ERROR with the message set.
static int32_t check_event(ck_cmdbuf *cb, ck_event *ev, double value, Command::Kind kind, Command &c) {
  const char *what = kind == Command::kSignal ? "signal" : "wait";
  if (check_encoding(cb, what) != CK_OK) return CK_ERROR;
  if (!ev) return set_error("command buffer %u: %s: event is NULL", cb->id, what);
  uint64_t v;
  if (!to_u64(value, v))
    return set_error("command buffer %u: %s: event value %.17g is not an integer in [0, 2^53]", cb->id, what, value);
  c.kind = kind;
  c.event = ev;
  c.value = v;
  return CK_OK;
}

// Keeps b alive until cb completes: retained and listed in cb->buffers (released with cb)
// unless it is among the last kRetainWindow buffers listed. A decode step binds ~1,000 times
// but ~25 distinct buffers (the tiny model's cycle: 1,116 bindings, 26 buffers), so encoding a
// recorded step and releasing it cost ~25 reference counts instead of ~1,000 (an engine
// encodes the next cycle's variants while the GPU runs one: host time on every cycle).
constexpr size_t kRetainWindow = 32;
template <class Cmdbuf, class Buffer>
static void retain_once(Cmdbuf *cb, Buffer *b) {
  const size_t n = cb->buffers.size();
  for (size_t j = n > kRetainWindow ? n - kRetainWindow : 0; j < n; j++)
    if (cb->buffers[j] == b) return;
  b->retain();
  cb->buffers.push_back(b);
}

// Appends the checked dispatch c to cb with its params (16-byte aligned) and its buffers
// (retained until completion); address(b) is where the backend's kernels see buffer b.
template <class Address>
static void record_dispatch(ck_cmdbuf *cb, Command c, const ck_binding *bindings, uint32_t binding_count,
                            const void *params, uint32_t params_len, Address address) {
  if (params_len) {
    size_t off = (cb->params.size() + 15) & ~size_t(15);
    cb->params.resize(off + params_len);
    std::memcpy(cb->params.data() + off, params, params_len);
    c.params_offset = uint32_t(off);
    c.params_len = params_len;
  }
  c.first_binding = uint32_t(cb->bindings.size());
  for (uint32_t i = 0; i < binding_count; i++) {
    if (ck_buffer *b = bindings[i].buffer) {
      retain_once(cb, b);
      cb->bindings.push_back(BoundBuffer{i, address(b) + bindings[i].offset});
    }
  }
  c.binding_count = uint32_t(cb->bindings.size()) - c.first_binding;
  cb->commands.push_back(c);
}

}  // namespace ck
