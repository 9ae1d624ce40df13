// cherenkov.h for the CPU backend: command buffers, the queue thread, events.
#include <chrono>
#include <cstring>

#include "runtime.h"
#include "../common/encode.h"
#include "../include/cherenkov_tape.h"

using ck::set_error;

// ---- events -------------------------------------------------------------------

// Apple's rule for MTLSharedEvent: the value only moves forward; setting a
// smaller one (from the host or a GPU signal) is ignored, not an error.
void ck_event::set(uint64_t v) {
  {
    std::lock_guard<std::mutex> lk(m);
    if (v <= value) return;
    value = v;
  }
  cv.notify_all();
}

bool ck_event::wait_at_least(uint64_t v, uint32_t timeout_ms) {
  std::unique_lock<std::mutex> lk(m);
  return cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return value >= v; });
}

void ck_event_unref(ck_event *e) {
  if (e && e->drop()) delete e;
}

// ---- command buffers -------------------------------------------------------------

static void release_resources(ck_cmdbuf *cb) {
  for (auto *b : cb->buffers) ck_buffer_unref(b);
  cb->buffers.clear();
  for (auto &c : cb->commands)
    if (c.kind != ck::Command::kDispatch) ck_event_unref(c.event);
  cb->commands.clear();
  cb->bindings.clear();
  cb->params.clear();
}

ck_cmdbuf::~ck_cmdbuf() { release_resources(this); }

void ck_cmdbuf_unref(ck_cmdbuf *cb) {
  if (cb && cb->drop()) delete cb;
}

static void finish(ck_cmdbuf *cb, int32_t status) {
  release_resources(cb);
  ck_device *dev = cb->dev;
  std::lock_guard<std::mutex> lk(dev->qm);
  cb->status.store(status, std::memory_order_release);
  dev->donecv.notify_all();
}

static void run_cmdbuf(ck_device *dev, ck_cmdbuf *cb) {
  char msg[768];
  std::string err;
  for (size_t i = 0; i < cb->commands.size(); i++) {
    ck::Command &c = cb->commands[i];
    if (c.kind == ck::Command::kDispatch) {
      ck::Dispatch d;
      d.kernel = c.kernel;
      std::memset(d.buf, 0, sizeof d.buf);
      for (int k = 0; k < 3; k++) {
        d.groups[k] = c.groups[k];
        d.tg[k] = c.tg[k];
        d.threads[k] = c.threads[k];
      }
      for (uint32_t b = 0; b < c.binding_count; b++) {
        const ck::BoundBuffer &bound = cb->bindings[c.first_binding + b];
        d.buf[bound.index] = bound.address;
      }
      if (c.params_len) d.buf[0] = cb->params.data() + c.params_offset;
      if (!dev->pool->run(d, err)) {
        std::snprintf(msg, sizeof msg, "command buffer %u: command %zu, dispatch of '%s' (%s): %s",
                      cb->id, i, c.kernel->name, c.kernel->where, err.c_str());
        cb->error = msg;
        return finish(cb, CK_CMDBUF_FAILED);
      }
    } else if (c.kind == ck::Command::kSignal) {
      c.event->set(c.value);
    } else {
      uint32_t timeout = dev->wait_timeout_ms.load();
      // An emulated OS limit shorter than the watchdog ends the command buffer first, with
      // the error Metal reports (commands.m: "the GPU stopped it: ...").
      uint32_t os_limit = c.kind == ck::Command::kWait ? dev->gpu_wait_limit_ms : 0;  // a host wait holds no GPU
      if (os_limit && os_limit < timeout && !c.event->wait_at_least(c.value, os_limit)) {
        std::snprintf(msg, sizeof msg,
                      "command buffer %u: the GPU stopped it: Timeout (the system ended a wait for event %u >= %llu "
                      "after its %u ms limit)", cb->id, c.event->id, static_cast<unsigned long long>(c.value), os_limit);
        cb->error = msg;
        return finish(cb, CK_CMDBUF_FAILED);
      }
      if (!c.event->wait_at_least(c.value, timeout)) {
        std::snprintf(msg, sizeof msg, "command buffer %u: wait for event %u >= %llu timed out after %u ms",
                      cb->id, c.event->id, static_cast<unsigned long long>(c.value), timeout);
        cb->error = msg;
        return finish(cb, CK_CMDBUF_FAILED);
      }
    }
  }
  finish(cb, CK_CMDBUF_COMPLETED);
}

