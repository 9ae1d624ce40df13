/*
 * cherenkov.h: the C ABI of metal-shim, implemented by every backend
 * (metal-shim/metal over Apple's Metal, metal-shim/cpu on any POSIX CPU,
 * metal-shim/cuda on NVIDIA GPUs).
 *
 * It is a thin GPU verb set and knows nothing about language models:
 * a device, shared buffers, a kernel library with pipelines looked up by name,
 * command buffers recorded as a compact command stream (dispatch, signal event,
 * wait event), and host-side events.
 *
 * Rules that keep the ABI cheap and safe to call from bun:ffi:
 *  - Handles are opaque pointers. Hot calls take only pointers, 32-bit integers
 *    and doubles; nothing is passed or returned as a struct by value; no
 *    function is variadic.
 *  - 64-bit quantities (byte lengths, event values) cross as double: they must
 *    be non-negative integers below 2^53, else the call fails.
 *  - Functions returning int32_t return CK_OK (0) on success and CK_ERROR (-1)
 *    on failure; functions returning a handle return NULL on failure. In both
 *    cases ck_last_error() then holds a message naming what was wrong. A kernel
 *    bug the backend can detect (unknown pipeline, binding index out of range,
 *    missing buffer, threadgroup too large, params too small) is an error,
 *    never a crash.
 *  - Every handle may be released from any thread; objects used by a committed
 *    command buffer are retained by it until it completes.
 */
#ifndef CHERENKOV_H
#define CHERENKOV_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CK_API __declspec(dllexport)
#else
#define CK_API __attribute__((visibility("default")))
#endif

#define CK_ABI_VERSION 4

/* Status codes. */
#define CK_OK 0
#define CK_ERROR (-1)
#define CK_TIMEOUT 1

/* Buffer storage modes (ck_buffer_new_storage, ck_buffer_wrap_storage). */
#define CK_STORAGE_SHARED 0 /* one memory the host and the GPU both address */
#define CK_STORAGE_DEVICE 1 /* GPU memory with a host mirror, synchronised by explicit copies */

/* Command buffer states (ck_cmdbuf_status). */
#define CK_CMDBUF_ENCODING 0  /* begun, not committed */
#define CK_CMDBUF_COMMITTED 1 /* queued or running */
#define CK_CMDBUF_COMPLETED 2 /* every command ran */
#define CK_CMDBUF_FAILED 3    /* stopped at a failing command: see ck_cmdbuf_error */

/* Hard limits shared by all backends (Metal's). */
#define CK_MAX_BUFFER_BINDINGS 31 /* buffer indices 0..30 */
#define CK_MAX_PARAMS_BYTES 4096  /* setBytes limit */

typedef struct ck_device ck_device;
typedef struct ck_buffer ck_buffer;
typedef struct ck_library ck_library;
typedef struct ck_pipeline ck_pipeline;
typedef struct ck_cmdbuf ck_cmdbuf;
typedef struct ck_event ck_event;

/* One buffer binding, read through a pointer (never passed by value).
 * 16 bytes: the buffer handle (NULL = unbound) and a byte offset into it. */
typedef struct ck_binding {
  ck_buffer *buffer;
  uint64_t offset;
} ck_binding;

/* ---- errors ------------------------------------------------------------ */

/* Message of the last failed call on this OS thread ("" if none). Valid until
 * the next failing call on the same thread. */
CK_API const char *ck_last_error(void);

/* CK_ABI_VERSION of the library (check it before anything else). */
CK_API int32_t ck_abi_version(void);

/* ---- device ------------------------------------------------------------ */

/* Opens the default device. The CPU backend starts its command queue thread
 * here; its worker pool has CHERENKOV_CPU_THREADS threads (default: all
 * cores). */
CK_API ck_device *ck_device_open(void);
/* Waits for committed command buffers to finish, then frees the device.
 * Buffers, libraries and events of the device must not be used afterwards. */
CK_API void ck_device_close(ck_device *dev);

/* "metal", "cpu" or "cuda". */
CK_API const char *ck_device_backend(ck_device *dev);
/* Human-readable device name (e.g. "Apple M3 Max", "cpu x86_64 (16 threads)"). */
CK_API const char *ck_device_name(ck_device *dev);
/* Bytes the device can keep resident (Metal: recommendedMaxWorkingSetSize;
 * cpu: 3/4 of physical memory). */
