// cherenkov.h over Metal: command buffers, compute encoders, shared events and
// the watchdog that enforces GPU event-wait timeouts.
//
// A ck_cmdbuf is one MTLCommandBuffer. Dispatches go into a compute encoder
// (serial dispatch type: each dispatch sees the writes of the ones before
// it), opened lazily. Metal only lets a command buffer wait for or signal an
// event between encoders, so ck_encode_signal / ck_encode_wait end the open
// encoder, encode the event command on the command buffer itself, and the
// next dispatch opens a new encoder.
//
// Timeouts: a Metal event wait cannot be cancelled and has no timeout. Before
// each wait the command buffer signals a private "arrivals" event with the
// wait's number; a per-device serial watchdog queue blocks until the GPU
// arrives there, then gives the awaited event the device's wait timeout. If
// the host has not released it by then, the command buffer is marked FAILED
// with the same message as the CPU backend, and the watchdog sets the event
// itself so the GPU (and every later command buffer of the queue) moves on.
// To stop at the failed wait as cherenkov.h promises, every ck_encode_dispatch
// recorded after a wait is an indirect dispatch whose threadgroup counts sit
// in a shared buffer: the watchdog zeroes the counts of everything after the
// failed wait before letting the GPU go, so those dispatches run no threads.
// (ck_encode_dispatch_threads has no indirect form in Metal 3: such a dispatch
// after a failed wait still runs; so do event signals.)
//
// Host waits (ck_encode_wait_host) are not encoded at all: the ck_cmdbuf is cut into parts
// (one MTLCommandBuffer each), all enqueued at commit to keep the queue's order, and each
// part after a host wait is committed by the device's gates queue once the event is reached,
// so the GPU never waits on it and no OS event-wait timeout applies (docs/metal.md).
#import "shim.h"
#include "../include/cherenkov_tape.h"

@implementation CherenkovEvent
@end
@implementation CherenkovWait
@end

@implementation CherenkovCmdbuf
- (void)dealloc {
  // A command buffer released before commit may still have an open encoder.
  if (enc) [enc endEncoding];
}
@end

static int32_t status_of(CherenkovCmdbuf *cb) { return __atomic_load_n(&cb->status, __ATOMIC_ACQUIRE); }
static BOOL finished(CherenkovCmdbuf *cb) { return status_of(cb) >= CK_CMDBUF_COMPLETED; }

void ck_cmdbuf_finish(CherenkovCmdbuf *cb, NSString *gpu_error) {
  CherenkovDevice *d = cb->dev;
  [d->done lock];
  if (!finished(cb)) {
    NSString *error = cb->error ? cb->error : gpu_error;  // a timed-out wait is the first cause
    if (error) {
      cb->error = error;
      cb->error_c = ck_cstring(error);
    }
    __atomic_store_n(&cb->status, error ? CK_CMDBUF_FAILED : CK_CMDBUF_COMPLETED, __ATOMIC_RELEASE);
    d->inflight--;
  }
  cb->mtl = nil;  // the completion handler holds cb; drop the command buffers that hold the handler
  cb->parts = nil;
  [d->done broadcast];
  [d->done unlock];
}

static int32_t check_encoding(ck_cmdbuf *handle, const char *what) {
  if (!handle) return ck_fail(@"%s: command buffer is NULL", what);
  CherenkovCmdbuf *cb = CK_OBJ(CherenkovCmdbuf, handle);
  if (status_of(cb) != CK_CMDBUF_ENCODING) return ck_fail(@"command buffer %u: %s after commit", cb->ident, what);
  return CK_OK;
}

static void end_encoder(CherenkovCmdbuf *cb) {
  if (!cb->enc) return;
  [cb->enc endEncoding];
  cb->enc = nil;
  cb->enc_pipeline = nil;
}

// ---- command buffers ------------------------------------------------------------------

