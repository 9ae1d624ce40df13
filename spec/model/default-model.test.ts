// The embedded default: the trained qwen4-exp-tiny that ships with the package.
import { expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { defaultModelDir } from "../../lib/model/default-model.ts";
import { openModel } from "../../lib/model/format.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";

test("the default model is the shipped qwen4-exp with every feature on, intact", async () => {
  const dir = await defaultModelDir();
  expect(existsSync(join(dir, "cherenkov.json"))).toBe(true);
  const m = await openModel(dir, { verify: true });
  const c = m.config;
  expect(c.architecture).toBe("qwen4-exp");
  expect(c.hc.streams).toBeGreaterThan(1);
  expect(c.attention.qsa).not.toBeNull();
  expect(c.ple).not.toBeNull();
  expect(c.mtp).not.toBeNull();
  m.close();
  const tok = await loadTokenizer(dir);
  expect(tok.decode(tok.encode("def main():\n    return 0"))).toBe("def main():\n    return 0");
});

test("the package ships it: package.json files include the model directory", async () => {
  const pkg = await Bun.file(join(import.meta.dir, "..", "..", "package.json")).json();
  expect(pkg.files).toContain("examples/models/qwen4-exp-tiny");
});
