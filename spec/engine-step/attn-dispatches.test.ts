// The attention mixer's fused dispatches in whole runs (lib/gpu/mixers.ts): q/k norms, RoPE
// and the K/V appends go through attn_prep, the output gate through the attention kernels'
// epilogue, so no rope_neox_f32 or ew_sigmoid_mul_f32 is encoded at all and kv_append only
// for QSA's index keys; the tokens stay the golden ones (q8 and f32 caches). Dispatches are
// seen where they are encoded: directly, or onto a recorded step's tape.
import { afterAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { Engine } from "../../lib/gpu/engine.ts";
import { openModel } from "../../lib/model/format.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { countDispatches, goldenRecord } from "./helpers.ts";
import { BACKEND } from "../selected-backend.ts";

const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));


describe("attention mixer: fused norms + RoPE + appends, gate in the attention epilogue", () => {
  test.each([
    { name: "tiny-all-s1", prep: "attn_prep_q8" },
    { name: "tiny-plain-s4", prep: "attn_prep_q8" },
    { name: "tiny-all-s3-f32", prep: "attn_prep_f32" },
  ])("$name: golden tokens, $prep, no unfused RoPE / gate / K-V / index-key append", async ({ name, prep }) => {
    const c = goldenCases.find((x) => x.name === name)!;
    const dir = await buildGoldenModel(c);
    dirs.push(dir);
    const want = await goldenRecord(name);
    const files = await openModel(dir);
    const engine = await Engine.load(files, BACKEND, {});
    const tokens: number[] = [];
    try {
      const seen = await countDispatches(async () => {
        const seq = engine.newSequence();
        const first = await seq.forward(c.prompt);
        tokens.push(first.next[first.next.length - 1]!);
        while (tokens.length < c.maxTokens) tokens.push((await seq.forward([tokens[tokens.length - 1]!])).next[0]!);
      });
      expect(tokens).toEqual(want.tokens);
      expect(seen.get(prep) ?? 0).toBeGreaterThanOrEqual(c.maxTokens); // prefill + every decode step
      expect(seen.get("rope_neox_f32")).toBeUndefined();
      expect(seen.get("ew_sigmoid_mul_f32")).toBeUndefined();
      const appends = [...seen].filter(([k]) => k.startsWith("kv_append_")).reduce((n, [, v]) => n + v, 0);
      // QSA's index keys are normed and appended by attn_prep too (kernels/rope.metal).
      expect(appends).toBe(0);
    } finally {
      await engine.close();
      files.close();
    }
  });
});
