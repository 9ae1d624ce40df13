// cherenkov.h's storage modes over Metal. Apple silicon has unified memory: a buffer the
// host writes is the buffer the GPU reads, so a CK_STORAGE_DEVICE request is served by the
// shared buffer (zero-copy, as before) and upload/download only check their range. A
// discrete-GPU Mac would map CK_STORAGE_DEVICE onto MTLStorageModeManaged
// (didModifyRange:/synchronizeResource:); that is not done: cherenkov targets Apple silicon.
#import "shim.h"

static BOOL storage_ok(int32_t storage, const char *fn) {
  if (storage == CK_STORAGE_SHARED || storage == CK_STORAGE_DEVICE) return YES;
  ck_fail(@"%s: storage mode %d is not CK_STORAGE_SHARED (0) or CK_STORAGE_DEVICE (1)", fn, storage);
  return NO;
}

CK_API ck_buffer *ck_buffer_new_storage(ck_device *dev, double length, int32_t storage) {
  return storage_ok(storage, "ck_buffer_new_storage") ? ck_buffer_new(dev, length) : NULL;
}

CK_API ck_buffer *ck_buffer_wrap_storage(ck_device *dev, void *ptr, double length, int32_t storage) {
  return storage_ok(storage, "ck_buffer_wrap_storage") ? ck_buffer_wrap(dev, ptr, length) : NULL;
}

CK_API int32_t ck_buffer_storage(ck_buffer *buf) { return buf ? CK_STORAGE_SHARED : CK_ERROR; }

static int32_t check_range(ck_buffer *buf, double offset, double length, const char *fn) {
  uint64_t off, len;
  if (!buf) return ck_fail(@"%s: buffer is NULL", fn);
  double size = ck_buffer_length(buf);
  if (!ck_to_u64(offset, &off) || !ck_to_u64(length, &len) || (double)off > size || (double)len > size - (double)off)
    return ck_fail(@"%s: range [%.17g, +%.17g) is not inside the buffer's %.17g bytes", fn, offset, length, size);
  return CK_OK;
}

CK_API int32_t ck_buffer_upload(ck_buffer *buf, double offset, double length) {
  return check_range(buf, offset, length, "ck_buffer_upload");
}

CK_API int32_t ck_buffer_download(ck_buffer *buf, double offset, double length) {
  return check_range(buf, offset, length, "ck_buffer_download");
}