// One MTLCommandBuffer of the queue: the whole ck_cmdbuf, or one part of it after a host wait.
static id<MTLCommandBuffer> new_part(CherenkovDevice *d) {
  // Retained references: Metal keeps every buffer, pipeline and event it
    // encodes alive until the command buffer completes (cherenkov.h promises it).
    // Encoder execution status, only under CHERENKOV_METAL_DEBUG=1 (it costs GPU
    // time): a GPU fault reports which encoder faulted, with the dispatches
    // (signposts) it holds, so the error can name the kernel.
    MTLCommandBufferDescriptor *desc = [MTLCommandBufferDescriptor new];
    desc.retainedReferences = YES;
    desc.errorOptions = ck_metal_debug() ? MTLCommandBufferErrorOptionEncoderExecutionStatus : MTLCommandBufferErrorOptionNone;
    return [d->queue commandBufferWithDescriptor:desc];
}

CK_API ck_cmdbuf *ck_cmdbuf_begin(ck_device *dev) {
  @autoreleasepool {
    if (!dev) return ck_fail(@"ck_cmdbuf_begin: device is NULL"), NULL;
    CherenkovDevice *d = CK_OBJ(CherenkovDevice, dev);
    id<MTLCommandBuffer> mtl = new_part(d);
    if (!mtl) return ck_fail(@"ck_cmdbuf_begin: Metal gave no command buffer"), NULL;
    CherenkovCmdbuf *cb = [CherenkovCmdbuf new];
    cb->dev = d;
    cb->mtl = mtl;
    cb->ident = __atomic_fetch_add(&d->next_cmdbuf_id, 1, __ATOMIC_RELAXED);
    cb->status = CK_CMDBUF_ENCODING;
    cb->waits = [NSMutableArray array];
    cb->parts = [NSMutableArray arrayWithCapacity:1];
    [cb->parts addObject:mtl];
    mtl.label = [NSString stringWithFormat:@"cherenkov command buffer %u", cb->ident];
    return CK_HANDLE(ck_cmdbuf, cb);
  }
}

CK_API uint32_t ck_cmdbuf_id(ck_cmdbuf *cb) { return cb ? CK_OBJ(CherenkovCmdbuf, cb)->ident : 0; }

// Indirect dispatch arguments: three uint32_t threadgroup counts each, in
// page-sized shared buffers allocated as a command buffer needs them.
enum { kGridBytes = 12, kGridBufferBytes = 16384, kGridsPerBuffer = kGridBufferBytes / kGridBytes };

static uint32_t *grid_at(CherenkovCmdbuf *cb, uint32_t index) {
  id<MTLBuffer> buffer = cb->grids[index / kGridsPerBuffer];
  return (uint32_t *)((char *)buffer.contents + (index % kGridsPerBuffer) * kGridBytes);
}

// The next free entry (NULL if Metal gives no buffer).
static uint32_t *next_grid(CherenkovCmdbuf *cb, id<MTLBuffer> __strong *buffer, NSUInteger *offset) {
  uint32_t index = cb->grid_count;
  if (index % kGridsPerBuffer == 0) {
    id<MTLBuffer> fresh = [cb->dev->mtl newBufferWithLength:kGridBufferBytes options:MTLResourceStorageModeShared];
    if (!fresh) return NULL;
    if (!cb->grids) cb->grids = [NSMutableArray array];
    [cb->grids addObject:fresh];
  }
  cb->grid_count = index + 1;
  *buffer = cb->grids.lastObject;
  *offset = (index % kGridsPerBuffer) * kGridBytes;
  return grid_at(cb, index);
}

