// Integrity on the streaming path (issue 13 item 1): every expert record that lands in a pool
// slot is checked against its checksum before the slot is published, on both backings; a
// mismatch fails that request naming file, layer and expert, the slot is emptied and the
// model stays usable. Non-finite weights surface as a NonFiniteError naming the layer on both
// backends, never as a bogus expert id or a silent token 0.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, cpSync, openSync, readFileSync, readSync, rmSync, truncateSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import { ChecksumMismatchError, NonFiniteError } from "../../lib/model/errors.ts";
import { checksum } from "../../lib/model/checksum.ts";
import { sealManifest } from "../../lib/model/manifest.ts";
import { fsRead, type PositionalReader } from "../../lib/gpu/streaming.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel, type GoldenRecord } from "../golden/golden.ts";
import { goldenRecord, tempDir } from "./helpers.ts";

const q4 = goldenCases.find((x) => x.name === "tiny-all-s1")!;
const f32 = goldenCases.find((x) => x.name === "tiny-all-s3-f32")!;
let q4Dir: string;
let f32Dir: string;
let want: GoldenRecord;
const tmp = tempDir("integrity-engine");

beforeAll(async () => {
  q4Dir = await buildGoldenModel(q4);
  f32Dir = await buildGoldenModel(f32);
  want = await goldenRecord(q4.name);
});
afterAll(() => {
  rmSync(q4Dir, { recursive: true, force: true });
  rmSync(f32Dir, { recursive: true, force: true });
  tmp.remove();
});

let copies = 0;
function copyOf(dir: string): string {
  const out = join(tmp.dir, `m${copies++}`);
  cpSync(dir, out, { recursive: true });
  return out;
}

async function failure(f: () => Promise<unknown>): Promise<Error> {
  try {
    await f();
  } catch (e) {
    return e as Error;
  }
  throw new Error("expected the generation to fail");
}

/** Writes NaN over f32 tensor `name` and gives it a matching checksum (a file that is intact but not finite). */
function poison(dir: string, name: string) {
  const mp = join(dir, "cherenkov.json");
  const m = JSON.parse(readFileSync(mp, "utf8"));
  const t = m.tensors.find((x: { name: string }) => x.name === name);
  expect(t.dtype).toBe("f32");
  const bytes = new Uint8Array(t.bytes);
  new Float32Array(bytes.buffer).fill(NaN);
  const fd = openSync(join(dir, "dense.bin"), "r+");
  writeSync(fd, bytes, 0, bytes.length, t.offset);
  closeSync(fd);
  t.checksum = checksum(bytes);
  writeFileSync(mp, JSON.stringify(sealManifest(m)));
}

describe("expert records are verified as they land in the pool", () => {
  test("wired: a record corrupted in flight fails that request naming file, layer and expert; the slot is re-read and the model goes on exactly", async () => {
    let corrupt = 0;
    let hit: number | null = null;
    const reader: PositionalReader = async (file, into, position) => {
      const n = await fsRead(file, into, position);
      if (corrupt > 0 && --corrupt === 0) {
        into[123] = into[123]! ^ 0x10;
        hit = position;
      }
      return n;
    };
    const model = await Model.load(q4Dir, { backend: "cpu", engine: { poolSlots: 2, io: { reader } } });
    try {
      corrupt = 3;
      const e = await failure(() => model.generate(q4.prompt, { maxTokens: q4.maxTokens, stopAtEos: false }));
      expect(e).toBeInstanceOf(ChecksumMismatchError);
      const c = e as ChecksumMismatchError;
      expect(c.message).toMatch(/^experts\.bin: record layer \d+ expert \d+: checksum mismatch/);
      expect(c.file).toBe("experts.bin");
      const x = JSON.parse(readFileSync(join(q4Dir, "cherenkov.json"), "utf8")).experts;
      expect((c.layer! * x.per_layer + c.expert!) * x.stride).toBe(hit!);
      // The bad slot was emptied: the same request now reads the record again and matches golden.
      const again = await model.generate(q4.prompt, { maxTokens: q4.maxTokens, stopAtEos: false });
      expect(again.tokens).toEqual(want.tokens);
      const pool = (model.stats().engine as { pool: unknown }).pool;
      expect(pool).toBeDefined();
    } finally {
      await model.close();
    }
  }, 60_000);

  test("mapped: a record corrupted on disk fails naming it; once repaired, the same model generates exactly", async () => {
    const dir = copyOf(q4Dir);
    const x = JSON.parse(readFileSync(join(dir, "cherenkov.json"), "utf8")).experts;
    // No preload: it would check every record at load, before the corruption (resident.test.ts covers that).
    const model = await Model.load(dir, { backend: "cpu", engine: { backing: "mapped", preload: false } });
    try {
      // Corrupt every record of layer 0 in place (any token routes there), then repair them.
      const path = join(dir, "experts.bin");
      const fd = openSync(path, "r+");
      const orig = new Uint8Array(x.per_layer);
      for (let e = 0; e < x.per_layer; e++) {
        const at = e * x.stride + 40;
        readSync(fd, orig, e, 1, at);
        writeSync(fd, Uint8Array.of(orig[e]! ^ 0x01), 0, 1, at);
      }
      const err = await failure(() => model.generate(q4.prompt, { maxTokens: 4, stopAtEos: false }));
      expect(err).toBeInstanceOf(ChecksumMismatchError);
      expect(err.message).toMatch(/^experts\.bin: record layer 0 expert \d+: checksum mismatch/);
      for (let e = 0; e < x.per_layer; e++) writeSync(fd, orig, e, 1, e * x.stride + 40);
      closeSync(fd);
      expect((await model.generate(q4.prompt, { maxTokens: q4.maxTokens, stopAtEos: false })).tokens).toEqual(want.tokens);
    } finally {
      await model.close();
    }
  }, 60_000);

  test("engine load verifies dense.bin: a flipped byte is named before any step", async () => {
    const dir = copyOf(q4Dir);
    const m = JSON.parse(readFileSync(join(dir, "cherenkov.json"), "utf8"));
    const t = m.tensors[7];
    const fd = openSync(join(dir, "dense.bin"), "r+");
    const b = new Uint8Array(1);
    readSync(fd, b, 0, 1, t.offset + 3);
    writeSync(fd, Uint8Array.of(b[0]! ^ 0x80), 0, 1, t.offset + 3);
    closeSync(fd);
    const e = await failure(() => Model.load(dir, { backend: "cpu" }));
    expect(e).toBeInstanceOf(ChecksumMismatchError);
    expect(e.message).toBe(`dense.bin: tensor ${t.name}: checksum mismatch (expected ${t.checksum}, got ${(e.message.match(/got ([0-9a-f]{16})/) ?? [])[1]})`);
  }, 60_000);
});

