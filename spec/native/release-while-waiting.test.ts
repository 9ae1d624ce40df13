// Memory released while a GPU wait is pending: one engine closed while another decodes in the
// same process. On cuda the shim frees memory on a reaper thread (metal-shim/cuda/runtime.cu,
// Reaper and WaitGate) because cudaFreeHost and cudaFree synchronize the whole device, and a
// wait spinning for its host release keeps the device busy; the release itself may need a CUDA
// call first (a handshake downloads the router's output from device memory). On the H200 such a
// wait ran to its timeout: a golden sequence's first step, an engine closed just before
// (2026-12-03). The other backends give the same results (there is no reaper there).
import { expect, test } from "bun:test";

import { Device } from "../../lib/shim.ts";
import { selftestParams } from "./util.ts";

const n = 1024;

test("another device's buffers, events and the device itself released while a command buffer waits: the host downloads, releases the wait, and the command buffer completes", async () => {
  const dev = Device.open();
  const other = Device.open();
  try {
    dev.setWaitTimeout(5000); // the failure this guards against is this wait timing out
    const x = dev.buffer(n * 4);
    for (let i = 0; i < n; i++) x.f32[i] = i;
    const y = dev.buffer(n * 4, "device");
    const routes = dev.buffer(4096, "device"); // what a handshake downloads before it releases the wait
    const ev = dev.event();
    // The other device's memory of both kinds, allocated before anything waits.
    const doomed = [other.buffer(16 << 20), other.buffer(16 << 20, "device"), other.event()];
    const scale = (from: typeof x, to: typeof x, s: number) => ["selftest_scale_f32", n / 64, 64, [null, from, to], selftestParams({ n, scale: s })] as const;
    const cb = dev.commandBuffer().dispatch(...scale(x, y, 3)).signal(ev, 1).wait(ev, 2).dispatch(...scale(y, y, 2)).commit();
    try {
      expect(ev.waitFor(1, 5000)).toBe(true); // the GPU has reached the wait
      for (const r of doomed) r.release();
      other.close();
      await Bun.sleep(50); // the reaper has had the releases for a while
      routes.download();
      ev.set(2);
      cb.waitUntilCompleted(15_000);
      expect(cb.status).toBe("completed");
      y.download();
      expect(y.f32[5]).toBe(5 * 3 * 2);
      expect(y.f32[1000]).toBe(1000 * 3 * 2);
    } finally {
      cb.release();
    }
  } finally {
    other.close();
    dev.close();
  }
});
