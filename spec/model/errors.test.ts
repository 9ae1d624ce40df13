// Bad model directories: each fails with a ModelFormatError that names the file and the
// tensor or field at fault.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { cpSync, mkdtempSync, openSync, readFileSync, rmSync, truncateSync, writeFileSync, writeSync, closeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { synthesize } from "../../lib/convert/synth.ts";
import { ModelFormatError } from "../../lib/model/errors.ts";
import { openModel } from "../../lib/model/format.ts";
import { sealManifest, type Manifest } from "../../lib/model/manifest.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";

const root = mkdtempSync(join(tmpdir(), "cherenkov-errors-"));
const good = join(root, "good");
let copies = 0;
beforeAll(() => synthesize({ preset: "tiny", seed: 1, out: good, weights: "q4" }));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A fresh copy of the good model to damage. */
function copy(): string {
  const dir = join(root, `copy${copies++}`);
  cpSync(good, dir, { recursive: true });
  return dir;
}

const manifestOf = (dir: string): Manifest => JSON.parse(readFileSync(join(dir, "cherenkov.json"), "utf8"));
/** Edits cherenkov.json and seals it again (a valid manifest checksum), so later checks are reached. */
const editManifest = (dir: string, edit: (m: any) => void) => {
  const m = manifestOf(dir);
  edit(m);
  writeFileSync(join(dir, "cherenkov.json"), JSON.stringify(sealManifest(m as any)));
};

function flipByte(path: string, at: number) {
  const byte = readFileSync(path).subarray(at, at + 1);
  const fd = openSync(path, "r+");
  writeSync(fd, Uint8Array.of(byte[0]! ^ 0xff), 0, 1, at);
  closeSync(fd);
}

/** Runs `f`, expects a ModelFormatError, returns it. */
async function formatError(f: () => Promise<unknown>): Promise<ModelFormatError> {
  try {
    await f();
  } catch (e) {
    expect(e).toBeInstanceOf(ModelFormatError);
    return e as ModelFormatError;
  }
  throw new Error("expected a ModelFormatError");
}