describe("non-finite weights name the layer on both backends", () => {
  for (const backend of ["reference", "cpu"] as const) {
    test(`${backend}: NaN in layer 1's DeltaNet output projection`, async () => {
      const dir = copyOf(f32Dir);
      poison(dir, "layers.1.dn.out");
      const model = await Model.load(dir, { backend });
      try {
        const e = await failure(() => model.generate(f32.prompt, { maxTokens: 4, stopAtEos: false }));
        expect(e).toBeInstanceOf(NonFiniteError);
        expect((e as NonFiniteError).layer).toBe(1);
        expect(e.message).toMatch(/^layer 1: non-finite/);
        expect(e.message).not.toContain("2147483647");
        // The engine found it in the resident path: every layer preloaded and held, no site served at a handshake.
        if (backend === "cpu") expect((model.stats().engine as { resident: { fullyResident: boolean } }).resident.fullyResident).toBe(true);
      } finally {
        await model.close();
      }
    }, 60_000);

    test(`${backend}: NaN in the final norm is named as the output, never a silent token 0`, async () => {
      const dir = copyOf(f32Dir);
      poison(dir, "final_norm");
      const model = await Model.load(dir, { backend });
      try {
        const e = await failure(() => model.generate(f32.prompt, { maxTokens: 4, stopAtEos: false }));
        expect(e).toBeInstanceOf(NonFiniteError);
        expect((e as NonFiniteError).layer).toBeNull();
        expect(e.message).toMatch(/^the output logits: non-finite/);
      } finally {
        await model.close();
      }
    }, 60_000);
  }
});

describe("files changed under a running engine", () => {
  test("truncated in place: dense.bin and ple.bin are in memory (no SIGBUS), experts.bin reads fail cleanly naming the file", async () => {
    const dir = copyOf(q4Dir);
    const model = await Model.load(dir, { backend: "cpu", engine: { poolSlots: 2 } });
    try {
      const first = await model.generate(q4.prompt, { maxTokens: 4, stopAtEos: false });
      expect(first.tokens).toEqual(want.tokens.slice(0, 4));
      for (const f of ["dense.bin", "ple.bin", "experts.bin"]) truncateSync(join(dir, f), 0);
      const e = await failure(() => model.generate(q4.prompt, { maxTokens: q4.maxTokens, stopAtEos: false }));
      expect(e.message).toContain(join(dir, "experts.bin"));
      expect(e.message).toMatch(/short read|outside the file/);
    } finally {
      await model.close();
    }
  }, 60_000);

  test("rewritten by synth --force: the running engine keeps its old files and tokens", async () => {
    const dir = join(tmp.dir, "served");
    await synthesize({ preset: q4.preset, features: q4.features, seed: q4.seed, out: dir, weights: q4.dtype });
    const model = await Model.load(dir, { backend: "cpu", engine: { poolSlots: 2 } });
    try {
      await synthesize({ preset: q4.preset, features: q4.features, seed: q4.seed + 100, out: dir, weights: q4.dtype, force: true });
      expect((await model.generate(q4.prompt, { maxTokens: q4.maxTokens, stopAtEos: false })).tokens).toEqual(want.tokens);
    } finally {
      await model.close();
    }
    const fresh = await Model.load(dir, { backend: "cpu" });
    try {
      expect((await fresh.generate(q4.prompt, { maxTokens: q4.maxTokens, stopAtEos: false })).tokens).not.toEqual(want.tokens);
    } finally {
      await fresh.close();
    }
  }, 60_000);
});