void ck_queue_start(ck_device *dev) {
  dev->qthread = std::thread([dev] {
    for (;;) {
      ck_cmdbuf *cb;
      {
        std::unique_lock<std::mutex> lk(dev->qm);
        dev->qcv.wait(lk, [&] { return dev->stopping || !dev->queue.empty(); });
        if (dev->queue.empty()) return;  // stopping and drained
        cb = dev->queue.front();
        dev->queue.pop_front();
      }
      run_cmdbuf(dev, cb);
      ck_cmdbuf_unref(cb);
    }
  });
}

void ck_queue_stop(ck_device *dev) {
  {
    std::lock_guard<std::mutex> lk(dev->qm);
    dev->stopping = true;
  }
  dev->qcv.notify_all();
  if (dev->qthread.joinable()) dev->qthread.join();
}

static int32_t encode_dispatch(ck_cmdbuf *cb, ck_pipeline *pipe, const uint32_t grid[3],
                               const uint32_t tg[3], bool grid_counts_threads,
                               const ck_binding *bindings, uint32_t binding_count,
                               const void *params, uint32_t params_len) {
  ck::Command c{};
  if (ck::check_dispatch(cb, pipe, grid, tg, grid_counts_threads, bindings, binding_count, params, params_len, c) != CK_OK)
    return CK_ERROR;
  ck::record_dispatch(cb, c, bindings, binding_count, params, params_len, [](ck_buffer *b) { return b->data; });
  return CK_OK;
}

static int32_t encode_event(ck_cmdbuf *cb, ck_event *ev, double value, ck::Command::Kind kind) {
  ck::Command c{};
  if (ck::check_event(cb, ev, value, kind, c) != CK_OK) return CK_ERROR;
  ev->retain();
  cb->commands.push_back(c);
  return CK_OK;
}

