// The PyTorch implementation of qwen4-exp (spec/train/qwen4exp.py, which trains the shipped
// model) against lib/reference: on the random weights of check-cases.ts, the logits torch
// computed (committed in spec/train/fixtures, float64) must match the reference's trunk and MTP
// logits at every position within 1e-4 of the row's largest |logit|.
// Regenerate the fixtures after a change of the model or of RandomWeights:
//   bun spec/train/make-check-fixture.ts /tmp/check
//   python3 spec/train/check_agreement.py /tmp/check spec/train/fixtures
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { ReferenceModel } from "../../lib/reference/index.ts";
import { caseWeights, CHECK_CASES } from "./check-cases.ts";

interface TorchFixture {
  name: string;
  seed: number;
  prompt: number[];
  vocab: number;
  logits: string;
  mtpLogits?: string;
}

const TOLERANCE = 1e-4;

function decode(b64: string): Float32Array {
  const bytes = Buffer.from(b64, "base64");
  return new Float32Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
}

/** max over positions of max|ref - torch| / max|ref| of the row. */
function worstRelative(ref: Float32Array[], torch: Float32Array, vocab: number): number {
  expect(torch.length).toBe(ref.length * vocab);
  let worst = 0;
  ref.forEach((row, t) => {
    let diff = 0;
    let scale = 0;
    for (let i = 0; i < vocab; i++) {
      diff = Math.max(diff, Math.abs(row[i]! - torch[t * vocab + i]!));
      scale = Math.max(scale, Math.abs(row[i]!));
    }
    worst = Math.max(worst, diff / scale);
  });
  return worst;
}

describe("PyTorch qwen4-exp agrees with lib/reference", () => {
  for (const c of CHECK_CASES) {
    test(c.name, () => {
      const fx: TorchFixture = JSON.parse(readFileSync(join(import.meta.dir, "fixtures", `torch-${c.name}.json`), "utf8"));
      expect(fx.prompt).toEqual(c.prompt);
      expect(fx.seed).toBe(c.seed);
      const model = new ReferenceModel(caseWeights(c));
      expect(fx.vocab).toBe(model.config.vocab_size);
      const state = model.newState();
      const r = model.forward(state, c.prompt);
      expect(worstRelative(r.logits, decode(fx.logits), fx.vocab)).toBeLessThan(TOLERANCE);
      if (model.hasMtp) {
        expect(fx.mtpLogits).toBeDefined();
        const mtp = model.mtpForward(state, r.hidden.slice(0, -1), c.prompt.slice(1));
        expect(worstRelative(mtp.logits, decode(fx.mtpLogits!), fx.vocab)).toBeLessThan(TOLERANCE);
      }
    });
  }
});