// Validates as the CPU backend does (same messages), then encodes.
static int32_t encode_dispatch(ck_cmdbuf *handle, ck_pipeline *pipe, const uint32_t grid[3], const uint32_t tg[3],
                               BOOL grid_counts_threads, const ck_binding *bindings, uint32_t binding_count,
                               const void *params, uint32_t params_len) {
  if (check_encoding(handle, "dispatch") != CK_OK) return CK_ERROR;
  CherenkovCmdbuf *cb = CK_OBJ(CherenkovCmdbuf, handle);
  if (!pipe) return ck_fail(@"command buffer %u: dispatch: pipeline is NULL", cb->ident);
  CherenkovPipeline *p = CK_OBJ(CherenkovPipeline, pipe);
#define FAIL(fmt, ...) \
  return ck_fail(@"command buffer %u: dispatch of '%@' (%@): " fmt, cb->ident, p->name, p->where, ##__VA_ARGS__)

  uint64_t tg_threads = (uint64_t)tg[0] * tg[1] * tg[2];
  if (tg_threads == 0) FAIL("threadgroup %ux%ux%u is empty", tg[0], tg[1], tg[2]);
  if (tg_threads > p->max_threads)
    FAIL("threadgroup %ux%ux%u = %llu threads exceeds the pipeline's maximum of %u", tg[0], tg[1], tg[2],
         (unsigned long long)tg_threads, p->max_threads);
  if (binding_count > CK_MAX_BUFFER_BINDINGS)
    FAIL("%u bindings: buffer indices go from 0 to %u", binding_count, CK_MAX_BUFFER_BINDINGS - 1);
  if (params_len > CK_MAX_PARAMS_BYTES) FAIL("params are %u bytes, at most %u", params_len, CK_MAX_PARAMS_BYTES);
  if (params_len && !params) FAIL("params pointer is NULL with params_len %u", params_len);
  if (binding_count && !bindings) FAIL("bindings pointer is NULL with binding_count %u", binding_count);

  uint64_t groups_total = 1;
  for (int i = 0; i < 3; i++) {
    uint64_t threads = grid_counts_threads ? grid[i] : (uint64_t)grid[i] * tg[i];
    uint64_t groups = grid_counts_threads ? (threads + tg[i] - 1) / tg[i] : grid[i];
    if (threads > UINT32_MAX) FAIL("grid axis %d has %llu threads, more than 2^32 - 1", i, (unsigned long long)threads);
    groups_total *= groups;
  }
  if (groups_total > UINT32_MAX) FAIL("grid has more than 2^32 - 1 threadgroups");

  uint32_t bound = 0;
  for (uint32_t i = 0; i < binding_count; i++) {
    if (!bindings[i].buffer) continue;
    CherenkovBuffer *b = CK_OBJ(CherenkovBuffer, bindings[i].buffer);
    uint64_t off = bindings[i].offset;
    if (i == 0 && params_len) FAIL("[[buffer(0)]] is bound to a buffer and to params");
    if (p->checked && !((p->buffer_mask >> i) & 1u)) FAIL("binds [[buffer(%u)]], which the kernel does not declare", i);
    if (off > b->length)
      FAIL("[[buffer(%u)]] offset %llu is past the end of its %lu-byte buffer", i, (unsigned long long)off,
           (unsigned long)b->length);
    // Metal's reflection gives the pointee size of every buffer argument, but
    // not whether it is a reference or a pointer: only [[buffer(0)]] (the
    // params struct, by reference in this project) is size-checked here.
    if (i == 0 && b->length - off < p->bytes0)
      FAIL("[[buffer(%u)]] has %llu bytes left after offset %llu; the kernel reads %u", i,
           (unsigned long long)(b->length - off), (unsigned long long)off, p->bytes0);
    bound |= 1u << i;
  }
  if (params_len) {
    if (p->checked && !(p->buffer_mask & 1u)) FAIL("params given, but the kernel declares no [[buffer(0)]]");
    if (params_len < p->bytes0) FAIL("params are %u bytes; the kernel reads %u at [[buffer(0)]]", params_len, p->bytes0);
    bound |= 1u;
  }
  // Only arguments the compiled kernel uses must be bound (the CPU backend,
  // which cannot tell, asks for every declared one).
  uint32_t missing = p->used_mask & ~bound;
  if (missing) FAIL("[[buffer(%u)]] is not bound", (unsigned)__builtin_ctz(missing));
#undef FAIL

  if (!cb->enc) {
    cb->enc = [cb->mtl computeCommandEncoder];
    cb->enc_pipeline = nil;
    if (!cb->enc) return ck_fail(@"command buffer %u: Metal gave no compute encoder", cb->ident);
    cb->enc.label = [NSString stringWithFormat:@"command buffer %u, encoder %u", cb->ident, ++cb->encoders];
  }
  id<MTLComputeCommandEncoder> enc = cb->enc;
  if (ck_metal_debug()) [enc insertDebugSignpost:p->signpost];
  if (cb->enc_pipeline != p->state) {
    [enc setComputePipelineState:p->state];
    cb->enc_pipeline = p->state;
  }
  for (uint32_t i = 0; i < binding_count; i++) {
    if (!bindings[i].buffer) continue;
    [enc setBuffer:CK_OBJ(CherenkovBuffer, bindings[i].buffer)->mtl offset:(NSUInteger)bindings[i].offset atIndex:i];
  }
  if (params_len) [enc setBytes:params length:params_len atIndex:0];
  if (groups_total == 0) return CK_OK;  // an empty grid runs nothing; Metal is not asked to dispatch it
  MTLSize threads_per_group = MTLSizeMake(tg[0], tg[1], tg[2]);
  if (grid_counts_threads) {
    [enc dispatchThreads:MTLSizeMake(grid[0], grid[1], grid[2]) threadsPerThreadgroup:threads_per_group];
  } else if (cb->waits.count > 0 || cb->gates.count > 0) {
    // After a wait: an indirect dispatch, which the watchdog can cancel.
    id<MTLBuffer> buffer = nil;
    NSUInteger offset = 0;
    uint32_t *counts = next_grid(cb, &buffer, &offset);
    if (!counts) return ck_fail(@"command buffer %u: Metal gave no buffer for indirect dispatch arguments", cb->ident);
    counts[0] = grid[0];
    counts[1] = grid[1];
    counts[2] = grid[2];
    [enc dispatchThreadgroupsWithIndirectBuffer:buffer indirectBufferOffset:offset threadsPerThreadgroup:threads_per_group];
  } else {
    [enc dispatchThreadgroups:MTLSizeMake(grid[0], grid[1], grid[2]) threadsPerThreadgroup:threads_per_group];
  }
  return CK_OK;
}

CK_API int32_t ck_encode_dispatch(ck_cmdbuf *cb, ck_pipeline *pipe, uint32_t grid_x, uint32_t grid_y,
                                  uint32_t grid_z, uint32_t tg_x, uint32_t tg_y, uint32_t tg_z,
                                  const ck_binding *bindings, uint32_t binding_count, const void *params,
                                  uint32_t params_len) {
  @autoreleasepool {
    const uint32_t grid[3] = {grid_x, grid_y, grid_z}, tg[3] = {tg_x, tg_y, tg_z};
    return encode_dispatch(cb, pipe, grid, tg, NO, bindings, binding_count, params, params_len);
  }
}

CK_API int32_t ck_encode_dispatch_threads(ck_cmdbuf *cb, ck_pipeline *pipe, uint32_t threads_x, uint32_t threads_y,
                                          uint32_t threads_z, uint32_t tg_x, uint32_t tg_y, uint32_t tg_z,
                                          const ck_binding *bindings, uint32_t binding_count, const void *params,
                                          uint32_t params_len) {
  @autoreleasepool {
    const uint32_t grid[3] = {threads_x, threads_y, threads_z}, tg[3] = {tg_x, tg_y, tg_z};
    return encode_dispatch(cb, pipe, grid, tg, YES, bindings, binding_count, params, params_len);
  }
}

static int32_t encode_event(ck_cmdbuf *handle, ck_event *event, double value, BOOL is_wait) {
  const char *what = is_wait ? "wait" : "signal";
  if (check_encoding(handle, what) != CK_OK) return CK_ERROR;
  CherenkovCmdbuf *cb = CK_OBJ(CherenkovCmdbuf, handle);
  if (!event) return ck_fail(@"command buffer %u: %s: event is NULL", cb->ident, what);
  uint64_t v;
  if (!ck_to_u64(value, &v))
    return ck_fail(@"command buffer %u: %s: event value %.17g is not an integer in [0, 2^53]", cb->ident, what, value);
  CherenkovEvent *e = CK_OBJ(CherenkovEvent, event);
  if (is_wait && !cb->arrivals) {
    cb->arrivals = [cb->dev->mtl newSharedEvent];
    if (!cb->arrivals) return ck_fail(@"command buffer %u: wait: Metal gave no shared event", cb->ident);
  }
  end_encoder(cb);  // event commands sit between encoders
  if (is_wait) {
    CherenkovWait *w = [CherenkovWait new];
    w->event = e;
    w->value = v;
    w->first_grid = cb->grid_count;
    [cb->waits addObject:w];
    [cb->mtl encodeSignalEvent:cb->arrivals value:cb->waits.count];
    [cb->mtl encodeWaitForEvent:e->mtl value:v];
  } else {
    [cb->mtl encodeSignalEvent:e->mtl value:v];
  }
  return CK_OK;
}

CK_API int32_t ck_encode_tape(ck_cmdbuf *cb, const uint32_t *words, uint32_t word_count) {
  const char *why = NULL;
  const int32_t s = ck_tape_encode(cb, words, word_count, &why);
  return why ? ck_fail(@"ck_encode_tape: %s", why) : s;
}

CK_API int32_t ck_encode_signal(ck_cmdbuf *cb, ck_event *ev, double value) {
  @autoreleasepool {
    return encode_event(cb, ev, value, NO);
  }
}

CK_API int32_t ck_encode_wait(ck_cmdbuf *cb, ck_event *ev, double value) {
  @autoreleasepool {
    return encode_event(cb, ev, value, YES);
  }
}


// Cancels every indirect dispatch recorded after `w`: zero threadgroups. The
// GPU has not read them yet (it is blocked at `w`, or at an earlier wait).
static void cancel_after(CherenkovCmdbuf *cb, CherenkovWait *w) {
  for (uint32_t i = w->first_grid; i < cb->grid_count; i++) {
    uint32_t *counts = grid_at(cb, i);
    counts[0] = counts[1] = counts[2] = 0;
  }
}

// Lets the GPU past a wait the host did not release in time.
static void force_release(CherenkovWait *w) {
  id<MTLSharedEvent> e = w->event->mtl;
  if (e.signaledValue < w->value) e.signaledValue = w->value;
}

// Runs on the device's watchdog queue, one command buffer at a time in commit
// order (the order the GPU reaches their waits).
static void watch_waits(CherenkovCmdbuf *cb) {
  @autoreleasepool {
    CherenkovDevice *d = cb->dev;
    BOOL failed = NO;
    uint64_t k = 0;
    for (CherenkovWait *w in cb->waits) {
      k++;
      // The work before the wait may take any time; poll for the end of the
      // command buffer too (a GPU error means it never arrives).
      while (![cb->arrivals waitUntilSignaledValue:k timeoutMS:100])
        if (finished(cb)) return;
      if (failed) {
        force_release(w);
        continue;
      }
      uint32_t timeout = __atomic_load_n(&d->wait_timeout_ms, __ATOMIC_RELAXED);
      if ([w->event->mtl waitUntilSignaledValue:w->value timeoutMS:timeout]) continue;
      [d->done lock];
      if (!cb->error)
        cb->error = [NSString stringWithFormat:@"command buffer %u: wait for event %u >= %llu timed out after %u ms",
                                               cb->ident, w->event->ident, (unsigned long long)w->value, timeout];
      [d->done unlock];
      failed = YES;
      cancel_after(cb, w);
      force_release(w);
    }
  }
}

// "; the fault is in <encoder label>, which dispatches <kernels>" from the
// encoder execution status of a failed command buffer, or "" when Metal gave none.
static NSString *fault_site(NSError *error) {
  if (!ck_metal_debug()) return @" (CHERENKOV_METAL_DEBUG=1 names the kernel of a GPU fault)";
  id infos = error ? error.userInfo[MTLCommandBufferEncoderInfoErrorKey] : nil;
  if (![infos isKindOfClass:[NSArray class]]) return @"";
  for (id<MTLCommandBufferEncoderInfo> info in (NSArray *)infos) {
    if (info.errorState != MTLCommandEncoderErrorStateFaulted) continue;
    // Distinct kernels in dispatch order; the encoder may hold many dispatches.
    NSMutableArray<NSString *> *kernels = [NSMutableArray array];
    for (NSString *post in info.debugSignposts)
      if (![kernels containsObject:post]) [kernels addObject:post];
    NSString *list = kernels.count ? [kernels componentsJoinedByString:@", "] : @"no recorded dispatch";
    return [NSString stringWithFormat:@"; the fault is in %@, which dispatches %@", info.label, list];
  }
  return @"";
}

// Cuts the command buffer: what is recorded next goes into a new part, committed by the
// gates queue once `ev` >= value, so the GPU never waits on the event (no OS timeout).
CK_API int32_t ck_encode_wait_host(ck_cmdbuf *handle, ck_event *event, double value) {
  @autoreleasepool {
    if (check_encoding(handle, "wait") != CK_OK) return CK_ERROR;
    CherenkovCmdbuf *cb = CK_OBJ(CherenkovCmdbuf, handle);
    if (!event) return ck_fail(@"command buffer %u: wait: event is NULL", cb->ident);
    uint64_t v;
    if (!ck_to_u64(value, &v))
      return ck_fail(@"command buffer %u: wait: event value %.17g is not an integer in [0, 2^53]", cb->ident, value);
    id<MTLCommandBuffer> next = new_part(cb->dev);
    if (!next) return ck_fail(@"command buffer %u: wait: Metal gave no command buffer", cb->ident);
    end_encoder(cb);
    CherenkovWait *g = [CherenkovWait new];
    g->event = CK_OBJ(CherenkovEvent, event);
    g->value = v;
    g->first_grid = cb->grid_count;
    if (!cb->gates) cb->gates = [NSMutableArray array];
    [cb->gates addObject:g];
    [cb->parts addObject:next];
    next.label = [NSString stringWithFormat:@"cherenkov command buffer %u, part %lu", cb->ident, (unsigned long)cb->parts.count];
    cb->mtl = next;
    return CK_OK;
  }
}

// Runs on the device's gates queue, one command buffer at a time in commit order: commits
// each part once its gate's event is reached. The wait timeout counts from when the GPU
// reaches the gate (the part before it completes), as for a GPU wait; after a timeout the
// remaining parts are still committed (enqueued parts must be), their dispatches cancelled.
static void release_gates(CherenkovCmdbuf *cb, NSArray<id<MTLCommandBuffer>> *parts) {
  @autoreleasepool {
    CherenkovDevice *d = cb->dev;
    BOOL failed = NO;
    for (NSUInteger k = 0; k < cb->gates.count; k++) {
      CherenkovWait *g = cb->gates[k];
      if (!failed && g->event->mtl.signaledValue < g->value) {
        [parts[k] waitUntilCompleted];
        uint32_t timeout = __atomic_load_n(&d->wait_timeout_ms, __ATOMIC_RELAXED);
        if (![g->event->mtl waitUntilSignaledValue:g->value timeoutMS:timeout]) {
          [d->done lock];
          if (!cb->error)
            cb->error = [NSString stringWithFormat:@"command buffer %u: wait for event %u >= %llu timed out after %u ms",
                                                   cb->ident, g->event->ident, (unsigned long long)g->value, timeout];
          [d->done unlock];
          failed = YES;
          cancel_after(cb, g);
        }
      }
      [parts[k + 1] commit];
    }
  }
}

// One part finished; the command buffer finishes with its last part, with the first error.
static void part_done(CherenkovCmdbuf *cb, id<MTLCommandBuffer> done) {
  NSString *gpu_error = nil;
  if (done.status == MTLCommandBufferStatusError) {
    NSString *why = done.error ? done.error.localizedDescription : @"no reason given";
    gpu_error = [NSString stringWithFormat:@"command buffer %u: the GPU stopped it: %@%@", cb->ident, why, fault_site(done.error)];
  }
  CherenkovDevice *d = cb->dev;
  [d->done lock];
  if (gpu_error && !cb->part_error) cb->part_error = gpu_error;
  BOOL last = --cb->parts_left == 0;
  NSString *error = cb->part_error;
  [d->done unlock];
  if (last) ck_cmdbuf_finish(cb, error);
}

// A Metal command buffer is encoded as it comes (no replayed structure): nothing to build ahead.
CK_API int32_t ck_cmdbuf_hint(ck_cmdbuf *handle, uint32_t shape_key, int32_t prime) {
  (void)shape_key;
  (void)prime;
  return check_encoding(handle, "hint");
}

CK_API int32_t ck_cmdbuf_commit(ck_cmdbuf *handle) {
  @autoreleasepool {
    if (check_encoding(handle, "commit") != CK_OK) return CK_ERROR;
    CherenkovCmdbuf *cb = CK_OBJ(CherenkovCmdbuf, handle);
    CherenkovDevice *d = cb->dev;
    end_encoder(cb);
    [d residencyCommit];
    NSArray<id<MTLCommandBuffer>> *parts = [cb->parts copy];
    // The handlers keep cb alive until the GPU is done with it, whatever the
    // caller releases meanwhile.
    for (id<MTLCommandBuffer> part in parts)
      [part addCompletedHandler:^(id<MTLCommandBuffer> done) {
        part_done(cb, done);
      }];
    [d->done lock];
    __atomic_store_n(&cb->status, CK_CMDBUF_COMMITTED, __ATOMIC_RELEASE);
    cb->parts_left = (uint32_t)parts.count;
    d->inflight++;
    [d->done unlock];
    if (parts.count == 1) {
      [parts[0] commit];
    } else {
      for (id<MTLCommandBuffer> part in parts) [part enqueue];  // reserves the queue's order
      [parts[0] commit];
      dispatch_async(d->gates, ^{
        release_gates(cb, parts);
      });
    }
    if (cb->waits.count > 0) dispatch_async(d->watchdog, ^{
      watch_waits(cb);
    });
    return CK_OK;
  }
}

CK_API int32_t ck_cmdbuf_wait(ck_cmdbuf *handle, uint32_t timeout_ms) {
  @autoreleasepool {
    if (!handle) return ck_fail(@"ck_cmdbuf_wait: command buffer is NULL");
    CherenkovCmdbuf *cb = CK_OBJ(CherenkovCmdbuf, handle);
    if (status_of(cb) == CK_CMDBUF_ENCODING) return ck_fail(@"command buffer %u: wait before commit", cb->ident);
    CherenkovDevice *d = cb->dev;
    NSDate *deadline = [NSDate dateWithTimeIntervalSinceNow:timeout_ms / 1000.0];
    [d->done lock];
    // Every finishing command buffer broadcasts; re-check ours after each.
    while (!finished(cb) && timeout_ms > 0)
      if (![d->done waitUntilDate:deadline]) break;
    int32_t status = status_of(cb);
    NSString *error = cb->error;
    [d->done unlock];
    if (status == CK_CMDBUF_COMPLETED) return CK_OK;
    if (status == CK_CMDBUF_FAILED) return ck_fail(@"%@", error);
    return CK_TIMEOUT;
  }
}

CK_API int32_t ck_cmdbuf_status(ck_cmdbuf *cb) { return cb ? status_of(CK_OBJ(CherenkovCmdbuf, cb)) : CK_ERROR; }

CK_API const char *ck_cmdbuf_error(ck_cmdbuf *handle) {
  if (!handle) return "";
  CherenkovCmdbuf *cb = CK_OBJ(CherenkovCmdbuf, handle);
  if (status_of(cb) != CK_CMDBUF_FAILED) return "";
  return (const char *)cb->error_c.bytes;  // written before the status became FAILED
}

CK_API void ck_cmdbuf_release(ck_cmdbuf *handle) {
  @autoreleasepool {
    ck_drop_handle(handle);
  }
}

// ---- events -------------------------------------------------------------------------

CK_API ck_event *ck_event_new(ck_device *dev) {
  @autoreleasepool {
    if (!dev) return ck_fail(@"ck_event_new: device is NULL"), NULL;
    CherenkovDevice *d = CK_OBJ(CherenkovDevice, dev);
    id<MTLSharedEvent> mtl = [d->mtl newSharedEvent];
    if (!mtl) return ck_fail(@"ck_event_new: Metal gave no shared event"), NULL;
    CherenkovEvent *e = [CherenkovEvent new];
    e->mtl = mtl;
    e->ident = __atomic_fetch_add(&d->next_event_id, 1, __ATOMIC_RELAXED);
    mtl.label = [NSString stringWithFormat:@"cherenkov event %u", e->ident];
    return CK_HANDLE(ck_event, e);
  }
}

CK_API uint32_t ck_event_id(ck_event *ev) { return ev ? CK_OBJ(CherenkovEvent, ev)->ident : 0; }

CK_API double ck_event_value(ck_event *ev) { return ev ? (double)CK_OBJ(CherenkovEvent, ev)->mtl.signaledValue : 0; }

CK_API int32_t ck_event_set(ck_event *ev, double value) {
  @autoreleasepool {
    uint64_t v;
    if (!ev) return ck_fail(@"ck_event_set: event is NULL");
    CherenkovEvent *e = CK_OBJ(CherenkovEvent, ev);
    if (!ck_to_u64(value, &v)) return ck_fail(@"event %u: value %.17g is not an integer in [0, 2^53]", e->ident, value);
    // Metal changes signaledValue only to a larger value and ignores a smaller
    // one. That is cherenkov.h's rule too: after a timed-out wait the watchdog
    // has released the event and the GPU may already have signalled past the
    // host's late release, which must not turn into an error of its own.
    e->mtl.signaledValue = v;
    return CK_OK;
  }
}

CK_API int32_t ck_event_wait(ck_event *ev, double value, uint32_t timeout_ms) {
  @autoreleasepool {
    uint64_t v;
    if (!ev) return ck_fail(@"ck_event_wait: event is NULL");
    CherenkovEvent *e = CK_OBJ(CherenkovEvent, ev);
    if (!ck_to_u64(value, &v)) return ck_fail(@"event %u: value %.17g is not an integer in [0, 2^53]", e->ident, value);
    if (e->mtl.signaledValue >= v) return CK_OK;
    if (timeout_ms == 0) return CK_TIMEOUT;
    return [e->mtl waitUntilSignaledValue:v timeoutMS:timeout_ms] ? CK_OK : CK_TIMEOUT;
  }
}

CK_API void ck_event_release(ck_event *ev) {
  @autoreleasepool {
    ck_drop_handle(ev);
  }
}
