/*
 * cherenkov_io.h: fixed-arity wrappers for the variadic libc calls the
 * streaming IO scheduler needs (open, fcntl). bun:ffi cannot call variadic C
 * functions portably: arm64 passes variadic arguments on the stack, ordinary
 * ones in registers. Built into every backend's library (metal-shim/common/io.c).
 *
 * Return convention: a result >= 0 is success; a negative result is -errno
 * (e.g. -2 = ENOENT), so callers need no errno access. ck_io_error_text turns
 * it into words.
 */
#ifndef CHERENKOV_IO_H
#define CHERENKOV_IO_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define CK_IO_API __declspec(dllexport)
#else
#define CK_IO_API __attribute__((visibility("default")))
#endif

/* Opens `path` for reads that bypass the page cache. `flags` are the
 * platform's O_* flags (fs.constants); O_CLOEXEC is always added.
 *  - Linux: adds O_DIRECT. Buffers, lengths and file offsets must then be
 *    multiples of the device's logical block size (512 or 4096; page-aligned
 *    slots satisfy both). A file system without O_DIRECT (tmpfs, some FUSE)
 *    rejects it with EINVAL: the file is then opened without it, the pages it
 *    reads are dropped afterwards with ck_fd_set_nocache, and
 *    ck_fd_is_direct(fd) reports 0.
 *  - macOS: opens normally, then sets F_NOCACHE (no alignment rule).
 * Returns the file descriptor, or -errno. O_CREAT opens with mode 0644. */
CK_IO_API int32_t ck_open_direct(const char *path, int32_t flags);

/* Uncached reads for an open descriptor, on (1) or off (0).
 *  - macOS: fcntl(fd, F_NOCACHE, on): later reads skip the unified buffer cache.
 *  - Linux: there is no per-descriptor switch (O_DIRECT is fixed at open, see
 *    ck_open_direct). With on=1 this asks the kernel to drop the file's cached
 *    pages now (posix_fadvise POSIX_FADV_DONTNEED), which a caller without
 *    O_DIRECT repeats after each batch of reads; on=0 does nothing.
 * Returns 0 or -errno (-EBADF for a descriptor that is not open). */
CK_IO_API int32_t ck_fd_set_nocache(int32_t fd, int32_t on);

/* Linux: 1 when fd was opened with O_DIRECT, else 0. macOS: F_NOCACHE cannot
 * be read back, so this returns -ENOTSUP (a successful ck_open_direct has set
 * it). -errno for a bad descriptor. */
CK_IO_API int32_t ck_fd_is_direct(int32_t fd);

/* An alignment, in bytes, that satisfies reads on fd: with O_DIRECT on Linux
 * the file system block size from fstat (a multiple of the device's logical
 * block size, usually 4096); otherwise 1. Or -errno. */
CK_IO_API int32_t ck_fd_io_alignment(int32_t fd);

/* Maps the first `length` bytes of the open file `fd` read-only and shared (PROT_READ,
 * MAP_SHARED): the page cache's own pages, never copied (a private writable mapping may be
 * given copy-on-write copies when Metal wraps it), and a stray write faults instead of
 * changing the model. Stores the address in *out; returns 0 or -errno. */
CK_IO_API int32_t ck_map_readonly(int32_t fd, double length, void **out);

/* Unmaps what ck_map_readonly mapped. Returns 0 or -errno. */
CK_IO_API int32_t ck_unmap(void *addr, double length);

/* The message of an errno value given as returned (negative) or positive. */
CK_IO_API const char *ck_io_error_text(int32_t err);

#ifdef __cplusplus
}
#endif

#endif /* CHERENKOV_IO_H */
