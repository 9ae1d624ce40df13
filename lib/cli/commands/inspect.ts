// `cherenkov inspect DIR`: what a model directory holds, and (--verify) whether its bytes
// still match their checksums.
import { statSync } from "node:fs";
import type { ModelConfig } from "../../model/config.ts";
import { openModel, type ModelFiles } from "../../model/format.ts";
import { DENSE_FILE, EXPERTS_FILE, PLE_FILE } from "../../model/manifest.ts";
import { numel } from "../../model/tensors.ts";
import { parseFlags, UsageError, type FlagSpec } from "../args.ts";
import { progressSink, type CliIO } from "../io.ts";
import { formatBytes, ProgressBar } from "../progress.ts";

/** inspect's options (each shown with a description by `cherenkov help inspect`). */
export const INSPECT_FLAGS: FlagSpec = { json: { type: "boolean" }, verify: { type: "boolean" }, progress: { type: "boolean" } };

export async function inspectCommand(argv: string[], io: CliIO): Promise<number> {
  const { flags, positionals } = parseFlags(
    argv,
    INSPECT_FLAGS,
    1,
  );
  const dir = positionals[0];
  if (!dir) throw new UsageError("needs a model directory: cherenkov inspect DIR");
  const model = await openModel(dir);
  try {
    let verified: boolean | undefined;
    if (flags.verify) {
      const bar = new ProgressBar("verify", progressSink(io, flags.progress === true));
      try {
        await model.verify((d, t) => bar.update(d, t));
      } finally {
        bar.finish();
      }
      verified = true;
    }
    const summary = summarize(model);
    // "all match" only when every file has a checksum: an unsealed index or tokenizer is named
    const unverified = model.unverified;
    const verdict = !verified
      ? ""
      : unverified.length === 0
        ? "checksums: all match\n"
        : `checksums: the weights match; NOT verified (no checksum): ${unverified.join("; ")}\n  run \`cherenkov seal ${dir}\` after checking them\n`;
    if (flags.json) io.stdout(JSON.stringify({ ...summary, ...(verified ? { verified: unverified.length === 0, unverified } : {}) }) + "\n");
    else io.stdout(render(summary) + verdict);
  } finally {
    model.close();
  }
  return 0;
}

export function summarize(model: ModelFiles) {
  const m = model.manifest;
  const x = model.expertLayout;
  const files: Record<string, number> = {};
  for (const [name, path] of [
    [DENSE_FILE, model.paths.dense],
    [EXPERTS_FILE, model.paths.experts],
    [PLE_FILE, model.paths.ple],
  ] as const)
    if (path) files[name] = statSync(path).size;
  const expertParams = x.parts.reduce((s, p) => s + numel(p.shape), 0);
  const parameters = {
    dense: m.tensors.reduce((s, t) => s + numel(t.shape), 0),
    experts: expertParams * x.layers * x.perLayer,
    ple: (m.ple?.tables ?? []).reduce((s, t) => s + t.rows * m.config.ple!.head_dim, 0),
    /** Routed expert parameters one token touches in the trunk. */
    activeExperts: expertParams * m.config.num_layers * m.config.moe.top_k,
  };
  return {
    dir: model.dir,
    format: m.format,
    weights: m.weights,
    writer: m.writer,
    config: m.config,
    files,
    parameters,
    tensors: m.tensors.map(({ name, dtype, shape, offset, bytes }) => ({ name, dtype, shape, offset, bytes })),
    experts: { layers: x.layers, per_layer: x.perLayer, stride: x.stride, parts: x.parts },
    ple: m.ple ? { dtype: m.ple.dtype, tables: m.ple.tables.map(({ checksum: _, ...t }) => t) } : null,
  };
}

type Summary = ReturnType<typeof summarize>;

const count = (n: number) => (n >= 1e9 ? `${(n / 1e9).toFixed(2)}B` : n >= 1e6 ? `${(n / 1e6).toFixed(2)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}K` : `${n}`);

