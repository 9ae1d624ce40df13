/**
 * The host's cost of recording one decode step (`encodeTrunkStep` into a command buffer that is
 * released, never committed), on the CPU backend (the recording is the same TypeScript and the
 * same C ABI calls for every backend): median and 10th percentile of N encodes.
 *
 *   N=1000 bun spec/bench/encode.ts [MODEL_DIR]
 */
import { Engine } from "../../lib/gpu/engine.ts";
import { encodeTrunkStep } from "../../lib/gpu/decode.ts";
import { SitePlan } from "../../lib/gpu/handshake.ts";
import { openModel } from "../../lib/model/format.ts";
const files = await openModel(process.argv[2] ?? new URL("../../examples/models/qwen4-exp-tiny", import.meta.url).pathname);
const engine = await Engine.load(files, "cpu", {});
const gpu = engine.gpu;
const seq = engine.newSequence() as unknown as { state: Parameters<typeof encodeTrunkStep>[2]; forward(t: number[]): Promise<unknown> };
await seq.forward([1, 2, 3, 4, 5, 6, 7, 8]);
const times: number[] = [];
let dispatches = 0;
for (let i = 0; i < Number(process.env.N ?? 400); i++) {
  const cb = gpu.device.commandBuffer();
  const plan = new SitePlan(gpu.event, 1e6);
  const t0 = performance.now();
  encodeTrunkStep({ device: gpu.device, cb }, gpu, seq.state, { nb: 1, pos0: 8, verify: false, logits: { from: 0, count: 1 } }, plan);
  times.push(performance.now() - t0);
  cb.release();
}
times.sort((a, b) => a - b);
console.log(`encode one decode step: median ${(times[times.length >> 1]! * 1000).toFixed(0)} us, p10 ${(times[times.length / 10 | 0]! * 1000).toFixed(0)} us (${gpu.layersRun} layers)`);
await engine.close();
