// Shared buffers: page alignment, zero-copy views, and wrapping a mapped file
// without copying (the path dense.bin takes).
import { ptr } from "bun:ffi";
import { afterAll, expect, test } from "bun:test";
import { closeSync, mkdtempSync, openSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { Device } from "../../lib/shim.ts";
import { runOnce, selftestParams } from "./util.ts";

const dev = Device.open();
const dir = mkdtempSync(join(tmpdir(), "cherenkov-native-"));
afterAll(() => {
  dev.close();
  rmSync(dir, { recursive: true, force: true });
});

test("new buffers are zeroed, page-aligned, page-rounded, and their views share memory", () => {
  const page = dev.limits.pageSize;
  const buf = dev.buffer(1000);
  expect(buf.length).toBe(page);
  expect(Number(buf.contents) % page).toBe(0);
  expect(buf.bytes.every((b) => b === 0)).toBe(true);
  expect(buf.bytes).toBe(buf.bytes); // one view per buffer
  buf.f32[3] = 1.5;
  expect(buf.bytes[15]).toBe(0x3f);
  expect(Number(ptr(buf.bytes))).toBe(Number(buf.contents));
  buf.release();
});

test("buffer lengths must be positive integers", () => {
  expect(() => dev.buffer(0)).toThrow(/length 0 is not a positive integer/);
  expect(() => dev.buffer(2.5)).toThrow(/not a positive integer/);
});

test("a mapped file is wrapped without copying: kernels read what the file holds now", () => {
  const n = 2048;
  const path = join(dir, "weights.bin");
  writeFileSync(path, new Uint8Array(new Float32Array(n).fill(1.25).buffer));
  const map = Bun.mmap(path, { shared: true });
  const wrapped = dev.wrap(map);
  expect(Number(wrapped.contents)).toBe(Number(ptr(map))); // same memory, not a copy
  expect(wrapped.bytes.buffer === map.buffer || ptr(wrapped.bytes) === ptr(map)).toBe(true);

  const y = dev.buffer(n * 4);
  const params = selftestParams({ n, scale: 2 });
  runOnce(dev, "selftest_scale_f32", n / 256, 256, [null, wrapped, y], params);
  expect(y.f32[0]).toBe(2.5);
  expect(y.f32[n - 1]).toBe(2.5);

  // Change the file through a write(2): the shared mapping, hence the kernel, sees it.
  const fd = openSync(path, "r+");
  writeSync(fd, new Uint8Array(new Float32Array([7, 8]).buffer), 0, 8, 4 * 100);
  closeSync(fd);
  runOnce(dev, "selftest_scale_f32", n / 256, 256, [null, wrapped, y], params);
  expect([y.f32[99], y.f32[100], y.f32[101], y.f32[102]]).toEqual([2.5, 14, 16, 2.5]);

  // And through the mapping itself.
  new Float32Array(map.buffer, map.byteOffset, n)[5] = -3;
  runOnce(dev, "selftest_scale_f32", n / 256, 256, [null, { buffer: wrapped, offset: 0 }, y], params);
  expect(y.f32[5]).toBe(-6);
  wrapped.release();
  y.release();
});

test("bindings at a byte offset see the buffer from there", () => {
  const n = 64;
  const x = dev.buffer(8192), y = dev.buffer(n * 4); // 2048 floats, whatever the page size
  for (let i = 0; i < 2048; i++) x.f32[i] = i;
  runOnce(dev, "selftest_scale_f32", 1, 64, [null, { buffer: x, offset: 4 * 1000 }, y], selftestParams({ n, scale: 1 }));
  expect(y.f32[0]).toBe(1000);
  expect(y.f32[63]).toBe(1063);
  x.release();
  y.release();
});

test("wrapping memory that is not page-aligned is an error", () => {
  const path = join(dir, "small.bin");
  writeFileSync(path, new Uint8Array(8192));
  const map = Bun.mmap(path);
  expect(() => dev.wrap(map.subarray(16))).toThrow(/is not page-aligned \(page size \d+\)/);
});
