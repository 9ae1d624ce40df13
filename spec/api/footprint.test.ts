// Issue 23 item 1: a backend's host-memory footprint from the index, before loading; `auto`
// takes the reference only when it fits the budget, and a named backend that cannot fit is
// refused before any allocation, naming the footprint and the budget.
import { expect, test } from "bun:test";
import { totalmem } from "node:os";
import { autoBackend } from "../../lib/api/auto-backend.ts";
import { engineMinimumFootprint, FootprintError, memoryBudget, referenceFootprint } from "../../lib/api/footprint.ts";
import { Model } from "../../lib/index.ts";
import { defaultModelDir } from "../../lib/model/default-model.ts";
import { openModel, readManifest } from "../../lib/model/format.ts";
import { numel } from "../../lib/model/tensors.ts";

const GiB = 1024 ** 3;
const dir = await defaultModelDir();
const manifest = readManifest(dir);

/** The engine's hostReserveBytes that leaves a budget of `bytes` on this machine. */
const reserveFor = (bytes: number) => Math.floor(0.75 * totalmem() - bytes);

test("the budget is 75% of RAM less the host reserve (the cpu engine's rule)", () => {
  expect(memoryBudget(24 * GiB).bytes).toBe(Math.floor(0.75 * 24 * GiB - (2 * GiB + 0.1 * 24 * GiB)));
  expect(memoryBudget(24 * GiB).text).toContain("75% of 24.00 GiB RAM - host reserve 4.40 GiB");
  expect(memoryBudget(4 * GiB, 8 * GiB).bytes).toBe(0);
});

test("the reference footprint counts exactly the f32 tensors and tables the reference holds", async () => {
  const f = referenceFootprint(manifest);
  const files = await openModel(dir);
  try {
    const dense = manifest.tensors.reduce((s, t) => s + files.get(t.name).byteLength, 0);
    expect(f.parts["dense weights as f32"]).toBe(dense);
    const c = manifest.config;
    let ple = 0;
    for (const layer of c.ple!.layers) for (let o = 0; o < c.ple!.orders.length; o++) for (let j = 0; j < c.ple!.heads; j++) ple += files.pleTable(layer, o, j).byteLength;
    expect(f.parts["PLE tables as f32"]).toBe(ple);
    // The tiny model's experts all fit the 256 MiB cache: it holds them all.
    const expert = files.expert(0, 0);
    const one = (expert.gate.length + expert.up.length + expert.down.length) * 4;
    expect(f.parts["expert cache"]).toBe(one * manifest.experts.layers * manifest.experts.per_layer);
  } finally {
    files.close();
  }
  expect(f.bytes).toBe(Object.values(f.parts).reduce((a, b) => a + b, 0));
  // A smaller cache bound is what it holds when the experts exceed it.
  const small = referenceFootprint(manifest, { expertCacheBytes: 1 });
  expect(small.parts["expert cache"]).toBe(manifest.experts.parts.reduce((s, p) => s + numel(p.shape) * 4, 0));
});

test("the expert cache reuses evicted storage and still serves every expert exactly", async () => {
  const bounded = await openModel(dir, { expertCacheBytes: 1 });
  const plain = await openModel(dir);
  try {
    const first = bounded.expert(0, 0);
    const want = plain.expert(1, 3).down.slice();
    const second = bounded.expert(1, 3);
    expect(second.down).toBe(first.down); // the same storage, recycled
    expect(second.down).toEqual(want);
  } finally {
    bounded.close();
    plain.close();
  }
});

test("auto: the reference when its footprint fits the budget, else the cpu engine, saying both numbers", () => {
  const f = referenceFootprint(manifest);
  const probes = { env: {}, platform: "linux", nvidia: () => false };
  const fits = autoBackend({ ...probes, model: { manifest, budget: { bytes: f.bytes, text: "" } } });
  expect(fits.backend).toBe("reference");
  const over = autoBackend({ ...probes, model: { manifest, budget: { bytes: f.bytes - 1, text: "" } } });
  expect(over.backend).toBe("cpu");
  expect(over.reason).toMatch(/the reference would need [\d.]+ MiB, more than the budget of [\d.]+ MiB; the cpu engine streams the experts/);
  // A GPU backend or CHERENKOV_BACKEND still wins.
  const none = { manifest, budget: { bytes: 0, text: "" } };
  expect(autoBackend({ ...probes, nvidia: () => true, gpuProblem: () => null, model: none }).backend).toBe("cuda");
  expect(autoBackend({ ...probes, env: { CHERENKOV_BACKEND: "reference" }, model: none }).backend).toBe("reference");
});

test("an explicit backend that cannot fit is a FootprintError naming the footprint and the budget", async () => {
  const ref = referenceFootprint(manifest);
  const err = await Model.load(dir, { backend: "reference", engine: { hostReserveBytes: reserveFor(ref.bytes - 1) } }).catch((e) => e);
  expect(err).toBeInstanceOf(FootprintError);
  expect(err.backend).toBe("reference");
  expect(err.footprintBytes).toBe(ref.bytes);
  expect(err.budgetBytes).toBe(ref.bytes - 1);
  expect(err.message).toContain(`backend "reference" needs about`);
  expect(err.message).toContain("dense weights as f32");
  expect(err.message).toContain("more than the memory budget of");
  expect(err.message).toContain("Use --backend cpu");

  const eng = engineMinimumFootprint(manifest);
  const cpuErr = await Model.load(dir, { backend: "cpu", engine: { hostReserveBytes: reserveFor(eng.bytes - 1) } }).catch((e) => e);
  expect(cpuErr).toBeInstanceOf(FootprintError);
  expect(cpuErr.message).toContain(`backend "cpu" needs about`);
  expect(cpuErr.message).toContain("smallest expert pool");

  // With room, the same load works, and auto says why it chose the reference.
  await using m = await Model.load(dir, { backend: "auto", engine: { hostReserveBytes: reserveFor(Math.max(ref.bytes, eng.bytes)) } });
  expect(m.backendReason).not.toBeNull();
  if (m.backendName === "reference") expect(m.backendReason).toContain("fit the budget");
});
