// cherenkov.h over Metal: errors, the device, buffers and the residency set.
#import "shim.h"

// ---- errors ------------------------------------------------------------------------

static _Thread_local char ck_error_text[1024];

int32_t ck_fail(NSString *format, ...) {
  va_list ap;
  va_start(ap, format);
  NSString *message = [[NSString alloc] initWithFormat:format arguments:ap];
  va_end(ap);
  NSData *bytes = [message dataUsingEncoding:NSUTF8StringEncoding allowLossyConversion:YES];
  NSUInteger n = bytes.length < sizeof ck_error_text - 1 ? bytes.length : sizeof ck_error_text - 1;
  [bytes getBytes:ck_error_text length:n];
  ck_error_text[n] = 0;
  return CK_ERROR;
}

BOOL ck_to_u64(double v, uint64_t *out) {
  // Rejects NaN, negatives, fractions and anything past 2^53 (where doubles
  // stop being exact integers).
  if (!(v >= 0.0) || v > 9007199254740992.0 || (double)(uint64_t)v != v) return NO;
  *out = (uint64_t)v;
  return YES;
}

NSData *ck_cstring(NSString *s) {
  NSMutableData *d = [NSMutableData dataWithCapacity:[s lengthOfBytesUsingEncoding:NSUTF8StringEncoding] + 1];
  NSData *utf8 = [s dataUsingEncoding:NSUTF8StringEncoding allowLossyConversion:YES];
  if (utf8) [d appendData:utf8];
  const char nul = 0;
  [d appendBytes:&nul length:1];
  return d;
}

void ck_drop_handle(void *handle) {
  if (!handle) return;
  id object = (__bridge_transfer id)handle;
  (void)object;  // released at the end of this scope
}

CK_API const char *ck_last_error(void) { return ck_error_text; }
CK_API int32_t ck_abi_version(void) { return CK_ABI_VERSION; }

// ---- device ------------------------------------------------------------------------

@implementation CherenkovDevice

- (void)residencyAdd:(id<MTLBuffer>)buffer {
  if (!residency) return;
#if CK_SDK_HAS_MACOS15
  if (@available(macOS 15.0, *)) {
    [residency_lock lock];
    [(id<MTLResidencySet>)residency addAllocation:buffer];
    residency_dirty = YES;
    [residency_lock unlock];
  }
#endif
}

- (void)residencyRemove:(id<MTLBuffer>)buffer {
  if (!residency) return;
#if CK_SDK_HAS_MACOS15
  if (@available(macOS 15.0, *)) {
    [residency_lock lock];
    [(id<MTLResidencySet>)residency removeAllocation:buffer];
    residency_dirty = YES;
    [residency_lock unlock];
  }
#endif
}

- (void)residencyCommit {
  if (!residency) return;
#if CK_SDK_HAS_MACOS15
  if (@available(macOS 15.0, *)) {
    [residency_lock lock];
    if (residency_dirty) {
      // commit applies the batch; requestResidency asks for it now rather
      // than at the next command buffer that needs it.
      [(id<MTLResidencySet>)residency commit];
      [(id<MTLResidencySet>)residency requestResidency];
      residency_dirty = NO;
    }
    [residency_lock unlock];
  }
#endif
}

@end

// One residency set per device, attached to its queue (macOS 15+): every
// buffer from ck_buffer_new (the expert pool's wired slots, activations, KV)
// joins it, so it stays resident across command buffers instead of being made
// resident again by each one. Wrapped buffers (mapped files) stay out: their
// pages belong to the page cache, and the "mapped" pool backing relies on the
// OS deciding. CHERENKOV_METAL_RESIDENCY=0 turns the set off (for measuring).
// Built with the macOS 14 SDK there is no set: buffers are made resident per
// command buffer, as on macOS 14.
static void open_residency_set(CherenkovDevice *d) {
  NSString *flag = NSProcessInfo.processInfo.environment[@"CHERENKOV_METAL_RESIDENCY"];
  if (flag && [flag isEqualToString:@"0"]) return;
#if CK_SDK_HAS_MACOS15
  if (@available(macOS 15.0, *)) {
    MTLResidencySetDescriptor *desc = [MTLResidencySetDescriptor new];
    desc.label = @"cherenkov buffers";
    NSError *error = nil;
    id<MTLResidencySet> set = [d->mtl newResidencySetWithDescriptor:desc error:&error];
    if (!set) return;  // keep going without: bound buffers are still made resident per command buffer
    [d->queue addResidencySet:set];
    d->residency = set;
  }
#else
  (void)d;
#endif
}

