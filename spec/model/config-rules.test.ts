// Config rules that keep implementations from silently disagreeing (docs/model.md, numeric rules).
import { expect, test } from "bun:test";
import { presetConfig } from "../../lib/convert/presets.ts";
import { parseConfig } from "../../lib/model/config.ts";

test("hyper-connections refuse an hc.eps that differs from rms_norm_eps, naming both", () => {
  const c = structuredClone(presetConfig("tiny")) as Record<string, any>;
  c.hc.eps = 1e-5;
  expect(() => parseConfig(c, "test.json")).toThrow(/config\.hc\.eps: is 0\.00001 but rms_norm_eps is 0\.000001/);
  c.rms_norm_eps = 1e-5;
  expect(parseConfig(c).hc.eps).toBe(1e-5);
  // With one stream there is no hc norm: the two may differ.
  const plain = structuredClone(presetConfig("tiny", { hc: false })) as Record<string, any>;
  plain.hc.eps = 1e-3;
  expect(parseConfig(plain).hc.eps).toBe(1e-3);
});
