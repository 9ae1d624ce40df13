// Fixed-arity wrappers for open/fcntl/posix_fadvise (see cherenkov_io.h).
#if defined(__linux__)
#define _GNU_SOURCE  // O_DIRECT
#endif
#include "../include/cherenkov_io.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

CK_IO_API int32_t ck_open_direct(const char *path, int32_t flags) {
  if (!path) return -EINVAL;
  int base = (int)flags | O_CLOEXEC;
  mode_t mode = 0644;
#if defined(__linux__)
  int fd = open(path, base | O_DIRECT, mode);
  if (fd < 0 && errno == EINVAL) {
    // No O_DIRECT on this file system: open plainly; the caller drops the
    // pages it read with ck_fd_set_nocache and sees ck_fd_is_direct() == 0.
    fd = open(path, base, mode);
  }
  return fd < 0 ? -errno : fd;
#elif defined(__APPLE__)
  int fd = open(path, base, mode);
  if (fd < 0) return -errno;
  if (fcntl(fd, F_NOCACHE, 1) < 0) {
    int err = errno;
    close(fd);
    return -err;
  }
  return fd;
#else
  int fd = open(path, base, mode);
  return fd < 0 ? -errno : fd;
#endif
}

CK_IO_API int32_t ck_fd_set_nocache(int32_t fd, int32_t on) {
#if defined(__APPLE__)
  return fcntl(fd, F_NOCACHE, on ? 1 : 0) < 0 ? -errno : 0;
#elif defined(__linux__)
  // posix_fadvise returns the error number rather than setting errno.
  if (fcntl(fd, F_GETFD) < 0) return -errno;
  if (!on) return 0;
  int err = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  return err ? -err : 0;
#else
  (void)on;
  return fcntl(fd, F_GETFD) < 0 ? -errno : 0;
#endif
}

CK_IO_API int32_t ck_fd_is_direct(int32_t fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -errno;
#if defined(__linux__)
  return (fl & O_DIRECT) ? 1 : 0;
#else
  return -ENOTSUP;
#endif
}

CK_IO_API int32_t ck_fd_io_alignment(int32_t fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -errno;
#if defined(__linux__)
  if (fl & O_DIRECT) {
    struct stat st;
    if (fstat(fd, &st) < 0) return -errno;
    return st.st_blksize >= 512 ? (int32_t)st.st_blksize : 512;
  }
#endif
  return 1;
}

CK_IO_API const char *ck_io_error_text(int32_t err) { return strerror(err < 0 ? -err : err); }

CK_IO_API int32_t ck_map_readonly(int32_t fd, double length, void **out) {
  if (!out || !(length > 0) || length > 9007199254740992.0 || (double)(size_t)length != length) return -EINVAL;
  void *p = mmap(NULL, (size_t)length, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -errno;
  *out = p;
  return 0;
}

CK_IO_API int32_t ck_unmap(void *addr, double length) {
  if (!addr || !(length > 0)) return -EINVAL;
  return munmap(addr, (size_t)length) == 0 ? 0 : -errno;
}