CK_API ck_device *ck_device_open(void) {
  @autoreleasepool {
    id<MTLDevice> mtl = MTLCreateSystemDefaultDevice();
    if (!mtl) return ck_fail(@"ck_device_open: no Metal device (MTLCreateSystemDefaultDevice returned nil)"), NULL;
    id<MTLCommandQueue> queue = [mtl newCommandQueue];
    if (!queue) return ck_fail(@"ck_device_open: %@ gave no command queue", mtl.name), NULL;
    CherenkovDevice *d = [CherenkovDevice new];
    d->mtl = mtl;
    d->queue = queue;
    queue.label = @"cherenkov";
    d->name_c = ck_cstring(mtl.name);
    d->page_size = (uint32_t)NSPageSize();
    d->wait_timeout_ms = 10000;
    d->next_cmdbuf_id = 1;
    d->next_event_id = 1;
    d->done = [NSCondition new];
    d->watchdog = dispatch_queue_create("cherenkov.metal.watchdog", DISPATCH_QUEUE_SERIAL);
    d->gates = dispatch_queue_create("cherenkov.metal.gates", DISPATCH_QUEUE_SERIAL);
    d->residency_lock = [NSLock new];
    open_residency_set(d);
    return CK_HANDLE(ck_device, d);
  }
}

CK_API void ck_device_close(ck_device *dev) {
  if (!dev) return;
  @autoreleasepool {
    CherenkovDevice *d = CK_OBJ(CherenkovDevice, dev);
    // Wait for committed work. A command buffer blocked on an event is freed
    // by the watchdog after the wait timeout, so this cannot hang forever on
    // an event the host never sets.
    [d->done lock];
    while (d->inflight > 0) [d->done wait];
    [d->done unlock];
#if CK_SDK_HAS_MACOS15
    if (@available(macOS 15.0, *)) {
      if (d->residency) {
        [(id<MTLResidencySet>)d->residency endResidency];
        [d->queue removeResidencySet:(id<MTLResidencySet>)d->residency];
      }
    }
#endif
  }
  ck_drop_handle(dev);
}

CK_API const char *ck_device_backend(ck_device *dev) {
  (void)dev;
  return "metal";
}

CK_API const char *ck_device_name(ck_device *dev) {
  return dev ? (const char *)CK_OBJ(CherenkovDevice, dev)->name_c.bytes : "";
}

CK_API double ck_device_max_working_set(ck_device *dev) {
  return dev ? (double)CK_OBJ(CherenkovDevice, dev)->mtl.recommendedMaxWorkingSetSize : 0;
}

CK_API uint32_t ck_device_max_threadgroup_memory(ck_device *dev) {
  return dev ? (uint32_t)CK_OBJ(CherenkovDevice, dev)->mtl.maxThreadgroupMemoryLength : 0;
}

CK_API uint32_t ck_device_max_threads_per_threadgroup(ck_device *dev) {
  return dev ? (uint32_t)CK_OBJ(CherenkovDevice, dev)->mtl.maxThreadsPerThreadgroup.width : 0;
}

// Every Apple-silicon GPU executes SIMD groups of 32 threads.
CK_API uint32_t ck_device_simd_width(ck_device *dev) { return dev ? 32 : 0; }

CK_API uint32_t ck_device_page_size(ck_device *dev) {
  return dev ? CK_OBJ(CherenkovDevice, dev)->page_size : 0;
}

// The OS's limit on one GPU-side event wait is not published (MTLCommandBufferErrorTimeout
// names "waiting for another workload to signal an MTLEvent" as a cause, with no number):
// CHERENKOV_METAL_GPU_WAIT_LIMIT_MS reports one measured on this Mac (docs/metal.md).
static uint32_t gpu_wait_limit_ms(void) {
  NSString *text = NSProcessInfo.processInfo.environment[@"CHERENKOV_METAL_GPU_WAIT_LIMIT_MS"];
  long long v = text ? text.longLongValue : 0;
  return v > 0 && v <= 3600000 ? (uint32_t)v : 0;
}

CK_API double ck_device_limit(ck_device *dev, int32_t limit) {
  if (!dev) return ck_fail(@"ck_device_limit: device is NULL"), -1;
  CherenkovDevice *d = CK_OBJ(CherenkovDevice, dev);
  switch (limit) {
    case CK_LIMIT_MAX_BUFFER_LENGTH: return (double)d->mtl.maxBufferLength;
    case CK_LIMIT_MAX_WORKING_SET: return (double)d->mtl.recommendedMaxWorkingSetSize;
    case CK_LIMIT_PAGE_SIZE: return d->page_size;
    case CK_LIMIT_EXECUTION_WIDTH: return 32;  // every Apple-silicon GPU; pipelines report theirs too
    case CK_LIMIT_GPU_CORES: return 0;         // not in Metal's API (`cherenkov doctor` reads IOKit's registry)
    case CK_LIMIT_MAX_THREADS_PER_THREADGROUP: return (double)d->mtl.maxThreadsPerThreadgroup.width;
    case CK_LIMIT_MAX_THREADGROUP_MEMORY: return (double)d->mtl.maxThreadgroupMemoryLength;
    case CK_LIMIT_GPU_WAIT_LIMIT_MS: return gpu_wait_limit_ms();
    default: return ck_fail(@"ck_device_limit: unknown limit %d (0 to %d)", limit, CK_LIMIT_COUNT - 1), -1;
  }
}