function describeConfig(c: ModelConfig): string[] {
  const kinds = (t: string) => c.layer_types.filter((x) => x === t).length;
  const at = c.attention;
  const qsa = at.qsa ? `, QSA ${at.qsa.heads}x${at.qsa.head_dim} top ${at.qsa.topk}` : ", no QSA";
  const shared = c.moe.shared_intermediate ? `, shared ${c.moe.shared_intermediate}` : ", no shared expert";
  const ple = c.ple
    ? `layers [${c.ple.layers.join(", ")}], orders [${c.ple.orders.join(", ")}], ${c.ple.heads} heads x ${c.ple.head_dim}`
    : "off";
  return [
    `config: ${c.architecture}, vocab ${c.vocab_size}, hidden ${c.hidden_size}, ${c.num_layers} layers (${kinds("deltanet")} deltanet, ${kinds("attention")} attention)`,
    `  residual: ${c.hc.streams === 1 ? "plain (1 stream)" : `hyper-connections, ${c.hc.streams} streams, ${c.hc.sinkhorn_iters} Sinkhorn iterations`}`,
    `  deltanet: ${c.deltanet.key_heads} key heads x ${c.deltanet.key_dim}, ${c.deltanet.value_heads} value heads x ${c.deltanet.value_dim}, conv ${c.deltanet.conv_kernel}`,
    `  attention: ${at.heads} heads (${at.kv_heads} kv) x ${at.head_dim}, rotary ${at.partial_rotary_factor}, theta ${at.rope_theta}, kv cache ${at.kv_cache}${qsa}`,
    `  moe: ${c.moe.experts} experts, top ${c.moe.top_k}, intermediate ${c.moe.intermediate}${shared}`,
    `  ple: ${ple}`,
    `  mtp: ${c.mtp ? `${c.mtp.max_drafts} drafts max` : "off"}`,
    `  eos ${c.eos_token_id ?? "none"}, bos ${c.bos_token_id ?? "none"}, ${c.tie_embeddings ? "tied" : "untied"} embeddings`,
  ];
}

function table(rows: string[][], rightAligned: Set<number>): string[] {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return rows.map((r) => "  " + r.map((cell, i) => (rightAligned.has(i) ? cell.padStart(widths[i]!) : cell.padEnd(widths[i]!))).join("  ").trimEnd());
}

export function render(s: Summary): string {
  const x = s.experts;
  const source = s.writer.source ? ` from ${JSON.stringify(s.writer.source)}` : "";
  const lines = [
    `model ${s.dir}: ${s.format}, weights ${s.weights}, written by ${s.writer.name} ${s.writer.version}${source}`,
    ...describeConfig(s.config),
    `parameters: ${count(s.parameters.dense)} dense, ${count(s.parameters.experts)} in experts, ${count(s.parameters.ple)} in PLE tables; ${count(s.parameters.dense + s.parameters.activeExperts)} active per token (trunk)`,
    "files:",
    ...table(
      Object.entries(s.files).map(([f, size]) => [f, formatBytes(size), `${size} bytes`]),
      new Set([1, 2]),
    ),
    `experts: ${x.layers} layers x ${x.per_layer} records, stride ${x.stride} bytes; record (l, e) at (l * ${x.per_layer} + e) * ${x.stride}`,
    ...table(
      [["part", "dtype", "shape", "offset", "bytes"], ...x.parts.map((p) => [p.name, p.dtype, `[${p.shape.join(", ")}]`, `${p.offset}`, `${p.bytes}`])],
      new Set([3, 4]),
    ),
  ];
  if (s.ple) lines.push(`ple: ${s.ple.tables.length} tables, ${s.ple.dtype}, rows of ${s.config.ple!.head_dim}`);
  lines.push(
    `tensors (${s.tensors.length}):`,
    ...table(
      [["name", "dtype", "shape", "bytes", "offset"], ...s.tensors.map((t) => [t.name, t.dtype, `[${t.shape.join(", ")}]`, `${t.bytes}`, `${t.offset}`])],
      new Set([3, 4]),
    ),
  );
  return lines.join("\n") + "\n";
}