CK_API double ck_device_max_working_set(ck_device *dev);
/* Bytes of threadgroup memory a threadgroup may use (32768). */
CK_API uint32_t ck_device_max_threadgroup_memory(ck_device *dev);
/* Threads per threadgroup a dispatch may use (1024). */
CK_API uint32_t ck_device_max_threads_per_threadgroup(ck_device *dev);
/* Threads per SIMD group (32). */
CK_API uint32_t ck_device_simd_width(ck_device *dev);
/* Buffer alignment and length granule: the VM page size (16384 on Apple
 * silicon, usually 4096 elsewhere). */
CK_API uint32_t ck_device_page_size(ck_device *dev);
/* Device limits, read with ck_device_limit (one call, so new limits need no new symbol). */
#define CK_LIMIT_MAX_BUFFER_LENGTH 0 /* bytes of the largest single buffer (Metal: maxBufferLength;
                                        cpu: CHERENKOV_CPU_MAX_BUFFER_LENGTH, else 2^53) */
#define CK_LIMIT_MAX_WORKING_SET 1   /* = ck_device_max_working_set */
#define CK_LIMIT_PAGE_SIZE 2         /* = ck_device_page_size */
#define CK_LIMIT_EXECUTION_WIDTH 3   /* threads per SIMD group (Metal: a pipeline's threadExecutionWidth) */
#define CK_LIMIT_GPU_CORES 4         /* GPU cores (cuda: SMs; cpu: worker threads); 0 = unknown */
#define CK_LIMIT_MAX_THREADS_PER_THREADGROUP 5 /* = ck_device_max_threads_per_threadgroup */
#define CK_LIMIT_MAX_THREADGROUP_MEMORY 6      /* = ck_device_max_threadgroup_memory */
#define CK_LIMIT_GPU_WAIT_LIMIT_MS 7 /* how long the OS lets a GPU-side event wait block before it
                                        fails the command buffer itself; 0 = none known */
#define CK_LIMIT_COUNT 8
/* The limit numbered `limit` (CK_LIMIT_*), or -1 with ck_last_error() set for an unknown number
 * or a NULL device. */
CK_API double ck_device_limit(ck_device *dev, int32_t limit);
/* How long a GPU-side event wait may block before its command buffer fails
 * (default 10000 ms). The Metal backend enforces it from the host: a wait that
 * outlives it fails the command buffer on completion. */
CK_API void ck_device_set_wait_timeout(ck_device *dev, uint32_t timeout_ms);

/* ---- buffers ----------------------------------------------------------- */

/* A new zero-filled buffer shared by host and GPU, page-aligned, its length
 * rounded up to the page size. */
CK_API ck_buffer *ck_buffer_new(ck_device *dev, double length);
/* Wraps host memory without copying (Metal: newBufferWithBytesNoCopy). `ptr`
 * must be page-aligned (a mmap result is); `length` is rounded up to the page
 * size and those pages must stay mapped until the buffer is released. The
 * caller keeps ownership of the memory. */
CK_API ck_buffer *ck_buffer_wrap(ck_device *dev, void *ptr, double length);
/* Host address of the buffer's first byte (stable for its lifetime). */
CK_API void *ck_buffer_contents(ck_buffer *buf);
/* Length in bytes (after rounding). */
CK_API double ck_buffer_length(ck_buffer *buf);
CK_API void ck_buffer_release(ck_buffer *buf);

/* Storage modes. Where host and GPU share memory (Metal on Apple silicon, cpu) every buffer
 * is CK_STORAGE_SHARED and these calls are the plain ones. Where they do not (cuda), a
 * CK_STORAGE_DEVICE buffer lives in GPU memory (HBM) and ck_buffer_contents() is its host
 * mirror: host writes reach the GPU only through ck_buffer_upload, GPU writes reach the
 * mirror only through ck_buffer_download (Metal's managed mode: didModifyRange,
 * synchronizeResource). A SHARED buffer on cuda is pinned host memory the GPU reads over
 * the bus: right for what the host reads or writes mid-step, slow for bulk data. */
/* ck_buffer_new with a storage mode (zero-filled on both sides). */
CK_API ck_buffer *ck_buffer_new_storage(ck_device *dev, double length, int32_t storage);
/* ck_buffer_wrap with a storage mode. CK_STORAGE_DEVICE copies the bytes to GPU memory now
 * and uses `ptr` as the mirror (the caller keeps it mapped while the buffer lives). */
