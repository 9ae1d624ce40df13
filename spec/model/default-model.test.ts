// The embedded default model: generated once into $CHERENKOV_HOME, deterministic, reused.
import { afterAll, expect, test } from "bun:test";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { synthesize } from "../../lib/convert/synth.ts";
import { defaultModelDir } from "../../lib/model/default-model.ts";

const home = mkdtempSync(join(tmpdir(), "cherenkov-home-"));
const saved = process.env.CHERENKOV_HOME;
process.env.CHERENKOV_HOME = home;
afterAll(() => {
  if (saved === undefined) delete process.env.CHERENKOV_HOME;
  else process.env.CHERENKOV_HOME = saved;
  rmSync(home, { recursive: true, force: true });
});

const hash = (dir: string, f: string) => Bun.hash.xxHash64(readFileSync(join(dir, f)));

test("generated on first use into $CHERENKOV_HOME/models/tiny-s0, equal to synth tiny seed 0 q4", async () => {
  const dir = await defaultModelDir();
  expect(dir).toBe(join(home, "models", "tiny-s0"));
  expect(readdirSync(join(home, "models"))).toEqual(["tiny-s0"]); // no temporary left behind
  const fresh = join(home, "fresh");
  await synthesize({ preset: "tiny", seed: 0, out: fresh, weights: "q4" });
  for (const f of ["cherenkov.json", "dense.bin", "experts.bin", "ple.bin", "tokenizer.json"]) expect(hash(dir, f)).toBe(hash(fresh, f));
});

test("reused afterwards, regenerated when the manifest is gone", async () => {
  const dir = await defaultModelDir();
  const before = statSync(join(dir, "dense.bin")).mtimeMs;
  await Bun.sleep(20);
  expect(await defaultModelDir()).toBe(dir);
  expect(statSync(join(dir, "dense.bin")).mtimeMs).toBe(before);
  rmSync(join(dir, "cherenkov.json"));
  expect(await defaultModelDir()).toBe(dir);
  expect(statSync(join(dir, "cherenkov.json")).isFile()).toBe(true);
  expect(statSync(join(dir, "dense.bin")).mtimeMs).toBeGreaterThan(before);
});
