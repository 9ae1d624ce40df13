// Objects behind cherenkov.h's opaque handles, for the Metal backend.
//
// Memory management is ARC (build with -fobjc-arc). A handle given to the
// caller is an object retained once for the caller (__bridge_retained); the
// matching *_release call drops that reference (__bridge_transfer). Pipelines
// are the exception: the library owns them and hands out unretained pointers,
// valid until the library is released, as cherenkov.h says. Objects a
// committed command buffer needs are kept alive by its completion handler
// (and Metal retains the buffers and pipelines it encodes).
//
// Every entry point that may create autoreleased objects runs inside
// @autoreleasepool: bun:ffi calls arrive on threads with no pool, where
// autoreleased objects would otherwise live until the thread exits.
#pragma once
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>

#include "../include/cherenkov.h"

#define CK_INTERNAL __attribute__((visibility("hidden")))

// macOS 15 API (residency sets, mathMode, mathFloatingPointFunctions) needs two guards:
// this one at compile time, because the macOS 14 SDK (Xcode 15) does not declare those
// names at all, and @available at run time, because a library built with the macOS 15
// SDK still loads on macOS 14 (ggml-metal guards the same way).
#if defined(__MAC_OS_X_VERSION_MAX_ALLOWED) && __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000
#define CK_SDK_HAS_MACOS15 1
#else
#define CK_SDK_HAS_MACOS15 0
#endif

// A handle for the caller: one retain that the caller owns.
#define CK_HANDLE(type, obj) ((type *)(__bridge_retained void *)(obj))
// An object from a handle, without touching its retain count.
#define CK_OBJ(cls, handle) ((__bridge cls *)(void *)(handle))

// ---- errors (device.m) -------------------------------------------------------

// Sets this thread's ck_last_error() text; returns CK_ERROR.
CK_INTERNAL int32_t ck_fail(NSString *format, ...) NS_FORMAT_FUNCTION(1, 2);
// Converts a double crossing the ABI to an exact integer in [0, 2^53].
CK_INTERNAL BOOL ck_to_u64(double v, uint64_t *out);
// A NUL-terminated UTF-8 copy whose bytes stay put while the object lives.
CK_INTERNAL NSData *ck_cstring(NSString *s);
// Drops the caller's reference taken by CK_HANDLE (NULL is ignored).
CK_INTERNAL void ck_drop_handle(void *handle);
// CHERENKOV_METAL_DEBUG=1 (library.m): reflection, encoder execution status, signposts.
CK_INTERNAL BOOL ck_metal_debug(void);

// ---- objects ----------------------------------------------------------------------

CK_INTERNAL @interface CherenkovDevice : NSObject {
 @public
  id<MTLDevice> mtl;
  id<MTLCommandQueue> queue;
  NSData *name_c;
  uint32_t page_size;
  uint32_t wait_timeout_ms;  // read and written with __atomic builtins
  uint32_t next_cmdbuf_id;   // __atomic
  uint32_t next_event_id;    // __atomic
  // Guards every command buffer's status and `inflight`; broadcast whenever a
  // command buffer of this device finishes.
  NSCondition *done;
  uint32_t inflight;  // committed, not yet finished
  // Serial queue that enforces GPU event-wait timeouts, in commit order.
  dispatch_queue_t watchdog;
  // Serial queue that commits the parts after host waits (ck_encode_wait_host), in commit order.
  dispatch_queue_t gates;
  // id<MTLResidencySet> on macOS 15 and later, built with the macOS 15 SDK
  // (nil otherwise, or when disabled).
  id residency;
  NSLock *residency_lock;
  BOOL residency_dirty;
}
// Residency set bookkeeping; all no-ops without a residency set.
- (void)residencyAdd:(id<MTLBuffer>)buffer;
- (void)residencyRemove:(id<MTLBuffer>)buffer;
// Applies pending adds/removes; called before each command buffer commit.
- (void)residencyCommit;
@end

CK_INTERNAL @interface CherenkovBuffer : NSObject {
 @public
  CherenkovDevice *dev;
  id<MTLBuffer> mtl;
  void *contents;
  NSUInteger length;  // rounded to the page size
  BOOL resident;      // in the device's residency set
}
@end