CK_API ck_buffer *ck_buffer_wrap_storage(ck_device *dev, void *ptr, double length, int32_t storage);
/* Where the buffer lives: CK_STORAGE_SHARED or CK_STORAGE_DEVICE. */
CK_API int32_t ck_buffer_storage(ck_buffer *buf);
/* Copies [offset, offset+length) of the mirror to GPU memory; returns when the bytes are
 * there, so command buffers committed or released afterwards see them. A no-op on SHARED. */
CK_API int32_t ck_buffer_upload(ck_buffer *buf, double offset, double length);
/* Copies [offset, offset+length) of GPU memory to the mirror; the caller first waits for the
 * command buffers that wrote it. A no-op on SHARED. */
CK_API int32_t ck_buffer_download(ck_buffer *buf, double offset, double length);

/* ---- kernels ----------------------------------------------------------- */

/* Loads the kernel library. Metal: compiles every *.metal file in `dir`
 * (cached). cpu: the kernels compiled into the shim when it was built;
 * `dir` is ignored (may be NULL). */
CK_API ck_library *ck_library_load(ck_device *dev, const char *dir);
/* Pipelines obtained from the library stay valid until it is released. */
CK_API void ck_library_release(ck_library *lib);
/* Number of kernels in the library and the name of kernel i (sorted). */
CK_API uint32_t ck_library_kernel_count(ck_library *lib);
CK_API const char *ck_library_kernel_name(ck_library *lib, uint32_t index);
/* The pipeline of the kernel named `name` (its [[host_name]] if it has one),
 * or NULL with "pipeline not found: <name>". Function constants are not part
 * of the ABI: variants are separate kernels (see kernels/README.md). */
CK_API ck_pipeline *ck_pipeline_get(ck_library *lib, const char *name);
CK_API const char *ck_pipeline_name(ck_pipeline *pipe);
/* Largest threadgroup (threads) this pipeline can be dispatched with. */
CK_API uint32_t ck_pipeline_max_threads(ck_pipeline *pipe);

/* ---- command buffers (hot path) --------------------------------------- */

/* A new command buffer in the ENCODING state. Every command buffer gets an id
 * (1, 2, ...) that error messages use. */
CK_API ck_cmdbuf *ck_cmdbuf_begin(ck_device *dev);
CK_API uint32_t ck_cmdbuf_id(ck_cmdbuf *cb);

/* Records a dispatch of `grid_x*grid_y*grid_z` threadgroups of
 * `tg_x*tg_y*tg_z` threads (Metal: dispatchThreadgroups).
 * bindings[i] binds [[buffer(i)]] for i < binding_count; a NULL buffer leaves
 * the index unbound. When params_len > 0 the `params_len` bytes at `params`
 * are copied into the command and bound at [[buffer(0)]] (setBytes), and
 * bindings[0] must then be unbound. Dispatches of one command buffer run in
 * order and each sees the memory writes of the ones before it.
 * Fails (nothing recorded) when the pipeline is NULL, the threadgroup is empty
 * or larger than the pipeline allows, binding_count > 31, a buffer the kernel
 * declares is unbound, a binding is past the kernel's last buffer, an offset
 * is past its buffer's end, or params are shorter than the struct the kernel
 * reads or longer than 4096 bytes. */
CK_API int32_t ck_encode_dispatch(ck_cmdbuf *cb, ck_pipeline *pipe,
                                  uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                                  uint32_t tg_x, uint32_t tg_y, uint32_t tg_z,
                                  const ck_binding *bindings, uint32_t binding_count,
                                  const void *params, uint32_t params_len);
/* As ck_encode_dispatch, but grid_* count threads, not threadgroups
 * (Metal: dispatchThreads): the last threadgroup along an axis may be partial
 * and its [[threads_per_threadgroup]] reports the partial size. */
CK_API int32_t ck_encode_dispatch_threads(ck_cmdbuf *cb, ck_pipeline *pipe,
                                          uint32_t threads_x, uint32_t threads_y, uint32_t threads_z,
                                          uint32_t tg_x, uint32_t tg_y, uint32_t tg_z,
                                          const ck_binding *bindings, uint32_t binding_count,
                                          const void *params, uint32_t params_len);