describe("openModel on a damaged directory", () => {
  test("truncated dense.bin names the first tensor cut off", async () => {
    const dir = copy();
    const t = manifestOf(dir).tensors[10]!;
    truncateSync(join(dir, "dense.bin"), t.offset + 5);
    const e = await formatError(() => openModel(dir));
    expect(e.file).toBe("dense.bin");
    expect(e.tensor).toBe(t.name);
    expect(e.message).toMatch(new RegExp(`^dense\\.bin is truncated: ${t.offset + 5} bytes, expected \\d+ \\(tensor ${t.name.replace(/\./g, "\\.")} ends at ${t.offset + t.bytes}\\)`));
  });

  test("truncated experts.bin names the record cut off", async () => {
    const dir = copy();
    const { stride, per_layer } = manifestOf(dir).experts;
    const i = 2 * per_layer + 5; // layer 2 expert 5
    truncateSync(join(dir, "experts.bin"), i * stride + 100);
    const e = await formatError(() => openModel(dir));
    expect(e.file).toBe("experts.bin");
    expect(e.tensor).toBe("experts.2.5");
    expect(e.message).toContain(`experts.bin is truncated: ${i * stride + 100} bytes`);
    expect(e.message).toContain(`record layer 2 expert 5 ends at ${(i + 1) * stride}`);
  });

  test("truncated ple.bin names the table", async () => {
    const dir = copy();
    truncateSync(join(dir, "ple.bin"), 10);
    const e = await formatError(() => openModel(dir));
    expect(e.file).toBe("ple.bin");
    expect(e.message).toMatch(/^ple\.bin is truncated: 10 bytes.*table ple\.0\.0\.0/);
  });

  test("a flipped byte fails verify() naming the tensor, record or table", async () => {
    const dir = copy();
    const m = manifestOf(dir);
    const t = m.tensors.find((t) => t.name === "layers.3.attn.q")!;
    flipByte(join(dir, "dense.bin"), t.offset + 7);
    const model = await openModel(dir); // opening checks sizes only
    const e = await formatError(() => model.verify());
    expect(e.message).toMatch(/^dense\.bin: tensor layers\.3\.attn\.q: checksum mismatch \(expected [0-9a-f]{16}, got [0-9a-f]{16}\)$/);
    expect(e.tensor).toBe("layers.3.attn.q");
    model.close();

    const dir2 = copy();
    flipByte(join(dir2, "experts.bin"), (1 * m.experts.per_layer + 4) * m.experts.stride + 3);
    const e2 = await formatError(() => openModel(dir2, { verify: true }));
    expect(e2.file).toBe("experts.bin");
    expect(e2.message).toMatch(/^experts\.bin: record layer 1 expert 4: checksum mismatch/);

    const dir3 = copy();
    const table = m.ple!.tables[3]!;
    flipByte(join(dir3, "ple.bin"), table.offset);
    const e3 = await formatError(() => openModel(dir3, { verify: true }));
    expect(e3.message).toMatch(new RegExp(`^ple\\.bin: table ple\\.${table.layer}\\.${table.order_index}\\.${table.head}: checksum mismatch`));
  });

  test("a tensor missing from the index", async () => {
    const dir = copy();
    editManifest(dir, (m) => (m.tensors = m.tensors.filter((t: any) => t.name !== "layers.1.dn.z")));
    const e = await formatError(() => openModel(dir));
    expect(e.file).toBe("cherenkov.json");
    expect(e.tensor).toBe("layers.1.dn.z");
    expect(e.message).toBe("cherenkov.json: tensor layers.1.dn.z is missing from the index (the config needs it)");
  });

  test("a wrong shape in the index", async () => {
    const dir = copy();
    editManifest(dir, (m) => (m.tensors.find((t: any) => t.name === "embed").shape = [64, 320]));
    const e = await formatError(() => openModel(dir));
    expect(e.message).toBe("cherenkov.json: tensor embed: shape [64, 320] in the index, the config needs [320, 64]");
    expect(e.field).toBe("tensors.0.shape");
  });

  test("a wrong shape of an expert part", async () => {
    const dir = copy();
    editManifest(dir, (m) => (m.experts.parts[2].shape = [32, 64]));
    const e = await formatError(() => openModel(dir));
    expect(e.message).toMatch(/^cherenkov\.json: tensor experts\.down: shape \[32, 64\] in the index, the config needs \[64, 32\]/);
  });

  test("an unknown dtype", async () => {
    const dir = copy();
    editManifest(dir, (m) => (m.tensors[4].dtype = "q3"));
    const e = await formatError(() => openModel(dir));
    const name = manifestOf(good).tensors[4]!.name;
    expect(e.field).toBe("tensors.4.dtype");
    expect(e.tensor).toBe(name);
    expect(e.message).toStartWith(`cherenkov.json: tensor ${name}: tensors.4.dtype:`);
    expect(e.message).toContain("q4"); // lists the known dtypes
  });

  test("an invalid config field is named by its path", async () => {
    const dir = copy();
    editManifest(dir, (m) => (m.config.attention.head_dim = -16));
    const e = await formatError(() => openModel(dir));
    expect(e.field).toBe("config.attention.head_dim");
    expect(e.message).toMatch(/^cherenkov\.json: invalid config:\nconfig\.attention\.head_dim: /);
  });

  test("a byte count that does not match dtype and shape", async () => {
    const dir = copy();
    editManifest(dir, (m) => (m.tensors[0].bytes += 2));
    const e = await formatError(() => openModel(dir));
    expect(e.message).toMatch(/^cherenkov\.json: tensor embed: 12802 bytes in the index, q4 \[320, 64\] takes 12800$/);
  });

  test("an unaligned offset and a wrong checksum count", async () => {
    const dir = copy();
    editManifest(dir, (m) => (m.tensors[2].offset += 512));
    expect((await formatError(() => openModel(dir))).message).toMatch(/tensor .*: offset \d+ is not a multiple of 16384/);
    const dir2 = copy();
    editManifest(dir2, (m) => m.experts.checksums.pop());
    expect((await formatError(() => openModel(dir2))).message).toMatch(/experts\.checksums has 39 entries, expected 40/);
  });

  test("a wrong format string, bad JSON, a missing cherenkov.json or dense.bin", async () => {
    const dir = copy();
    editManifest(dir, (m) => (m.format = "cherenkov/0"));
    expect((await formatError(() => openModel(dir))).message).toMatch(/^cherenkov\.json: .*format/);

    const dir2 = copy();
    writeFileSync(join(dir2, "cherenkov.json"), "{ not json");
    const e2 = await formatError(() => openModel(dir2));
    expect(e2.message).toStartWith("cherenkov.json: not valid JSON");

    const dir3 = copy();
    rmSync(join(dir3, "cherenkov.json"));
    const e3 = await formatError(() => openModel(dir3));
    expect(e3.file).toBe("cherenkov.json");
    expect(e3.message).toBe(`cherenkov.json is missing in ${dir3} (not a model directory, or an unfinished write)`);

    const dir4 = copy();
    rmSync(join(dir4, "dense.bin"));
    const e4 = await formatError(() => openModel(dir4));
    expect(e4.file).toBe("dense.bin");
    expect(e4.message).toStartWith(`dense.bin is missing in ${dir4}`);
  });

  test("a directory that does not exist, or a file instead of a directory", async () => {
    const missing = join(root, "nope");
    const e = await formatError(() => openModel(missing));
    expect(e.file).toBe(missing);
    expect(e.message).toBe(`cannot open model directory ${missing}: ENOENT`);
    const file = join(good, "dense.bin");
    const e2 = await formatError(() => openModel(file));
    expect(e2.message).toStartWith(`${file} is not a directory`);
  });

  test("asking for a tensor or record the model does not have", async () => {
    const model = await openModel(good);
    expect(() => model.get("layers.9.attn.q")).toThrow("dense.bin: no tensor layers.9.attn.q in this model");
    expect(() => model.expert(5, 0)).toThrow("experts.bin: no record layer 5 expert 0 (5 layers of 8)");
    model.close();
  });

  test("a missing tokenizer.json is named", async () => {
    const dir = copy();
    rmSync(join(dir, "tokenizer.json"));
    const e = await formatError(() => loadTokenizer(dir));
    expect(e.file).toBe("tokenizer.json");
    expect(e.message).toBe(`tokenizer.json is missing in ${dir} (the model has no tokenizer)`);
  });
});
