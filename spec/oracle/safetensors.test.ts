// The safetensors reader: headers, float dtypes, slices along dim 0, sharded checkpoints, and
// clear errors (naming file and tensor) for broken files.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdirSync, mkdtempSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Checkpoint, SafetensorsFile, writeSafetensors, type StWriteTensor } from "../../lib/convert/safetensors.ts";
import { f32ToBf16, f32ToF16 } from "../../lib/model/dtype.ts";

const work = mkdtempSync(join(tmpdir(), "cherenkov-st-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
let counter = 0;
const fresh = () => {
  const d = join(work, `c${counter++}`);
  mkdirSync(d);
  return d;
};

const values = Float32Array.from({ length: 24 }, (_, i) => (i - 11) * 0.375);
const bytesOf = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
const f32 = (shape: number[], v: Float32Array): StWriteTensor => ({ dtype: "F32", shape, data: bytesOf(v) });

describe("safetensors reader", () => {
  test("reads F32, BF16 and F16 tensors as f32, whole or one slice along dim 0", () => {
    const dir = fresh();
    writeSafetensors(
      join(dir, "model.safetensors"),
      {
        a: f32([2, 3, 4], values),
        b: { dtype: "BF16", shape: [24], data: bytesOf(f32ToBf16(values)) },
        c: { dtype: "F16", shape: [6, 4], data: bytesOf(f32ToF16(values)) },
        packed: { dtype: "U32", shape: [2, 2], data: bytesOf(Uint32Array.from([1, 2, 3, 0xffffffff])) },
      },
      { format: "pt" },
    );
    const ck = new Checkpoint(dir);
    try {
      expect(ck.names.sort()).toEqual(["a", "b", "c", "packed"]);
      expect(Array.from(ck.readF32("a"))).toEqual(Array.from(values));
      // the values are multiples of 1/8 with few bits: exact in bf16 and f16
      expect(Array.from(ck.readF32("b"))).toEqual(Array.from(values));
      expect(Array.from(ck.readF32("c"))).toEqual(Array.from(values));
      expect(Array.from(ck.readF32("a", 1))).toEqual(Array.from(values.subarray(12)));
      expect(Array.from(ck.readF32("c", 5))).toEqual(Array.from(values.subarray(20)));
      expect(Array.from(new Uint32Array(ck.read("packed").buffer))).toEqual([1, 2, 3, 0xffffffff]);
      expect(ck.info("a").shape).toEqual([2, 3, 4]);
      expect(() => ck.readF32("packed")).toThrow(/packed: dtype U32 is not a float type/);
      expect(() => ck.readF32("a", 2)).toThrow(/tensor a: slice 2 outside dim 0 of size 2/);
      expect(() => ck.readF32("nope")).toThrow(/missing tensor nope/);
    } finally {
      ck.close();
    }
  });

  test("a sharded checkpoint is read through model.safetensors.index.json", () => {
    const dir = fresh();
    writeSafetensors(join(dir, "model-00001-of-00002.safetensors"), { x: f32([4], values.subarray(0, 4)) });
    writeSafetensors(join(dir, "model-00002-of-00002.safetensors"), { y: f32([2, 2], values.subarray(4, 8)) });
    // a stray file the index does not name is not read
    writeSafetensors(join(dir, "other.safetensors"), { z: f32([1], values.subarray(0, 1)) });
    writeFileSync(
      join(dir, "model.safetensors.index.json"),
      JSON.stringify({ weight_map: { x: "model-00001-of-00002.safetensors", y: "model-00002-of-00002.safetensors" } }),
    );
    const ck = new Checkpoint(dir);
    try {
      expect(ck.names.sort()).toEqual(["x", "y"]);
      expect(Array.from(ck.readF32("y"))).toEqual(Array.from(values.subarray(4, 8)));
      expect(ck.info("x").file).toBe("model-00001-of-00002.safetensors");
    } finally {
      ck.close();
    }
  });

  test("broken files fail with the file and tensor named", () => {
    const dir = fresh();
    const path = join(dir, "bad.safetensors");
    writeSafetensors(path, { w: f32([2, 3, 4], values) });
    truncateSync(path, 60);
    expect(() => new SafetensorsFile(path)).toThrow(/bad.safetensors: (header length|tensor w: data ends at byte \d+, past the end)/);

    writeSafetensors(path, { w: f32([2, 3, 4], values) });
    truncateSync(path, 8 + 64 + 10);
    expect(() => new SafetensorsFile(path)).toThrow(/bad.safetensors: tensor w: data ends .* past the end of the file/);

    const header = (h: object) => {
      const json = JSON.stringify(h);
      const buf = new Uint8Array(8 + json.length + 16);
      new DataView(buf.buffer).setBigUint64(0, BigInt(json.length), true);
      buf.set(new TextEncoder().encode(json), 8);
      writeFileSync(path, buf);
    };
    header({ w: { dtype: "F33", shape: [2], data_offsets: [0, 8] } });
    expect(() => new SafetensorsFile(path)).toThrow(/bad.safetensors: tensor w: unknown dtype "F33"/);
    header({ w: { dtype: "F32", shape: [3], data_offsets: [0, 8] } });
    expect(() => new SafetensorsFile(path)).toThrow(/tensor w: data_offsets span 8 bytes, F32 \[3\] needs 12/);
    writeFileSync(path, new Uint8Array([255, 255, 255, 255, 0, 0, 0, 0, 1, 2, 3]));
    expect(() => new SafetensorsFile(path)).toThrow(/bad.safetensors: header length \d+ does not fit/);
    const junk = new Uint8Array(24);
    new DataView(junk.buffer).setBigUint64(0, 8n, true);
    junk.set(new TextEncoder().encode("{not json"), 8);
    writeFileSync(path, junk);
    expect(() => new SafetensorsFile(path)).toThrow(/bad.safetensors: the header is not valid JSON/);
  });

  test("an index naming a missing shard, a tensor in two files, an empty directory", () => {
    const a = fresh();
    writeFileSync(join(a, "model.safetensors.index.json"), JSON.stringify({ weight_map: { x: "model-00009.safetensors" } }));
    expect(() => new Checkpoint(a)).toThrow(/lists shard model-00009.safetensors, which is missing/);
    const b = fresh();
    writeSafetensors(join(b, "one.safetensors"), { x: f32([1], values.subarray(0, 1)) });
    writeSafetensors(join(b, "two.safetensors"), { x: f32([1], values.subarray(0, 1)) });
    expect(() => new Checkpoint(b)).toThrow(/tensor x is in both one.safetensors and two.safetensors/);
    expect(() => new Checkpoint(fresh())).toThrow(/no .safetensors files in/);
  });

  test("a shard that is a FIFO is refused at once, not waited on (issue 22, item 8)", () => {
    const dir = fresh();
    const fifo = join(dir, "model.safetensors");
    if (Bun.spawnSync(["mkfifo", fifo]).exitCode !== 0) throw new Error("mkfifo failed");
    expect(() => new Checkpoint(dir)).toThrow(/model\.safetensors: .* is not a regular file \(a FIFO, device or directory\)/);
    const indexed = fresh();
    Bun.spawnSync(["mkfifo", join(indexed, "model.safetensors.index.json")]);
    expect(() => new Checkpoint(indexed)).toThrow(/model\.safetensors\.index\.json: .* is not a regular file/);
  });

  test("a weight_map entry outside the checkpoint directory is refused before it is opened (issue 22, item 8)", () => {
    const outside = fresh();
    writeSafetensors(join(outside, "secret.safetensors"), { x: f32([1], values.subarray(0, 1)) });
    const dir = fresh();
    for (const name of [`../${outside.split("/").pop()}/secret.safetensors`, join(outside, "secret.safetensors"), "../../../../etc/passwd", "sub/../../x.safetensors"]) {
      writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ weight_map: { x: name } }));
      expect(() => new Checkpoint(dir)).toThrow(/weight_map names .* for x, outside the checkpoint directory/);
    }
    // a shard in a subdirectory of the checkpoint is fine
    mkdirSync(join(dir, "sub"));
    writeSafetensors(join(dir, "sub", "a.safetensors"), { x: f32([1], values.subarray(0, 1)) });
    writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ weight_map: { x: "sub/a.safetensors" } }));
    new Checkpoint(dir).close();
  });
});
