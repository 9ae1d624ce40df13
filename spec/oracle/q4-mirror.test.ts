// The q4 oracles (logits_q4.f32 of the HF fixtures) were computed by transformers on weights
// quantized by spec/oracle/oracle_numerics.py, a numpy copy of lib/model/q4.ts. This test
// keeps the two in step: if quantizeQ4 changes how it rounds, it fails here first (then update
// the copy and regenerate the fixtures, see fixtures/README.md).
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { quantizeQ4 } from "../../lib/model/q4.ts";

const DIR = join(import.meta.dir, "fixtures", "q4_mirror");

test("quantizeQ4 makes the same bytes as the oracle's numpy copy (bf16 inputs, exact ties included)", () => {
  const weights = new Float32Array(readFileSync(join(DIR, "weights.f32")).buffer.slice(0));
  const want = new Uint8Array(readFileSync(join(DIR, "weights.q4")));
  expect(weights.length).toBe(64 * 128);
  const got = quantizeQ4(weights);
  expect(got.length).toBe(want.length);
  let differing = 0;
  for (let i = 0; i < want.length; i++) if (got[i] !== want[i]) differing++;
  expect(differing).toBe(0);
});
