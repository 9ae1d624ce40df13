// metal-shim/common/io.c through the loaded shim: the fixed-arity open/fcntl
// wrappers the streaming IO scheduler calls (cherenkov_io.h). On Linux the
// file is opened with O_DIRECT, which the kernel proves by refusing a read at
// an unaligned offset; on macOS F_NOCACHE is set instead.
import { ptr } from "bun:ffi";
import { afterAll, expect, test } from "bun:test";
import { closeSync, constants, mkdtempSync, readSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { loadShim } from "../../lib/shim.ts";

const io = loadShim().symbols;
const dir = mkdtempSync(join(tmpdir(), "cherenkov-io-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const cPath = (p: string) => ptr(Buffer.from(`${p}\0`));
const EBADF = 9;
const ENOENT = 2;

/** A view of `length` bytes of fresh memory starting on a 4096-byte boundary. */
function alignedView(length: number): Uint8Array {
  const raw = new Uint8Array(length + 4096);
  const skip = (4096 - (Number(ptr(raw)) % 4096)) % 4096;
  return raw.subarray(skip, skip + length);
}

test("a missing file gives -ENOENT and its message", () => {
  const fd = io.ck_open_direct(cPath(join(dir, "missing.bin")), constants.O_RDONLY);
  expect(fd).toBe(-ENOENT);
  expect(String(io.ck_io_error_text(fd))).toMatch(/no such file/i);
});

test("an existing file opens uncached and reads the right bytes into aligned memory", () => {
  const path = join(dir, "records.bin");
  const data = new Uint8Array(64 * 1024).map((_, i) => (i * 31 + (i >> 8)) & 255);
  writeFileSync(path, data);
  const fd = io.ck_open_direct(cPath(path), constants.O_RDONLY);
  expect(fd).toBeGreaterThanOrEqual(0);
  try {
    const direct = io.ck_fd_is_direct(fd);
    const align = io.ck_fd_io_alignment(fd);
    if (process.platform === "linux") {
      expect([0, 1]).toContain(direct);
      if (direct === 1) {
        expect(align).toBeGreaterThanOrEqual(512);
        expect(align & (align - 1)).toBe(0); // a power of two
        // O_DIRECT is really on: the kernel refuses an unaligned offset.
        expect(() => readSync(fd, alignedView(4096), 0, 4096, 100)).toThrow(/EINVAL|invalid argument/i);
      } else {
        expect(align).toBe(1);
      }
    } else {
      expect(direct).toBeLessThan(0); // F_NOCACHE cannot be read back
    }
    const view = alignedView(16 * 1024);
    expect(readSync(fd, view, 0, view.length, 16 * 1024)).toBe(view.length);
    expect(view).toEqual(data.subarray(16 * 1024, 32 * 1024));
    // Switching the cache hint on and off works on an open descriptor.
    expect(io.ck_fd_set_nocache(fd, 1)).toBe(0);
    expect(io.ck_fd_set_nocache(fd, 0)).toBe(0);
  } finally {
    closeSync(fd);
  }
});

test("a descriptor that is not open gives -EBADF from every helper", () => {
  expect(io.ck_fd_set_nocache(-1, 1)).toBe(-EBADF);
  expect(io.ck_fd_is_direct(-1)).toBe(-EBADF);
  expect(io.ck_fd_io_alignment(-1)).toBe(-EBADF);
});

test("O_CREAT creates the file with at most mode 0644", () => {
  const path = join(dir, "created.bin");
  const fd = io.ck_open_direct(cPath(path), constants.O_CREAT | constants.O_WRONLY);
  expect(fd).toBeGreaterThanOrEqual(0);
  closeSync(fd);
  expect(statSync(path).mode & 0o777 & ~0o644).toBe(0);
});