/* Encodes a run of dispatches recorded as words (cherenkov_tape.h: a replayed step of
 * lib/gpu/tape.ts), as if each were passed to ck_encode_dispatch or
 * ck_encode_dispatch_threads in order, with the same checks. Stops at the first
 * failing command (the ones before it stay recorded) or at a malformed tape
 * (CK_ERROR, "ck_encode_tape: ..."). */
CK_API int32_t ck_encode_tape(ck_cmdbuf *cb, const uint32_t *words, uint32_t word_count);
/* Records "set event to value" after every earlier command has finished
 * (a value below the event's current one is ignored, as ck_event_set). */
CK_API int32_t ck_encode_signal(ck_cmdbuf *cb, ck_event *ev, double value);
/* Records "block until event >= value" before any later command starts. A
 * wait longer than the device's wait timeout fails the command buffer with
 * "command buffer C: wait for event E >= V timed out after T ms". */
CK_API int32_t ck_encode_wait(ck_cmdbuf *cb, ck_event *ev, double value);
/* As ck_encode_wait, but the GPU never blocks on it: the commands recorded after it reach the
 * GPU only once the event is >= value, submitted by the host (Metal: the command buffer is cut
 * there and the next part, enqueued at commit to keep the queue's order, is committed when the
 * event is reached). For waits that may outlast what the OS lets a GPU wait for an event
 * (CK_LIMIT_GPU_WAIT_LIMIT_MS); it costs a submission per wait. The device's wait timeout and
 * its message are the same. cpu: as ck_encode_wait, exempt from the emulated OS limit; cuda:
 * ck_encode_wait (the driver has no such limit). */
CK_API int32_t ck_encode_wait_host(ck_cmdbuf *cb, ck_event *ev, double value);
/* A hint for a backend that replays command buffers it has seen (cuda: CUDA graphs; cpu and
 * metal ignore it). `shape_key` (nonzero) names the recording the command buffer was encoded
 * from: command buffers of one key share a replayed structure, those of different keys each get
 * their own (0: no key). With `prime` nonzero, the replayed structure of what is encoded so far
 * is built ahead, in the background, unless one of that structure (its commands' kinds and
 * kernels, and the key) exists or is being built: call it after the last command; the command
 * buffer may then be committed or released as usual. */
CK_API int32_t ck_cmdbuf_hint(ck_cmdbuf *cb, uint32_t shape_key, int32_t prime);
/* Queues the command buffer; command buffers run in commit order. */
CK_API int32_t ck_cmdbuf_commit(ck_cmdbuf *cb);
/* Blocks until the command buffer completes or fails, at most timeout_ms
 * (0 = just poll). Returns CK_OK (completed), CK_TIMEOUT (still pending) or
 * CK_ERROR (failed: ck_last_error() is set to ck_cmdbuf_error()). */
CK_API int32_t ck_cmdbuf_wait(ck_cmdbuf *cb, uint32_t timeout_ms);
/* One of CK_CMDBUF_*. */
CK_API int32_t ck_cmdbuf_status(ck_cmdbuf *cb);
/* Why the command buffer failed ("" unless FAILED). */
CK_API const char *ck_cmdbuf_error(ck_cmdbuf *cb);
/* Drops the caller's reference; a committed command buffer still runs. */
CK_API void ck_cmdbuf_release(ck_cmdbuf *cb);

/* ---- events ------------------------------------------------------------ */

/* A shared event (Metal: MTLSharedEvent) with value 0 and an id (1, 2, ...). */
CK_API ck_event *ck_event_new(ck_device *dev);
CK_API uint32_t ck_event_id(ck_event *ev);
CK_API double ck_event_value(ck_event *ev);
/* Sets the value from the host; releases GPU waits for values <= value.
 * The value only moves forward (Apple's rule for MTLSharedEvent): a value
 * below the current one is ignored and still returns CK_OK. */
CK_API int32_t ck_event_set(ck_event *ev, double value);
/* Blocks the calling thread until value >= `value`, at most timeout_ms.
 * Returns CK_OK or CK_TIMEOUT. */
CK_API int32_t ck_event_wait(ck_event *ev, double value, uint32_t timeout_ms);
CK_API void ck_event_release(ck_event *ev);

#ifdef __cplusplus
}
#endif

#endif /* CHERENKOV_H */
