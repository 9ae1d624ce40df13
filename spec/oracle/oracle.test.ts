// The reference against transformers: every committed fixture (tiny random Qwen3-Next and
// Qwen3.5-MoE checkpoints, HF and MLX layouts, made by make_fixtures.py) is converted with
// the converter and run through lib/reference; its logits must match the ones transformers
// computed, at every position, and greedy decoding must pick the same tokens.
import { afterAll, describe, expect, test } from "bun:test";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { convertCheckpoint } from "../../lib/convert/convert.ts";
import { openModel } from "../../lib/model/format.ts";
import { generateGreedy, ReferenceModel } from "../../lib/reference/index.ts";

const FIXTURES = join(import.meta.dir, "fixtures");
/** max |a - b| / max |b| per position. */
const TOLERANCE = 1e-4;

interface LogitsRef {
  file: string;
  shape: [number, number];
}
interface Oracle {
  name: string;
  kind: string;
  prompt: number[];
  greedy?: number[];
  tokens?: number[];
  logits?: LogitsRef;
  q4: { greedy: number[]; tokens: number[]; logits: LogitsRef };
  mtp?: { logits: LogitsRef; logits_q4: LogitsRef };
}

const fixtures = readdirSync(FIXTURES)
  .filter((d) => existsSync(join(FIXTURES, d, "oracle.json")))
  .sort();
const work = mkdtempSync(join(tmpdir(), "cherenkov-oracle-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function readRows(dir: string, ref: LogitsRef): Float32Array[] {
  const all = new Float32Array(readFileSync(join(dir, ref.file)).buffer.slice(0));
  const [rows, cols] = ref.shape;
  expect(all.length).toBe(rows * cols);
  return Array.from({ length: rows }, (_, r) => all.subarray(r * cols, (r + 1) * cols));
}

/** Per position: max |got - want| / max |want|. */
function relativeErrors(got: Float32Array[], want: Float32Array[]): number[] {
  expect(got.length).toBe(want.length);
  return want.map((w, r) => {
    const g = got[r]!;
    expect(g.length).toBe(w.length);
    let diff = 0;
    let scale = 0;
    for (let i = 0; i < w.length; i++) {
      diff = Math.max(diff, Math.abs(g[i]! - w[i]!));
      scale = Math.max(scale, Math.abs(w[i]!));
    }
    return diff / scale;
  });
}

const report: string[] = [];
afterAll(() => console.log(`oracle: largest relative logit error per fixture\n${report.join("\n")}`));

for (const name of fixtures) {
  const dir = join(FIXTURES, name);
  const oracle: Oracle = JSON.parse(readFileSync(join(dir, "oracle.json"), "utf8"));
  const modes = oracle.logits ? (["f32", "q4"] as const) : (["q4"] as const);
  describe(`oracle ${name}`, () => {
    for (const mode of modes) {
      test(`${mode}: logits within ${TOLERANCE} of transformers at every position, same greedy tokens`, async () => {
        const out = join(work, `${name}-${mode}`);
        await convertCheckpoint({ src: dir, out, weights: mode, kvCache: "f32" });
        const weights = await openModel(out);
        try {
          const model = new ReferenceModel(weights);
          const tokens = mode === "f32" ? oracle.tokens! : oracle.q4.tokens;
          const greedy = mode === "f32" ? oracle.greedy! : oracle.q4.greedy;
          const want = readRows(dir, mode === "f32" ? oracle.logits! : oracle.q4.logits);
          const state = model.newState();
          const r = model.forward(state, tokens);
          const errs = relativeErrors(r.logits, want);
          const worst = Math.max(...errs);
          let line = `  ${name} ${mode}: ${worst.toExponential(2)} over ${errs.length} positions`;
          expect(worst).toBeLessThan(TOLERANCE);

          if (oracle.mtp) {
            // MTP row t: hidden of position t and token t+1, at MTP position t
            const T = tokens.length;
            const m = model.mtpForward(state, r.hidden.slice(0, T - 1), tokens.slice(1));
            const mtpErrs = relativeErrors(m.logits, readRows(dir, mode === "f32" ? oracle.mtp.logits : oracle.mtp.logits_q4));
            const mtpWorst = Math.max(...mtpErrs);
            line += `; MTP ${mtpWorst.toExponential(2)} over ${mtpErrs.length} rows`;
            expect(mtpWorst).toBeLessThan(TOLERANCE);
          }
          report.push(line);

          const g = generateGreedy(model, oracle.prompt, { maxTokens: greedy.length });
          expect(g.tokens).toEqual(greedy);
        } finally {
          weights.close();
        }
      });
    }
  });
}
