// cherenkov.h's storage modes on the selected backend (CHERENKOV_BACKEND): a "device" buffer
// is GPU memory with a host mirror on cuda (upload/download move the bytes), and the same
// shared memory on cpu and Metal (upload/download only check their range). Either way a
// kernel sees what was uploaded and the host sees what the kernel wrote after a download.
// CHERENKOV_CPU_DEVICE_MIRROR=1 gives the CPU backend cuda's separate host mirror, so the
// engine's upload/download paths are checked without a GPU (the last tests here).
import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";

import { Device } from "../../lib/shim.ts";
import { runOnce, selftestParams } from "./util.ts";

const dev = Device.open();
afterAll(() => dev.close());
/** A device buffer here has a host mirror apart from what kernels use (cuda, or the CPU mirror mode). */
const mirrored = dev.backend === "cuda" || (dev.backend === "cpu" && process.env.CHERENKOV_CPU_DEVICE_MIRROR === "1");

test("a device buffer: upload, a kernel reads and writes it, download", () => {
  const n = 4096;
  const x = dev.buffer(n * 4, "device");
  const y = dev.buffer(n * 4, "device");
  expect(x.storage).toBe(mirrored ? "device" : "shared");
  expect(x.f32.every((v) => v === 0)).toBe(true); // zero-filled mirror
  for (let i = 0; i < n; i++) x.f32[i] = i - 100;
  x.upload();
  runOnce(dev, "selftest_scale_f32", n / 256, 256, [null, x, y], selftestParams({ n, scale: 0.5 }));
  y.download();
  expect(y.f32[0]).toBe(-50);
  expect(y.f32[n - 1]).toBe((n - 101) / 2);
  // A ranged upload changes only that range on the GPU side.
  x.f32[7] = 1000;
  x.f32[8] = 2000;
  x.upload(7 * 4, 4);
  runOnce(dev, "selftest_scale_f32", n / 256, 256, [null, x, y], selftestParams({ n, scale: 1 }));
  y.download(0, 64);
  expect(y.f32[7]).toBe(1000);
  expect(y.f32[8]).toBe(mirrored ? -92 : 2000); // mirrored: element 8 was not uploaded
  x.release();
  y.release();
});

test("a wrapped read-only array in device storage is what kernels read", () => {
  const map = Bun.mmap(import.meta.path); // a page-aligned mapping of this file's bytes, read as floats
  const bytes = new Uint8Array(map.buffer, map.byteOffset, Math.min(map.byteLength, 4096) & ~3);
  const w = dev.wrap(bytes, "device");
  const y = dev.buffer(4096, "device");
  const count = bytes.length / 4;
  runOnce(dev, "selftest_scale_f32", Math.ceil(count / 64), 64, [null, w, y], selftestParams({ n: count, scale: 1 }));
  y.download();
  const want = new Float32Array(bytes.buffer, bytes.byteOffset, count);
  for (let i = 0; i < count; i += 97) expect(Object.is(y.f32[i], want[i]) || (Number.isNaN(y.f32[i]) && Number.isNaN(want[i]))).toBe(true);
  w.release();
  y.release();
});

test("ranges outside the buffer and unknown storage are errors", () => {
  const x = dev.buffer(4096, "device");
  expect(() => x.upload(4000, 200)).toThrow(/ck_buffer_upload: range \[4000, \+200\) is not inside the buffer's 4096 bytes/);
  expect(() => x.download(-1, 4)).toThrow(/ck_buffer_download: range/);
  const raw = dev.shim.symbols.ck_buffer_new_storage(dev.handle, 4096, 7);
  expect(raw).toBeNull();
  expect(dev.shim.lastError()).toMatch(/storage mode 7 is not CK_STORAGE_SHARED \(0\) or CK_STORAGE_DEVICE \(1\)/);
  x.release();
});

const ROOT = join(import.meta.dir, "..", "..");
const runWithMirror = (files: string[]) =>
  Bun.spawnSync([process.execPath, "test", "--timeout", "120000", ...files], {
    cwd: ROOT,
    env: { ...process.env, CHERENKOV_BACKEND: "cpu", CHERENKOV_CPU_DEVICE_MIRROR: "1" },
  });

test.skipIf(dev.backend !== "cpu" || mirrored)(
  "CPU mirror mode: device buffers get a separate mirror; the engine's state tests pass through upload/download",
  () => {
    // This file under the mirror: stale mirror values prove the mode is on (element 8 above).
    const self = runWithMirror(["spec/native/storage.test.ts"]);
    expect(self.stderr.toString()).toMatch(/ 3 pass\n 1 skip\n 0 fail/);
    expect(self.exitCode).toBe(0);
    // The state after drafts, verification, rollbacks, checkpoints and restores (device storage
    // for scratch, caches, DeltaNet state and planes; the host reads only after a download).
    const state = runWithMirror(["spec/engine-step/state.test.ts"]);
    const out = state.stdout.toString() + state.stderr.toString();
    expect(out).toMatch(/ 0 fail/);
    expect(state.exitCode).toBe(0);
  },
  240_000,
);
