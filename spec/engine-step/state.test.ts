// Sequence state after speculation: a sequence that drafted, verified and rolled back holds
// the same state as one that ran the same tokens one by one (DeltaNet S and windows, PLE
// histories, K/V and index-key caches, lengths), up to the kernels' rounding; and reset()
// really forgets (the next prompt gives what a fresh sequence gives).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { Engine, type EngineSequence } from "../../lib/gpu/engine.ts";
import type { SequenceState } from "../../lib/gpu/state.ts";
import { openModel, type ModelFiles } from "../../lib/model/format.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { BACKEND } from "../selected-backend.ts";
import { withEnvVar } from "../env-var.ts";

const c = goldenCases.find((x) => x.name === "tiny-all-s1")!;
let dir: string;
let files: ModelFiles;
let engine: Engine;

beforeAll(async () => {
  dir = await buildGoldenModel(c);
  files = await openModel(dir);
  engine = await Engine.load(files, BACKEND);
});
afterAll(async () => {
  await engine.close();
  files.close();
  rmSync(dir, { recursive: true, force: true });
});

/** Largest |a - b| relative to the largest |b| (1 when lengths differ). */
function relDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) return 1;
  let diff = 0;
  let scale = 1e-6;
  for (let i = 0; i < a.length; i++) {
    diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
    scale = Math.max(scale, Math.abs(b[i]!));
  }
  return diff / scale;
}

/** The live fixed-size state and the cache rows up to `length`, by name. */
function live(s: SequenceState): Map<string, ArrayLike<number>> {
  const m = new Map<string, ArrayLike<number>>();
  const n = s.length;
  // Device storage (GPU memory on cuda): the host mirror is current only after a download.
  const fetch = (b: { download(): void }) => b.download();
  for (const a of s.attention) if (a) [a.k, a.v, ...(a.ik ? [a.ik] : [])].forEach((kv) => fetch(kv.data as { download(): void }));
  s.deltanet.forEach((d, l) => {
    if (!d) return;
    m.set(`dn${l}.S`, s.readPiece(d.S));
    m.set(`dn${l}.conv`, s.readPiece(d.conv));
  });
  s.ple.forEach((h, l) => h && m.set(`ple${l}`, s.readPiece(h)));
  s.attention.forEach((a, l) => {
    if (!a) return;
    const codes = (kv: typeof a.k) => new Int8Array((kv.data as { bytes: Uint8Array }).bytes.buffer, (kv.data as { bytes: Uint8Array }).bytes.byteOffset, n * kv.heads * kv.dim);
    m.set(`attn${l}.k`, codes(a.k));
    m.set(`attn${l}.v`, codes(a.v));
    if (a.ik) m.set(`attn${l}.ik`, codes(a.ik));
  });
  m.set("tokens", s.tokens.i32.slice(0, n));
  return m;
}

test("after drafts, verification and rollbacks the state equals the plain sequence's", async () => {
  const spec: EngineSequence = engine.newSequence();
  const plain: EngineSequence = engine.newSequence();
  const first = await spec.forward(c.prompt);
  let next = first.next[first.next.length - 1]!;
  const made: number[] = [next];
  let proposed = 0;
  let accepted = 0;
  while (made.length < 13) {
    const r = await spec.speculate(next, 3);
    proposed += r.proposed;
    accepted += r.next.length - 1;
    made.push(...r.next);
    next = r.next[r.next.length - 1]!;
  }
  // Random weights: most drafts are rejected, so most steps rolled back.
  expect(proposed - accepted).toBeGreaterThan(0);
  const tokens = [...c.prompt, ...made.slice(0, -1)];
  await plain.forward(c.prompt);
  for (const t of made.slice(0, -1)) await plain.forward([t]);
  expect(spec.length).toBe(tokens.length);
  expect(plain.length).toBe(tokens.length);
  // The last cycle's rollback waits for the sequence's next step: run it to read the state here.
  spec.settle();
  const a = live(spec.state);
  const b = live(plain.state);
  expect([...a.keys()]).toEqual([...b.keys()]);
  expect(Array.from(a.get("tokens")!)).toEqual(tokens);
  for (const [name, values] of a) {
    // q8 codes may move by one step where rounding differs; floats by the kernels' rounding.
    const tol = name.startsWith("attn") ? 2 / 127 + 1e-6 : 1e-4;
    expect({ name, diff: relDiff(values, b.get(name)!) <= tol }).toEqual({ name, diff: true });
  }
  spec.dispose();
  plain.dispose();
});

test("reset() forgets everything: the same prompt gives the same next token as a fresh sequence", async () => {
  const fresh = engine.newSequence();
  // Every row's token, not only the last one's.
  const want = await fresh.forward(c.prompt, { logits: "all" });
  const s = engine.newSequence();
  await s.forward([5, 6, 7, 8, 9]);
  s.reset();
  expect(s.length).toBe(0);
  const got = await s.forward(c.prompt, { logits: "all" });
  expect(got.next.length).toBe(c.prompt.length);
  expect(got.next).toEqual(want.next);
  expect(relDiff(got.margins, want.margins)).toBeLessThan(1e-6);
  fresh.dispose();
  s.dispose();
});

// Issue 9 item 6: Model.load must not build every pipeline (on Metal each one is a GPU
// compile, and the self-test kernels are never used by the engine): they are built lazily,
// at load only those of the steps it records (Engine.warmSteps: the decode row and the cycles).
test("pipelines are built on first use: at load only the recorded steps' engine kernels (none without them), only engine kernels after a step", async () => {
  const cold = await withEnvVar("CHERENKOV_WARM_STEPS", "0", () => Engine.load(files, BACKEND));
  try {
    expect(cold.gpu.device.library().builtPipelines()).toEqual([]);
  } finally {
    await cold.close();
  }
  const fresh = await Engine.load(files, BACKEND);
  try {
    const library = fresh.gpu.device.library();
    const atLoad = library.builtPipelines();
    expect(fresh.recordedSteps.recorded).toBeGreaterThan(0);
    expect(atLoad.length).toBeGreaterThan(3);
    expect(atLoad.filter((n) => n.startsWith("selftest_"))).toEqual([]);
    expect(atLoad.length).toBeLessThan(library.kernelNames().length);
    const seq = fresh.newSequence();
    try {
      await seq.forward(c.prompt.slice(0, 2));
    } finally {
      seq.dispose();
    }
    const built = library.builtPipelines();
    expect(built.length).toBeGreaterThan(3);
    expect(built.filter((n) => n.startsWith("selftest_"))).toEqual([]);
    expect(built.length).toBeLessThan(library.kernelNames().length);
  } finally {
    await fresh.close();
  }
});
