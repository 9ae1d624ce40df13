// `cherenkov compare` (lib/gpu/layer-compare.ts, issue 23 item 2): on a correct engine every
// layer's own update agrees with the reference's to f32 rounding; an engine whose weights of
// one layer are off (a stand-in for a faulty op) is named at exactly that layer, even where
// the tokens still agree (which is why tokens alone cannot tell a bug from rounding).
import { expect, test } from "bun:test";
import { join } from "node:path";
import { compareLayers, suspectLayer } from "../../lib/gpu/layer-compare.ts";
import { openModel, type ModelFiles } from "../../lib/model/format.ts";
import { defaultModelDir } from "../../lib/model/default-model.ts";
import { BACKEND } from "../selected-backend.ts";

const PROMPT = [10, 20, 30, 40, 50];

/**
 * The model as the engine reads it, with `tensor` about 0.5% larger after its checksum passed
 * (each bf16 value, or each q4 group's bf16 scale, one ulp up); the reference reads the true one.
 */
function engineSeesScaled(files: ModelFiles, tensor: string): ModelFiles {
  const t = files.tensorInfo(tensor);
  const n = t.shape.reduce((a, b) => a * b, 1);
  // Where the bf16 values to bump lie: the whole tensor (bf16), or the q4 scales after the n/2 nibble bytes.
  const [start, count] = t.dtype === "bf16" ? [t.offset, n] : t.dtype === "q4" ? [t.offset + n / 2, n / 32] : [-1, 0];
  if (start < 0) throw new Error(`test setup: ${tensor} is ${t.dtype}`);
  return Object.assign(Object.create(files) as ModelFiles, {
    readDenseInto(into: Uint8Array, onBytes?: (n: number) => void) {
      files.readDenseInto(into, onBytes);
      const v = new Uint16Array(into.buffer, into.byteOffset + start, count);
      for (let i = 0; i < v.length; i++) if (v[i]! & 0x7f80) v[i] = v[i]! + 1;
    },
  });
}

test("a correct engine: every layer's own update agrees to 1e-5, no suspect", async () => {
  const files = await openModel(await defaultModelDir());
  try {
    const cmp = await compareLayers(files, BACKEND, PROMPT, { steps: 3 });
    expect(cmp.layers).toHaveLength(files.config.num_layers);
    expect(cmp.steps).toHaveLength(4);
    for (const a of cmp.layers) expect(a.updateRel).toBeLessThan(1e-5);
    expect(suspectLayer(cmp)).toBeNull();
    expect(cmp.steps.map((s) => s.engineNext)).toEqual(cmp.steps.map((s) => s.referenceNext));
  } finally {
    files.close();
  }
});

test("one layer's weights off by ~1% on the engine: compare names that layer", async () => {
  const files = await openModel(await defaultModelDir());
  try {
    // Layer 2's DeltaNet output projection: the update arriving at layer 2's MoE site.
    const tensor = ["layers.2.dn.out", "layers.2.attn.o"].find((n) => files.has(n))!;
    const scaled = engineSeesScaled(files, tensor);
    const cmp = await compareLayers(scaled, BACKEND, PROMPT, { steps: 2 });
    expect(suspectLayer(cmp)?.layer).toBe(2);
    expect(cmp.layers[2]!.updateRel).toBeGreaterThan(1e-3);
    // ...while the tokens still agree: a token comparison would have passed this engine.
    expect(cmp.steps.map((s) => s.engineNext)).toEqual(cmp.steps.map((s) => s.referenceNext));
    for (const a of cmp.layers.slice(0, 2)) expect(a.updateRel).toBeLessThan(1e-5);
  } finally {
    files.close();
  }
});

test("the CLI prints the table and exits 0 on a correct engine", () => {
  const proc = Bun.spawnSync([process.execPath, join(import.meta.dir, "../../lib/cli/main.ts"), "compare", join(import.meta.dir, "../../examples/models/qwen4-exp-tiny"), "--ids", "10,20,30", "--steps", "1", "--backend", BACKEND], { stdout: "pipe", stderr: "pipe" });
  const out = proc.stdout.toString();
  expect(proc.stderr.toString()).toBe("");
  expect(out).toContain("layer  type       streams rel  update rel  routing differs  swapped weight");
  expect(out).toContain("no faulty layer");
  expect(proc.exitCode).toBe(0);
});
