/**
 * The physical bound of each bench:decode configuration (docs/performance.md, H200 section):
 * per decode token, the bytes the GPU must touch over the HBM bandwidth, and the expert bytes
 * the run actually read from disk over the disk's measured direct-read bandwidth; the larger is
 * the floor, and a figure is shown as the fraction of the bound it reaches.
 *
 *   bun spec/bench/bound.ts --model DIR --hbm 4.3e12 --disk 2.5e9 results.json...
 *   bun spec/bench/bound.ts --preset 30b-a3b-shape --weights q4 --hbm 4.3e12 --disk 1.2e9 [--name m30] results.json...
 * (--preset computes the same sizes from the preset's config, for a model written elsewhere.)
 *
 * Bytes the GPU touches per token: every dense tensor except the embedding (one row) and the
 * MTP head (drafts only), top_k routed expert records per layer, the DeltaNet state read and
 * written, and the KV cache read at the run's context. Each results file holds
 * `bench:decode --json` outputs, one per line.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { presetConfig, type PresetName } from "../../lib/convert/presets.ts";
import { readManifest } from "../../lib/model/format.ts";
import { denseTensorSpecs, storageDType, tensorBytes } from "../../lib/model/tensors.ts";
import { planExperts } from "../../lib/model/writer.ts";
import type { DType } from "../../lib/model/config.ts";

const { values: o, positionals } = parseArgs({
  options: {
    model: { type: "string" },
    preset: { type: "string" },
    weights: { type: "string", default: "q4" },
    hbm: { type: "string", default: "4.3e12" },
    disk: { type: "string" },
    /** Only rows of this bench:decode model name (a results file may hold several models). */
    name: { type: "string" },
  },
  allowPositionals: true,
});
if ((!o.model && !o.preset) || !o.disk) throw new Error("usage: bun spec/bench/bound.ts (--model DIR | --preset NAME) --hbm BYTES_PER_S --disk BYTES_PER_S results.json...");
const weights = o.weights as DType;
const c = o.model ? readManifest(o.model).config : presetConfig(o.preset as PresetName);
const tensors = o.model
  ? readManifest(o.model).tensors
  : denseTensorSpecs(c).map((t) => ({ name: t.name, bytes: tensorBytes(t.shape, storageDType(t, weights)) }));
const stride = o.model ? readManifest(o.model).experts.stride : planExperts(c, weights).stride;
const hbm = Number(o.hbm);
const disk = Number(o.disk);

const dense = tensors.filter((t) => t.name !== "embed" && !/^mtp/.test(t.name)).reduce((s, t) => s + t.bytes, 0);
const experts = c.num_layers * c.moe.top_k * stride;
const deltanetLayers = c.layer_types.filter((t) => t === "deltanet").length;
const attnLayers = c.num_layers - deltanetLayers;
const dn = c.deltanet;
const state = deltanetLayers * dn.value_heads * dn.key_dim * dn.value_dim * 4 * 2;

interface Row {
  model: string;
  backing: string;
  lookahead: boolean;
  poolSlots: number;
  records: number;
  promptTokens: number;
  decodeTokens: number;
  tokensPerSecond: number;
  prefillTokensPerSecond: number;
  hitRate: number;
  phasesPerToken: Record<string, number>;
  handshakeUs: { all: { p50Us: number; p99Us: number } };
  decodeIoBytes: number;
}

const lines = [
  `model ${o.model ?? o.preset}: dense ${(dense / 1e9).toFixed(2)} GB/token, experts ${(experts / 1e9).toFixed(2)} GB/token (top-${c.moe.top_k} x ${c.num_layers} x ${stride} B), DeltaNet state ${(state / 1e6).toFixed(0)} MB/token; HBM ${(hbm / 1e12).toFixed(2)} TB/s, disk ${(disk / 1e9).toFixed(2)} GB/s`,
  "",
  "| pool | lookahead | prompt | decode tok/s | HBM bound tok/s | disk bound tok/s | bound tok/s | ratio | GPU ms/token (HBM floor ms) | prefill tok/s | handshake p50 / p99 us | io-wait share | hit rate |",
  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
];
// Each file holds bench:decode --json outputs, one per line (other lines, e.g. the peer's, are skipped).
const runs = positionals.flatMap((file) =>
  readFileSync(file, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l) as { models?: Row[] }),
);
for (const j of runs) {
  for (const r of j.models ?? []) {
    if (o.name && r.model !== o.name) continue;
    const context = r.promptTokens + r.decodeTokens / 2;
    const kvBytes = c.attention.kv_cache === "q8" ? 1 : 4;
    const kv = attnLayers * context * c.attention.kv_heads * c.attention.head_dim * kvBytes * 2;
    const gpuBytes = dense + experts + state + kv;
    const hbmTime = gpuBytes / hbm;
    const diskTime = (r.decodeIoBytes ?? 0) / r.decodeTokens / disk;
    const bound = 1 / Math.max(hbmTime, diskTime);
    const step = r.phasesPerToken.step ?? 0;
    const io = r.phasesPerToken["io-wait"] ?? 0;
    const pool = `${Math.round((100 * r.poolSlots) / r.records)}%`;
    const gpu = r.phasesPerToken.gpu ?? 0;
    const f1 = (x: number) => (x >= 100 ? x.toFixed(0) : x.toFixed(1));
    lines.push(
      `| ${pool} ${r.backing} | ${r.lookahead ? "on" : "off"} | ${r.promptTokens} | ${r.tokensPerSecond.toFixed(1)} | ${f1(1 / hbmTime)} | ${diskTime > 0 ? f1(1 / diskTime) : "-"} | ${f1(bound)} | ${((100 * r.tokensPerSecond) / bound).toFixed(1)}% | ${gpu.toFixed(1)} (${(1000 * hbmTime).toFixed(2)}) | ${r.prefillTokensPerSecond.toFixed(1)} | ${r.handshakeUs.all.p50Us} / ${r.handshakeUs.all.p99Us} | ${step > 0 ? ((100 * io) / step).toFixed(0) + "%" : "-"} | ${(100 * r.hitRate).toFixed(1)}% |`,
    );
  }
}
console.log(lines.join("\n"));
