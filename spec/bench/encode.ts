/**
 * The host's cost of recording one decode step into a command buffer that is released, never
 * committed, on the CPU backend or CHERENKOV_BACKEND (the recording is the same TypeScript and
 * the same C ABI calls for every backend): median and 10th percentile of N encodes, encoded directly
 * (`encodeTrunkStep`) and replayed from a recorded step (lib/gpu/recorded-step.ts: one
 * ck_encode_tape call for the fixed parts, the position-dependent dispatches encoded again).
 *
 *   N=1000 bun spec/bench/encode.ts [MODEL_DIR]
 */
import { Engine } from "../../lib/gpu/engine.ts";
import { encodeTrunkStep } from "../../lib/gpu/decode.ts";
import { SitePlan } from "../../lib/gpu/handshake.ts";
import { StepRecordings } from "../../lib/gpu/recorded-step.ts";
import { openModel } from "../../lib/model/format.ts";
import type { Backend } from "../../lib/shim.ts";
const files = await openModel(process.argv[2] ?? new URL("../../examples/models/qwen4-exp-tiny", import.meta.url).pathname);
const engine = await Engine.load(files, (process.env.CHERENKOV_BACKEND as Backend | undefined) ?? "cpu", {});
const gpu = engine.gpu;
const seq = engine.newSequence() as unknown as { state: Parameters<typeof encodeTrunkStep>[2]; forward(t: number[]): Promise<unknown> };
await seq.forward([1, 2, 3, 4, 5, 6, 7, 8]);
const recordings = new StepRecordings();
const n = Number(process.env.N ?? 400);

function time(replay: boolean): { median: number; p10: number; commands: number } {
  const times: number[] = [];
  let commands = 0;
  for (let i = 0; i < n; i++) {
    const cb = gpu.device.commandBuffer();
    const plan = new SitePlan(gpu.event, 1e6);
    const c0 = gpu.device.commandsEncoded;
    const t0 = performance.now();
    if (replay) recordings.encode({ device: gpu.device, cb }, plan, "bench", { pos0: 8 }, (ctx, plan, { pos0 }) => encodeTrunkStep(ctx, gpu, seq.state, { nb: 1, pos0, verify: false, logits: { from: 0, count: 1 } }, plan));
    else encodeTrunkStep({ device: gpu.device, cb }, gpu, seq.state, { nb: 1, pos0: 8, verify: false, logits: { from: 0, count: 1 } }, plan);
    times.push(performance.now() - t0);
    commands = gpu.device.commandsEncoded - c0;
    cb.release();
  }
  times.sort((a, b) => a - b);
  return { median: times[times.length >> 1]! * 1000, p10: times[(times.length / 10) | 0]! * 1000, commands };
}

for (const replay of [false, true]) {
  const t = time(replay);
  console.log(
    `encode one decode step ${replay ? "(replayed)" : "(direct)  "}: median ${t.median.toFixed(0)} us, p10 ${t.p10.toFixed(0)} us, ${t.commands} commands (${gpu.layersRun} layers, every layer resident: ${gpu.resident.allHeld()})`,
  );
}
await engine.close();