CK_INTERNAL @interface CherenkovPipeline : NSObject {
 @public
  id<MTLComputePipelineState> state;
  NSString *name;
  NSData *name_c;
  NSString *where;       // "kernels/file.metal:line" of the kernel
  NSString *signpost;    // "name (where)": marks each dispatch, named back in a GPU fault
  uint32_t max_threads;  // maxTotalThreadsPerThreadgroup
  BOOL checked;          // reflection was available: the masks below are known
  uint32_t buffer_mask;  // bit i: the kernel declares [[buffer(i)]]
  uint32_t used_mask;    // bit i: ... and reads or writes it (Metal's `used`)
  uint32_t bytes0;       // size of what [[buffer(0)]] points to (the params struct)
}
@end

CK_INTERNAL @interface CherenkovLibrary : NSObject {
 @public
  CherenkovDevice *dev;
  NSString *dir;
  NSArray<NSString *> *names;  // kernel names, sorted bytewise
  NSArray<NSData *> *names_c;
  NSDictionary<NSString *, id<MTLFunction>> *functions;
  NSDictionary<NSString *, NSString *> *where;
  NSDictionary<NSString *, id<MTLLibrary>> *library_of;  // the compiled file each kernel is in
  NSMutableDictionary<NSString *, CherenkovPipeline *> *pipelines;
  NSLock *lock;
  // Pipelines compiled before, on disk (MTLBinaryArchive) keyed by a hash of every source and
  // the device; nil when off (CHERENKOV_METAL_ARCHIVE=0). Written back at release when a
  // pipeline was built. Under `lock`.
  id<MTLBinaryArchive> archive;
  NSURL *archive_url;
  NSString *archive_dir;
  BOOL archive_dirty;
}
@end

CK_INTERNAL @interface CherenkovEvent : NSObject {
 @public
  id<MTLSharedEvent> mtl;
  uint32_t ident;
}
@end

// One recorded GPU wait, for the watchdog.
CK_INTERNAL @interface CherenkovWait : NSObject {
 @public
  CherenkovEvent *event;
  uint64_t value;
  uint32_t first_grid;  // index of the first indirect grid recorded after this wait
}
@end

CK_INTERNAL @interface CherenkovCmdbuf : NSObject {
 @public
  CherenkovDevice *dev;
  id<MTLCommandBuffer> mtl;  // the part being encoded; nil once finished (breaks the handler's cycle)
  // Host waits (ck_encode_wait_host) cut the command buffer into parts: parts[k + 1] follows
  // gates[k]. All are enqueued at commit (the queue keeps their order); parts after the first
  // are committed by the device's gates queue once their gate's event is reached.
  NSMutableArray<id<MTLCommandBuffer>> *parts;
  NSMutableArray<CherenkovWait *> *gates;
  uint32_t parts_left;     // not yet completed; under dev->done
  NSString *part_error;    // the first part's GPU error; under dev->done
  id<MTLComputeCommandEncoder> enc;  // the open encoder, or nil
  id<MTLComputePipelineState> enc_pipeline;
  uint32_t encoders;  // encoders opened so far (their labels count them)
  uint32_t ident;
  int32_t status;  // CK_CMDBUF_*; written under dev->done, read with __atomic
  NSString *error;
  NSData *error_c;
  NSMutableArray<CherenkovWait *> *waits;  // in record order
  // Signalled with k just before the k-th wait (1-based), so the watchdog
  // knows when the GPU has reached it.
  id<MTLSharedEvent> arrivals;
  // Threadgroup counts of the dispatches recorded after the first wait, read
  // by the GPU (indirect dispatch) so that a timed-out wait can zero them.
  NSMutableArray<id<MTLBuffer>> *grids;
  uint32_t grid_count;
}
@end

// ---- shared helpers ----------------------------------------------------------------

// Finishes a command buffer: records the outcome, wakes waiters (commands.m).
CK_INTERNAL void ck_cmdbuf_finish(CherenkovCmdbuf *cb, NSString *gpu_error);
