// cherenkov.h for the CPU backend: errors, device, buffers, library.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime.h"

using ck::set_error;

ck_buffer::~ck_buffer() {
  if (owned && data) munmap(data, length);
  if (mirror_owned && mirror) munmap(mirror, length);
}

void ck_buffer_unref(ck_buffer *b) {
  if (b && b->drop()) delete b;
}

static bool checked_length(ck_device *dev, double length, const char *fn, size_t &out) {
  uint64_t n;
  if (!dev) return set_error("%s: device is NULL", fn), false;
  if (!ck::to_u64(length, n) || n == 0)
    return set_error("%s: length %.17g is not a positive integer below 2^53", fn, length), false;
  uint64_t page = dev->page_size;
  uint64_t rounded = (n + page - 1) / page * page;
  // Metal's wording (metal-shim/metal/device.m), so messages match across backends.
  if (double(rounded) > dev->max_buffer_length)
    return set_error("%s: %llu bytes is more than this device's largest buffer (%.0f bytes)", fn,
                     static_cast<unsigned long long>(rounded), dev->max_buffer_length), false;
  out = size_t(rounded);
  return true;
}

extern "C" {

CK_API const char *ck_last_error(void) { return ck::last_error.c_str(); }
CK_API int32_t ck_abi_version(void) { return CK_ABI_VERSION; }

// ---- device ---------------------------------------------------------------

CK_API ck_device *ck_device_open(void) {
  auto *dev = new ck_device();
  long page = sysconf(_SC_PAGESIZE);
  long pages = sysconf(_SC_PHYS_PAGES);
  dev->os_page_size = page > 0 ? uint32_t(page) : 4096;
  dev->page_size = dev->os_page_size;
  dev->working_set = pages > 0 ? double(pages) * double(dev->os_page_size) * 0.75 : 0;
  // CHERENKOV_CPU_PAGE_SIZE=16384 reports and rounds buffers to Apple silicon's
  // 16 KiB pages on a 4 KiB machine, so tests meet the page size a Mac has.
  if (const char *env = std::getenv("CHERENKOV_CPU_PAGE_SIZE")) {
    char *end = nullptr;
    unsigned long v = std::strtoul(env, &end, 10);
    if (!*env || *end || v < dev->os_page_size || v > (1ul << 24) || (v & (v - 1)) || v % dev->os_page_size) {
      set_error("CHERENKOV_CPU_PAGE_SIZE=%s: expected a power of two from this machine's page size (%u) to 16777216",
                env, dev->os_page_size);
      delete dev;
      return nullptr;
    }
    dev->page_size = uint32_t(v);
  }
  if (const char *env = std::getenv("CHERENKOV_CPU_MAX_THREADS")) {
    char *end = nullptr;
    unsigned long v = std::strtoul(env, &end, 10);
    if (!*env || *end || v < ck::kSimdWidth || v > ck::kMaxThreads || v % ck::kSimdWidth) {
      set_error("CHERENKOV_CPU_MAX_THREADS=%s: expected a multiple of %u from %u to %u", env, ck::kSimdWidth,
                ck::kSimdWidth, ck::kMaxThreads);
      delete dev;
      return nullptr;
    }
    dev->pipeline_max_threads = uint32_t(v);
  }
  // CHERENKOV_CPU_MAX_BUFFER_LENGTH=N refuses buffers over N bytes, as Metal does past
  // maxBufferLength, so a pool or mapping that must span several buffers is tested here.
  if (const char *env = std::getenv("CHERENKOV_CPU_MAX_BUFFER_LENGTH")) {
    char *end = nullptr;
    unsigned long long v = std::strtoull(env, &end, 10);
    if (!*env || *end || v < dev->page_size || v % dev->page_size || v > (1ull << 53)) {
      set_error("CHERENKOV_CPU_MAX_BUFFER_LENGTH=%s: expected a multiple of the page size (%u) up to 2^53", env,
                dev->page_size);
      delete dev;
      return nullptr;
    }
    dev->max_buffer_length = double(v);
  }
  if (const char *env = std::getenv("CHERENKOV_CPU_GPU_WAIT_LIMIT_MS")) {
    char *end = nullptr;
    unsigned long v = std::strtoul(env, &end, 10);
    if (!*env || *end || v < 1 || v > 3600000) {
      set_error("CHERENKOV_CPU_GPU_WAIT_LIMIT_MS=%s: expected milliseconds from 1 to 3600000", env);
      delete dev;
      return nullptr;
    }
    dev->gpu_wait_limit_ms = uint32_t(v);
  }
  if (const char *env = std::getenv("CHERENKOV_CPU_DEVICE_MIRROR")) dev->device_mirror = std::strcmp(env, "1") == 0;
  unsigned n = std::thread::hardware_concurrency();
  if (const char *env = std::getenv("CHERENKOV_CPU_THREADS")) {
    int v = std::atoi(env);
    if (v < 1 || v > 1024) {
      set_error("CHERENKOV_CPU_THREADS=%s: expected a thread count from 1 to 1024", env);
      delete dev;
      return nullptr;
    }
    n = unsigned(v);
  }
  dev->threads = n ? n : 1;
#if defined(__x86_64__)
  const char *arch = "x86_64";
#else
  const char *arch = "arm64";
#endif
  char name[64];
  std::snprintf(name, sizeof name, "cpu %s (%u threads)", arch, dev->threads);
  dev->name = name;
  dev->pool.reset(new ck::Pool(dev->threads));
  ck_queue_start(dev);
  return dev;
}

CK_API void ck_device_close(ck_device *dev) {
  if (!dev) return;
  ck_queue_stop(dev);
  delete dev;
}

CK_API const char *ck_device_backend(ck_device *) { return "cpu"; }
CK_API const char *ck_device_name(ck_device *dev) { return dev ? dev->name.c_str() : ""; }
CK_API double ck_device_max_working_set(ck_device *dev) { return dev ? dev->working_set : 0; }
CK_API uint32_t ck_device_max_threadgroup_memory(ck_device *) { return 32768; }
CK_API uint32_t ck_device_max_threads_per_threadgroup(ck_device *) { return ck::kMaxThreads; }
CK_API uint32_t ck_device_simd_width(ck_device *) { return ck::kSimdWidth; }
CK_API uint32_t ck_device_page_size(ck_device *dev) { return dev ? dev->page_size : 0; }
CK_API double ck_device_limit(ck_device *dev, int32_t limit) {
  if (!dev) return set_error("ck_device_limit: device is NULL"), -1;
  switch (limit) {
    case CK_LIMIT_MAX_BUFFER_LENGTH: return dev->max_buffer_length;
    case CK_LIMIT_MAX_WORKING_SET: return dev->working_set;
    case CK_LIMIT_PAGE_SIZE: return dev->page_size;
    case CK_LIMIT_EXECUTION_WIDTH: return ck::kSimdWidth;
    case CK_LIMIT_GPU_CORES: return dev->threads;  // the worker threads that run threadgroups
    case CK_LIMIT_MAX_THREADS_PER_THREADGROUP: return ck::kMaxThreads;
    case CK_LIMIT_MAX_THREADGROUP_MEMORY: return 32768;
    case CK_LIMIT_GPU_WAIT_LIMIT_MS: return dev->gpu_wait_limit_ms;
    default: return set_error("ck_device_limit: unknown limit %d (0 to %d)", limit, CK_LIMIT_COUNT - 1), -1;
  }
}
CK_API void ck_device_set_wait_timeout(ck_device *dev, uint32_t timeout_ms) {
  if (dev) dev->wait_timeout_ms.store(timeout_ms);
}

// ---- buffers ----------------------------------------------------------------

CK_API ck_buffer *ck_buffer_new(ck_device *dev, double length) {
  size_t n;
  if (!checked_length(dev, length, "ck_buffer_new", n)) return nullptr;
  // Aligned to the reported page size: when it is larger than the OS page
  // (emulated 16 KiB pages), map extra and unmap the ends.
  size_t slack = dev->page_size - dev->os_page_size;
  void *raw = mmap(nullptr, n + slack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    set_error("ck_buffer_new: cannot allocate %zu bytes: %s", n, std::strerror(errno));
    return nullptr;
  }
  uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (start + dev->page_size - 1) / dev->page_size * dev->page_size;
  if (aligned > start) munmap(raw, aligned - start);
  if (start + slack > aligned) munmap(reinterpret_cast<void *>(aligned + n), start + slack - aligned);
  void *p = reinterpret_cast<void *>(aligned);
  auto *b = new ck_buffer();
  b->data = static_cast<char *>(p);
  b->length = n;
  b->owned = true;
  return b;
}

CK_API ck_buffer *ck_buffer_wrap(ck_device *dev, void *ptr, double length) {
  size_t n;
  if (!checked_length(dev, length, "ck_buffer_wrap", n)) return nullptr;
  // Alignment to the OS page: what mmap gives here (with 16 KiB pages emulated
  // too; on a Mac the OS page is 16 KiB and so is every mapping).
  if (!ptr || reinterpret_cast<uintptr_t>(ptr) % dev->os_page_size != 0) {
    set_error("ck_buffer_wrap: pointer %p is not page-aligned (page size %u)", ptr, dev->os_page_size);
    return nullptr;
  }
  auto *b = new ck_buffer();
  b->data = static_cast<char *>(ptr);
  b->length = n;
  return b;
}

// Storage modes: host and "GPU" share memory here, so a device buffer is a shared one and
// upload/download only check their range; unless CHERENKOV_CPU_DEVICE_MIRROR=1 gives device
// buffers a separate host mirror (ck_buffer::mirror), the way the CUDA backend has them.
static bool storage_ok(int32_t storage, const char *fn) {
  if (storage == CK_STORAGE_SHARED || storage == CK_STORAGE_DEVICE) return true;
  set_error("%s: storage mode %d is not CK_STORAGE_SHARED (0) or CK_STORAGE_DEVICE (1)", fn, storage);
  return false;
}

static char *zeroed_pages(size_t n) {
  void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<char *>(p);
}

CK_API ck_buffer *ck_buffer_new_storage(ck_device *dev, double length, int32_t storage) {
  if (!storage_ok(storage, "ck_buffer_new_storage")) return nullptr;
  ck_buffer *b = ck_buffer_new(dev, length);
  if (!b || storage == CK_STORAGE_SHARED || !dev->device_mirror) return b;
  b->mirror = zeroed_pages(b->length);
  if (!b->mirror) {
    set_error("ck_buffer_new_storage: cannot allocate the %zu-byte host mirror: %s", b->length, std::strerror(errno));
    ck_buffer_unref(b);
    return nullptr;
  }
  b->mirror_owned = true;
  return b;
}

CK_API ck_buffer *ck_buffer_wrap_storage(ck_device *dev, void *ptr, double length, int32_t storage) {
  if (!storage_ok(storage, "ck_buffer_wrap_storage")) return nullptr;
  ck_buffer *b = ck_buffer_wrap(dev, ptr, length);
  if (!b || storage == CK_STORAGE_SHARED || !dev->device_mirror) return b;
  // As on cuda: the caller's memory becomes the host mirror, its bytes copied "to the GPU" once.
  char *copy = zeroed_pages(b->length);
  if (!copy) {
    set_error("ck_buffer_wrap_storage: cannot allocate %zu bytes: %s", b->length, std::strerror(errno));
    ck_buffer_unref(b);
    return nullptr;
  }
  std::memcpy(copy, b->data, b->length);
  b->mirror = b->data;
  b->data = copy;
  b->owned = true;
  return b;
}

CK_API int32_t ck_buffer_storage(ck_buffer *buf) { return !buf ? CK_ERROR : buf->mirror ? CK_STORAGE_DEVICE : CK_STORAGE_SHARED; }

static int32_t check_range(ck_buffer *buf, double offset, double length, const char *fn) {
  uint64_t off, len;
  if (!buf) return set_error("%s: buffer is NULL", fn);
  if (!ck::to_u64(offset, off) || !ck::to_u64(length, len) || off > buf->length || len > buf->length - off)
    return set_error("%s: range [%.17g, +%.17g) is not inside the buffer's %zu bytes", fn, offset, length, buf->length);
  return CK_OK;
}

// The host must call these only between command buffers that touch the buffer (as on cuda).
static int32_t transfer(ck_buffer *buf, double offset, double length, bool up, const char *fn) {
  int32_t status = check_range(buf, offset, length, fn);
  if (status != CK_OK || !buf->mirror) return status;
  size_t off = size_t(offset), len = size_t(length);
  if (up) std::memcpy(buf->data + off, buf->mirror + off, len);
  else std::memcpy(buf->mirror + off, buf->data + off, len);
  return CK_OK;
}

CK_API int32_t ck_buffer_upload(ck_buffer *buf, double offset, double length) {
  return transfer(buf, offset, length, true, "ck_buffer_upload");
}

CK_API int32_t ck_buffer_download(ck_buffer *buf, double offset, double length) {
  return transfer(buf, offset, length, false, "ck_buffer_download");
}

CK_API void *ck_buffer_contents(ck_buffer *buf) { return !buf ? nullptr : buf->mirror ? buf->mirror : buf->data; }
CK_API double ck_buffer_length(ck_buffer *buf) { return buf ? double(buf->length) : 0; }
CK_API void ck_buffer_release(ck_buffer *buf) { ck_buffer_unref(buf); }

// ---- library and pipelines ---------------------------------------------------

CK_API ck_library *ck_library_load(ck_device *dev, const char *) {
  if (!dev) return set_error("ck_library_load: device is NULL"), nullptr;
  auto *lib = new ck_library();
  lib->dev = dev;
  for (uint32_t t = 0; t < ck::kAllTablesCount; t++)
    for (uint32_t i = 0; i < ck::kAllTables[t].count; i++) {
      // As Metal: a kernel's MSL bound caps its pipeline (so a host dispatch above it fails here too).
      const ck::KernelInfo &k = ck::kAllTables[t].kernels[i];
      lib->pipelines.push_back(ck_pipeline{&k, std::min(dev->pipeline_max_threads, k.max_threads)});
    }
  std::sort(lib->pipelines.begin(), lib->pipelines.end(),
            [](const ck_pipeline &a, const ck_pipeline &b) { return std::strcmp(a.info->name, b.info->name) < 0; });
  for (auto &p : lib->pipelines) lib->by_name[p.info->name] = &p;
  return lib;
}

CK_API void ck_library_release(ck_library *lib) { delete lib; }

CK_API uint32_t ck_library_kernel_count(ck_library *lib) {
  return lib ? uint32_t(lib->pipelines.size()) : 0;
}

CK_API const char *ck_library_kernel_name(ck_library *lib, uint32_t index) {
  if (!lib || index >= lib->pipelines.size()) return "";
  return lib->pipelines[index].info->name;
}

CK_API ck_pipeline *ck_pipeline_get(ck_library *lib, const char *name) {
  if (!lib || !name) return set_error("ck_pipeline_get: library or name is NULL"), nullptr;
  auto it = lib->by_name.find(name);
  if (it == lib->by_name.end()) {
    set_error("pipeline not found: %s (the cpu library has %zu kernels; was the shim rebuilt "
              "after adding it?)", name, lib->pipelines.size());
    return nullptr;
  }
  return it->second;
}

CK_API const char *ck_pipeline_name(ck_pipeline *pipe) { return pipe ? pipe->info->name : ""; }
CK_API uint32_t ck_pipeline_max_threads(ck_pipeline *pipe) { return pipe ? pipe->max_threads : 0; }

}  // extern "C"