extern "C" {

CK_API ck_cmdbuf *ck_cmdbuf_begin(ck_device *dev) {
  if (!dev) return set_error("ck_cmdbuf_begin: device is NULL"), nullptr;
  auto *cb = new ck_cmdbuf();
  cb->dev = dev;
  cb->commands.reserve(64);
  cb->bindings.reserve(256);
  cb->id = dev->next_cmdbuf_id.fetch_add(1);
  return cb;
}

CK_API uint32_t ck_cmdbuf_id(ck_cmdbuf *cb) { return cb ? cb->id : 0; }

CK_API int32_t ck_encode_dispatch(ck_cmdbuf *cb, ck_pipeline *pipe, uint32_t grid_x, uint32_t grid_y,
                                  uint32_t grid_z, uint32_t tg_x, uint32_t tg_y, uint32_t tg_z,
                                  const ck_binding *bindings, uint32_t binding_count,
                                  const void *params, uint32_t params_len) {
  const uint32_t grid[3] = {grid_x, grid_y, grid_z}, tg[3] = {tg_x, tg_y, tg_z};
  return encode_dispatch(cb, pipe, grid, tg, false, bindings, binding_count, params, params_len);
}

CK_API int32_t ck_encode_dispatch_threads(ck_cmdbuf *cb, ck_pipeline *pipe, uint32_t threads_x,
                                          uint32_t threads_y, uint32_t threads_z, uint32_t tg_x,
                                          uint32_t tg_y, uint32_t tg_z, const ck_binding *bindings,
                                          uint32_t binding_count, const void *params,
                                          uint32_t params_len) {
  const uint32_t grid[3] = {threads_x, threads_y, threads_z}, tg[3] = {tg_x, tg_y, tg_z};
  return encode_dispatch(cb, pipe, grid, tg, true, bindings, binding_count, params, params_len);
}

CK_API int32_t ck_encode_tape(ck_cmdbuf *cb, const uint32_t *words, uint32_t word_count) {
  const char *why = nullptr;
  const int32_t s = ck_tape_encode(cb, words, word_count, &why);
  return why ? set_error("ck_encode_tape: %s", why) : s;
}

CK_API int32_t ck_encode_signal(ck_cmdbuf *cb, ck_event *ev, double value) {
  return encode_event(cb, ev, value, ck::Command::kSignal);
}

CK_API int32_t ck_encode_wait(ck_cmdbuf *cb, ck_event *ev, double value) {
  return encode_event(cb, ev, value, ck::Command::kWait);
}

CK_API int32_t ck_encode_wait_host(ck_cmdbuf *cb, ck_event *ev, double value) {
  return encode_event(cb, ev, value, ck::Command::kWaitHost);
}

// Nothing is replayed here: commands are run as encoded.
CK_API int32_t ck_cmdbuf_hint(ck_cmdbuf *cb, uint32_t, int32_t) { return ck::check_encoding(cb, "hint"); }

CK_API int32_t ck_cmdbuf_commit(ck_cmdbuf *cb) {
  if (ck::check_encoding(cb, "commit") != CK_OK) return CK_ERROR;
  ck_device *dev = cb->dev;
  cb->retain();  // the queue's reference
  {
    std::lock_guard<std::mutex> lk(dev->qm);
    cb->status.store(CK_CMDBUF_COMMITTED);
    dev->queue.push_back(cb);
  }
  dev->qcv.notify_one();
  return CK_OK;
}

CK_API int32_t ck_cmdbuf_wait(ck_cmdbuf *cb, uint32_t timeout_ms) {
  if (!cb) return set_error("ck_cmdbuf_wait: command buffer is NULL");
  if (cb->status.load() == CK_CMDBUF_ENCODING)
    return set_error("command buffer %u: wait before commit", cb->id);
  ck_device *dev = cb->dev;
  {
    std::unique_lock<std::mutex> lk(dev->qm);
    dev->donecv.wait_for(lk, std::chrono::milliseconds(timeout_ms),
                         [&] { return cb->status.load() >= CK_CMDBUF_COMPLETED; });
  }
  int32_t s = cb->status.load(std::memory_order_acquire);
  if (s == CK_CMDBUF_COMPLETED) return CK_OK;
  if (s == CK_CMDBUF_FAILED) return set_error("%s", cb->error.c_str());
  return CK_TIMEOUT;
}

CK_API int32_t ck_cmdbuf_status(ck_cmdbuf *cb) {
  return cb ? cb->status.load(std::memory_order_acquire) : CK_ERROR;
}

CK_API const char *ck_cmdbuf_error(ck_cmdbuf *cb) {
  if (!cb || cb->status.load(std::memory_order_acquire) != CK_CMDBUF_FAILED) return "";
  return cb->error.c_str();
}

CK_API void ck_cmdbuf_release(ck_cmdbuf *cb) { ck_cmdbuf_unref(cb); }

// ---- events (host side) ------------------------------------------------------------

CK_API ck_event *ck_event_new(ck_device *dev) {
  if (!dev) return set_error("ck_event_new: device is NULL"), nullptr;
  auto *e = new ck_event();
  e->id = dev->next_event_id.fetch_add(1);
  return e;
}

CK_API uint32_t ck_event_id(ck_event *ev) { return ev ? ev->id : 0; }

CK_API double ck_event_value(ck_event *ev) {
  if (!ev) return 0;
  std::lock_guard<std::mutex> lk(ev->m);
  return double(ev->value);
}

CK_API int32_t ck_event_set(ck_event *ev, double value) {
  uint64_t v;
  if (!ev) return set_error("ck_event_set: event is NULL");
  if (!ck::to_u64(value, v))
    return set_error("event %u: value %.17g is not an integer in [0, 2^53]", ev->id, value);
  ev->set(v);
  return CK_OK;
}

CK_API int32_t ck_event_wait(ck_event *ev, double value, uint32_t timeout_ms) {
  uint64_t v;
  if (!ev) return set_error("ck_event_wait: event is NULL");
  if (!ck::to_u64(value, v))
    return set_error("event %u: value %.17g is not an integer in [0, 2^53]", ev->id, value);
  return ev->wait_at_least(v, timeout_ms) ? CK_OK : CK_TIMEOUT;
}

CK_API void ck_event_release(ck_event *ev) { ck_event_unref(ev); }

}  // extern "C"
