// MLX checkpoints whose 4-bit scales and biases are f16 or f32 rather than bf16: converted
// without loss when every value has an exact bf16 form (cherenkov's q4 keeps them in bf16),
// refused with a message naming the tensor when one has not; never rounded.
import { afterAll, describe, expect, test } from "bun:test";
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { convertCheckpoint } from "../../lib/convert/convert.ts";
import { ConvertError } from "../../lib/convert/hf.ts";
import { Checkpoint, writeSafetensors, type StWriteTensor } from "../../lib/convert/safetensors.ts";
import { f16BitsToF32, f32ToF16Bits, roundBf16 } from "../../lib/model/dtype.ts";
import { openModel, readManifest } from "../../lib/model/format.ts";

const SRC = join(import.meta.dir, "fixtures", "mlx_qwen3_next_g64");
const root = mkdtempSync(join(tmpdir(), "cherenkov-mlx-scales-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/**
 * A copy of the fixture with every `.scales` / `.biases` tensor re-stored as `dtype` (same
 * values); `nudge` names one tensor whose first value moves to a neighbour with no bf16 form.
 */
function variant(name: string, dtype: "F16" | "F32", nudge?: string): string {
  const dir = join(root, name);
  mkdirSync(dir);
  for (const f of readdirSync(SRC)) if (!f.endsWith(".safetensors")) copyFileSync(join(SRC, f), join(dir, f));
  const ck = new Checkpoint(SRC);
  const out: Record<string, StWriteTensor> = {};
  try {
    for (const n of ck.names) {
      const info = ck.info(n);
      if (!/\.(scales|biases)$/.test(n)) {
        out[n] = { dtype: info.dtype, shape: info.shape, data: ck.read(n) };
        continue;
      }
      expect(info.dtype).toBe("BF16");
      const v = ck.readF32(n);
      if (n === nudge) {
        // An f16 neighbour of the value: 3 more mantissa bits than bf16 has.
        const bits = f32ToF16Bits(v[0]!) + 1;
        v[0] = f16BitsToF32(bits);
      }
      const data =
        dtype === "F32"
          ? new Uint8Array(v.buffer.slice(0))
          : new Uint8Array(Uint16Array.from(v, (x) => {
              const b = f32ToF16Bits(x);
              expect(f16BitsToF32(b)).toBe(x); // these bf16 values are exact in f16
              return b;
            }).buffer);
      out[n] = { dtype, shape: info.shape, data };
    }
  } finally {
    ck.close();
  }
  writeSafetensors(join(dir, "model.safetensors"), out);
  return dir;
}

async function convert(src: string, name: string): Promise<string> {
  const dir = join(root, `${name}-out`);
  await convertCheckpoint({ src, out: dir, weights: "q4", kvCache: "f32", log: () => {} });
  return dir;
}

describe("MLX scales and biases stored as f16 or f32", () => {
  test("exact bf16 values in f16 and f32 convert to the same bytes as the bf16 checkpoint", async () => {
    const want = readManifest(await convert(SRC, "bf16"));
    for (const dtype of ["F16", "F32"] as const) {
      const got = readManifest(await convert(variant(`exact-${dtype}`, dtype), `exact-${dtype}`));
      expect(got.tensors.map((t) => [t.name, t.dtype, t.checksum])).toEqual(want.tensors.map((t) => [t.name, t.dtype, t.checksum]));
      expect(got.experts.checksums).toEqual(want.experts.checksums);
    }
    const m = await openModel(join(root, "exact-F16-out"));
    expect(m.tensorInfo("lm_head").dtype).toBe("q4");
    m.close();
  });

  for (const [what, tensor] of [
    ["a dense tensor's scales", "lm_head.scales"],
    ["an expert tensor's biases", "model.layers.1.mlp.switch_mlp.down_proj.biases"],
  ] as const) {
    test(`a value with no exact bf16 form in ${what} is refused, naming the tensor`, async () => {
      const src = variant(`nudged-${tensor}`, "F16", tensor);
      const ck = new Checkpoint(src);
      const v = ck.readF32(tensor)[0]!;
      ck.close();
      expect(roundBf16(v)).not.toBe(v); // the nudge really left bf16
      const run = convert(src, `nudged-${tensor}`);
      await expect(run).rejects.toBeInstanceOf(ConvertError);
      await expect(convert(src, `nudged2-${tensor}`)).rejects.toThrow(new RegExp(`tensor ${tensor.replace(/\./g, "\\.")}: F16 value .* has no exact bf16 form`));
    });
  }
});
