// lib/shim.ts: how the library is found, what the error says when it is not,
// and CHERENKOV_DEBUG_FFI tracing.
import { afterEach, expect, test } from "bun:test";
import { join } from "node:path";

import { loadShim, setShimPath, ShimError } from "../../lib/shim.ts";

afterEach(() => setShimPath(null));

test("a missing library names every place that was tried", () => {
  setShimPath("/nonexistent/libcherenkov.so");
  expect(() => loadShim("cpu")).toThrow(ShimError);
  expect(() => loadShim("cpu")).toThrow(
    /cannot load the cpu backend of metal-shim\. Tried:\n {2}- setShimPath=\/nonexistent\/libcherenkov\.so: no such file\n.*bun run build:native/s,
  );
});

test("the metal backend resolves on macOS; elsewhere the error lists the package and the local build", () => {
  if (process.platform === "darwin") {
    expect(loadShim("metal").symbols.ck_abi_version()).toBe(1);
    return;
  }
  expect(() => loadShim("metal")).toThrow(
    /Tried:\n {2}- CHERENKOV_SHIM_PATH: not set\n {2}- package @cherenkov\/shim-linux-\w+: not installed or has no metal library\n {2}- local build .*libcherenkov_metal\.dylib: not built/,
  );
});

test("setShimPath loads exactly that file", () => {
  const local = loadShim("cpu").path;
  setShimPath(local);
  const shim = loadShim("cpu");
  expect(shim.path).toBe(local);
  expect(shim.symbols.ck_abi_version()).toBe(2);
});

test("CHERENKOV_DEBUG_FFI=1 logs each native call with its arguments and result", () => {
  const script = `import { Device } from ${JSON.stringify(join(import.meta.dir, "../../lib/shim.ts"))};
const d = Device.open({ backend: "cpu" }); const e = d.event(); e.set(7); d.close();`;
  const proc = Bun.spawnSync([process.execPath, "-e", script], {
    env: { ...process.env, CHERENKOV_DEBUG_FFI: "1" },
    stderr: "pipe",
  });
  const log = proc.stderr.toString();
  expect(proc.exitCode).toBe(0);
  expect(log).toMatch(/^\[ffi\] ck_device_open\(\) -> \d+$/m);
  expect(log).toMatch(/^\[ffi\] ck_event_set\(\d+, 7\) -> 0$/m);
});
