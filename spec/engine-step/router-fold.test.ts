// The router's softmax + top-k folded into a resident decode site's gate and up
// (moe_gate_up_pairs_routed, lib/gpu/moe-site.ts foldsRouter): a decode step at pool 100%
// encodes exactly one command fewer per MoE layer than before (no router_topk_f32), on top of
// the handshake's signal and wait, and a served site keeps router_topk. The tokens stay the
// golden ones either way.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { Engine } from "../../lib/gpu/engine.ts";
import type { EngineOptions } from "../../lib/gpu/load.ts";
import { openModel } from "../../lib/model/format.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel, type GoldenRecord } from "../golden/golden.ts";
import { countDispatches, goldenRecord } from "./helpers.ts";
import { BACKEND } from "../selected-backend.ts";
import { StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { withEnvVar } from "../env-var.ts";

const c = goldenCases.find((x) => x.name === "tiny-all-s1")!;
const L = 4; // the tiny preset's trunk layers, each with a MoE site
let dir: string;
let want: GoldenRecord;

beforeAll(async () => {
  dir = await buildGoldenModel(c);
  want = await goldenRecord(c.name);
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Run {
  tokens: number[];
  /** Commands (dispatches, signals, waits) per decode step, after the prompt. */
  commandsPerToken: number;
  /** Dispatches by kernel over the whole run, as encoded (a recorded step's once, at its recording). */
  kernels: Map<string, number>;
  residentLayers: number;
}

async function generate(opts: EngineOptions): Promise<Run> {
  const files = await openModel(dir);
  // Dispatches are counted as encoded: steps recorded at load (Engine.warmSteps) would be
  // encoded before the count, and only replayed in it.
  const engine = await withEnvVar("CHERENKOV_WARM_STEPS", "0", () => Engine.load(files, BACKEND, opts));
  try {
    const tokens: number[] = [];
    let commands = 0;
    const kernels = await countDispatches(async () => {
      const seq = engine.newSequence();
      const first = await seq.forward(c.prompt);
      tokens.push(first.next[first.next.length - 1]!);
      const cmds0 = engine.gpu.device.commandsEncoded;
      while (tokens.length < c.maxTokens) tokens.push((await seq.forward([tokens[tokens.length - 1]!])).next[0]!);
      commands = engine.gpu.device.commandsEncoded - cmds0;
    });
    const stats = engine.stats() as unknown as { resident: { residentLayers: number } };
    return { tokens, commandsPerToken: commands / (c.maxTokens - 1), kernels, residentLayers: stats.resident.residentLayers };
  } finally {
    await engine.close();
    files.close();
  }
}

describe("router_topk folded into the resident decode gate and up", () => {
  let resident: Run;
  let served: Run;
  beforeAll(async () => {
    resident = await generate({}); // preload "auto": pool 100% on this model, every site resident
    served = await generate({ pool: "50%", lookahead: false }); // every site at a handshake, no lookahead routes
  });

  test("the golden tokens both ways", () => {
    expect(resident.tokens).toEqual(want.tokens);
    expect(served.tokens).toEqual(want.tokens);
    expect(resident.residentLayers).toBe(L + 1); // the trunk layers and the MTP head's
    expect(served.residentLayers).toBe(0);
  });

  test("a resident decode step: 3 commands fewer per MoE layer than a served one (signal, wait, router_topk)", () => {
    expect(Number.isInteger(served.commandsPerToken)).toBe(true);
    expect(resident.commandsPerToken).toBe(served.commandsPerToken - 3 * L);
  });

  test("decode steps run moe_gate_up_pairs_routed when resident, router_topk + moe_gate_up_pairs when served", () => {
    const n = (run: Run, k: string) => run.kernels.get(k) ?? 0;
    const steps = c.maxTokens - 1;
    // Resident: the decode step is recorded once (its replays encode the same commands); with
    // recording off (CHERENKOV_RECORDED_STEPS=0) every step encodes directly, and with every
    // replay checked against a fresh encode (CHERENKOV_CHECK_RECORDING=1) every step encodes
    // on top of the recording.
    const encodes = !StepRecordings.enabled ? steps : StepRecordings.check ? steps + 1 : 1;
    expect(n(resident, "moe_gate_up_pairs_routed_q4_f32")).toBe(encodes * L);
    expect(n(resident, "moe_gate_up_pairs_q4_f32")).toBe(0);
    // Served: every decode step is encoded directly (a handshake cannot be recorded).
    expect(n(served, "moe_gate_up_pairs_routed_q4_f32")).toBe(0);
    expect(n(served, "moe_gate_up_pairs_q4_f32")).toBe(steps * L);
    // router_topk: only the prompt's step when resident (a chunk is not a decode step).
    expect(n(served, "router_topk_f32") - n(resident, "router_topk_f32")).toBe(steps * L);
  });
});