CK_API void ck_device_set_wait_timeout(ck_device *dev, uint32_t timeout_ms) {
  if (dev) __atomic_store_n(&CK_OBJ(CherenkovDevice, dev)->wait_timeout_ms, timeout_ms, __ATOMIC_RELAXED);
}

// ---- buffers ------------------------------------------------------------------------

@implementation CherenkovBuffer
- (void)dealloc {
  if (resident) [dev residencyRemove:mtl];
}
@end

static BOOL checked_length(ck_device *dev, double length, const char *fn, NSUInteger *out) {
  uint64_t n;
  if (!dev) return ck_fail(@"%s: device is NULL", fn), NO;
  if (!ck_to_u64(length, &n) || n == 0)
    return ck_fail(@"%s: length %.17g is not a positive integer below 2^53", fn, length), NO;
  CherenkovDevice *d = CK_OBJ(CherenkovDevice, dev);
  uint64_t page = d->page_size;
  uint64_t rounded = (n + page - 1) / page * page;
  if (rounded > d->mtl.maxBufferLength)
    return ck_fail(@"%s: %llu bytes is more than this device's largest buffer (%llu bytes)", fn,
                   (unsigned long long)rounded, (unsigned long long)d->mtl.maxBufferLength), NO;
  *out = (NSUInteger)rounded;
  return YES;
}

CK_API ck_buffer *ck_buffer_new(ck_device *dev, double length) {
  @autoreleasepool {
    NSUInteger n;
    if (!checked_length(dev, length, "ck_buffer_new", &n)) return NULL;
    CherenkovDevice *d = CK_OBJ(CherenkovDevice, dev);
    // Shared storage: one allocation both the CPU and the GPU address; Metal
    // zero-fills it. Hazard tracking stays on, so later dispatches of a
    // command buffer see earlier writes.
    id<MTLBuffer> mtl = [d->mtl newBufferWithLength:n options:MTLResourceStorageModeShared];
    if (mtl && ((uintptr_t)mtl.contents % d->page_size) != 0) {
      // The ABI promises page alignment (O_DIRECT/F_NOCACHE reads land in
      // these buffers); if Metal ever returns less, allocate pages ourselves.
      void *pages = NSAllocateMemoryPages(n);
      mtl = pages ? [d->mtl newBufferWithBytesNoCopy:pages
                                              length:n
                                             options:MTLResourceStorageModeShared
                                         deallocator:^(void *pointer, NSUInteger bytes) {
                                           NSDeallocateMemoryPages(pointer, bytes);
                                         }]
                  : nil;
      if (pages && !mtl) NSDeallocateMemoryPages(pages, n);
    }
    if (!mtl) return ck_fail(@"ck_buffer_new: cannot allocate %lu bytes", (unsigned long)n), NULL;
    CherenkovBuffer *b = [CherenkovBuffer new];
    b->dev = d;
    b->mtl = mtl;
    b->contents = mtl.contents;
    b->length = n;
    if (d->residency) {
      [d residencyAdd:mtl];
      b->resident = YES;
    }
    return CK_HANDLE(ck_buffer, b);
  }
}

CK_API ck_buffer *ck_buffer_wrap(ck_device *dev, void *ptr, double length) {
  @autoreleasepool {
    NSUInteger n;
    if (!checked_length(dev, length, "ck_buffer_wrap", &n)) return NULL;
    CherenkovDevice *d = CK_OBJ(CherenkovDevice, dev);
    if (!ptr || (uintptr_t)ptr % d->page_size != 0)
      return ck_fail(@"ck_buffer_wrap: pointer %p is not page-aligned (page size %u)", ptr, d->page_size), NULL;
    // No deallocator: the caller owns the memory (a mapping of dense.bin).
    id<MTLBuffer> mtl = [d->mtl newBufferWithBytesNoCopy:ptr
                                                  length:n
                                                 options:MTLResourceStorageModeShared
                                             deallocator:nil];
    if (!mtl)
      return ck_fail(@"ck_buffer_wrap: Metal could not wrap %lu bytes at %p (are all of its pages mapped?)",
                     (unsigned long)n, ptr), NULL;
    CherenkovBuffer *b = [CherenkovBuffer new];
    b->dev = d;
    b->mtl = mtl;
    b->contents = ptr;
    b->length = n;
    return CK_HANDLE(ck_buffer, b);
  }
}

CK_API void *ck_buffer_contents(ck_buffer *buf) {
  return buf ? CK_OBJ(CherenkovBuffer, buf)->contents : NULL;
}

CK_API double ck_buffer_length(ck_buffer *buf) {
  return buf ? (double)CK_OBJ(CherenkovBuffer, buf)->length : 0;
}

CK_API void ck_buffer_release(ck_buffer *buf) {
  @autoreleasepool {
    ck_drop_handle(buf);
  }
}
