// The converter beyond the numbers: MLX 4-bit weights pass through bit for bit, the MTP head
// and tokenizer files come along, and bad checkpoints fail before anything is written, with
// a message naming the tensor or field.
import { afterAll, describe, expect, test } from "bun:test";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { convertCommand } from "../../lib/cli/commands/convert.ts";
import type { CliIO } from "../../lib/cli/io.ts";
import { byteTokenizer, CHATML_TEMPLATE } from "../../lib/convert/byte-tokenizer.ts";
import { Model } from "../../lib/api/model.ts";
import { convertCheckpoint, openCheckpoint } from "../../lib/convert/convert.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import { canonicalName } from "../../lib/convert/hf.ts";
import { dequantizeAffine, unpackMlx } from "../../lib/convert/mlx.ts";
import { Checkpoint, writeSafetensors, type StWriteTensor } from "../../lib/convert/safetensors.ts";
import { openModel } from "../../lib/model/format.ts";
import { q4Layout } from "../../lib/model/q4.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";

const FIXTURES = join(import.meta.dir, "fixtures");
const work = mkdtempSync(join(tmpdir(), "cherenkov-convert-"));
afterAll(() => rmSync(work, { recursive: true, force: true }));
let counter = 0;
const out = () => join(work, `out${counter++}`);

/** A copy of a fixture's checkpoint, with tensors dropped or replaced and config fields edited. */
function editedCopy(
  fixture: string,
  edit: { drop?: string[]; replace?: Record<string, StWriteTensor>; config?: (c: Record<string, unknown>) => void },
): string {
  const src = join(FIXTURES, fixture);
  const dir = join(work, `ckpt${counter++}`);
  cpSync(src, dir, { recursive: true });
  const ck = new Checkpoint(dir);
  const tensors: Record<string, StWriteTensor> = {};
  for (const n of ck.names) {
    if (edit.drop?.includes(n)) continue;
    const info = ck.info(n);
    tensors[n] = edit.replace?.[n] ?? { dtype: info.dtype, shape: info.shape, data: ck.read(n) };
  }
  ck.close();
  for (const f of ["model.safetensors", "model.safetensors.index.json"]) rmSync(join(dir, f), { force: true });
  for (const f of new Bun.Glob("model-*.safetensors").scanSync(dir)) rmSync(join(dir, f));
  writeSafetensors(join(dir, "model.safetensors"), tensors);
  if (edit.config) {
    const c = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    edit.config(c);
    writeFileSync(join(dir, "config.json"), JSON.stringify(c));
  }
  return dir;
}

function bufferIO(): CliIO & { out: string; err: string } {
  const io = { out: "", err: "", stderrIsTTY: false, stdout: (t: string) => void (io.out += t), stderr: (t: string) => void (io.err += t) };
  return io;
}

describe("MLX checkpoints", () => {
  test("4-bit g64 weights become q4 bit for bit: nibbles are the u32 words' bytes, each scale and bias serves two groups of 32", async () => {
    const src = join(FIXTURES, "mlx_qwen3_next_g64");
    const dir = out();
    await convertCheckpoint({ src, out: dir, weights: "q4", kvCache: "f32" });
    const m = await openModel(dir);
    const ck = new Checkpoint(src);
    try {
      for (const [ours, theirs] of [["lm_head", "lm_head"], ["layers.1.attn.k", "model.layers.1.self_attn.k_proj"]] as const) {
        const stored = m.denseBytes(ours);
        expect(m.tensorInfo(ours).dtype).toBe("q4");
        const shape = m.tensorInfo(ours).shape;
        const L = q4Layout(shape[0]! * shape[1]!);
        expect(Array.from(stored.subarray(0, L.scalesOffset))).toEqual(Array.from(ck.read(`${theirs}.weight`)));
        const g64 = new Uint16Array(ck.read(`${theirs}.scales`).buffer);
        const g32 = new Uint16Array(stored.slice(L.scalesOffset, L.biasesOffset).buffer);
        expect(g32.length).toBe(2 * g64.length);
        g64.forEach((s, i) => {
          expect(g32[2 * i]).toBe(s);
          expect(g32[2 * i + 1]).toBe(s);
        });
      }
      // an expert record part: the slice of the stacked switch_mlp tensor
      const rec = m.readExpertRecord(1, 3);
      const part = m.expertLayout.parts.find((p) => p.name === "down")!;
      const words = ck.info("model.layers.1.mlp.switch_mlp.down_proj.weight");
      const per = words.bytes / words.shape[0]!;
      expect(Array.from(rec.subarray(part.offset, part.offset + per))).toEqual(Array.from(ck.read(words.name, 3 * per, per)));
      // norms come back as w (mlx-lm stores 1 + w)
      const stored = ck.readF32("model.norm.weight");
      const back = m.get("final_norm");
      stored.forEach((v, i) => expect(back[i]).toBe(Math.fround(v - 1)));
    } finally {
      ck.close();
      m.close();
    }
  });

  test("MLX packing: value j of a word sits in bits [b*j, b*(j+1)), low first; dequantization is scale * q + bias", () => {
    const words = new Uint8Array(new Uint32Array([0x76543210, 0xfedcba98]).buffer);
    expect(Array.from(unpackMlx(words, 4, 16))).toEqual(Array.from({ length: 16 }, (_, i) => i));
    expect(Array.from(unpackMlx(words, 8, 8))).toEqual([0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe]);
    expect(Array.from(unpackMlx(new Uint8Array([0b11100100]), 2, 4))).toEqual([0, 1, 2, 3]);
    const q = Uint8Array.from([0, 15, 3, 7]);
    expect(Array.from(dequantizeAffine(q, Float32Array.from([0.5, -0.25]), Float32Array.from([-1, 2]), 2))).toEqual([-1, 6.5, 1.25, 0.25]);
    expect(() => unpackMlx(words, 3, 10)).toThrow(/3-bit packing is not supported/);
  });
});

describe("expert records encoded in workers", () => {
  test("are byte for byte the records the single-threaded path writes (HF per-expert, HF fused, MLX)", async () => {
    for (const fixture of ["qwen3_next_r1", "qwen3_5_moe_r2", "mlx_qwen3_next_g64"]) {
      const a = out();
      const b = out();
      await convertCheckpoint({ src: join(FIXTURES, fixture), out: a, weights: "q4", workers: 0 });
      await convertCheckpoint({ src: join(FIXTURES, fixture), out: b, weights: "q4", workers: 3 });
      const ea = readFileSync(join(a, "experts.bin"));
      const eb = readFileSync(join(b, "experts.bin"));
      expect(ea.length).toBeGreaterThan(0);
      expect(Buffer.compare(ea, eb)).toBe(0);
      expect(readFileSync(join(b, "cherenkov.json"), "utf8")).toBe(readFileSync(join(a, "cherenkov.json"), "utf8"));
    }
  });
});

describe("what comes along", () => {
  test("the MTP head when the checkpoint has mtp.* tensors, unless mtp is switched off", async () => {
    const withMtp = openCheckpoint(join(FIXTURES, "qwen3_next_r1"));
    const noMtp = openCheckpoint(join(FIXTURES, "qwen3_next_r1"), { mtp: false });
    const none = openCheckpoint(join(FIXTURES, "qwen3_next_r2"));
    for (const o of [withMtp, noMtp, none]) o.ckpt.close();
    expect(withMtp.config.mtp).toEqual({ max_drafts: 3 });
    expect(withMtp.plan.dense.some((d) => d.name === "mtp.fc")).toBe(true);
    expect(noMtp.config.mtp).toBeNull();
    expect(none.config.mtp).toBeNull();
    expect(none.config.tie_embeddings).toBe(true);
    expect(none.config.attention.partial_rotary_factor).toBe(0.5);
    expect(withMtp.config.attention.kv_cache).toBe("q8");
  });

  test("Qwen3.5 VL-style names map to the text model; the vision tower is ignored", () => {
    expect(canonicalName("model.language_model.layers.0.mlp.gate.weight")).toBe("model.layers.0.mlp.gate.weight");
    expect(canonicalName("language_model.model.norm.weight")).toBe("model.norm.weight");
    expect(canonicalName("language_model.lm_head.weight")).toBe("lm_head.weight");
    expect(canonicalName("model.language_model.mtp.fc.weight")).toBe("mtp.fc.weight");
    expect(canonicalName("model.visual.blocks.0.norm1.weight")).toBeNull();
    const o = openCheckpoint(join(FIXTURES, "qwen3_5_moe_r2"));
    o.ckpt.close();
    expect(o.source.ignored).toEqual(["model.visual.blocks.0.norm1.weight"]);
    expect(o.config.moe.norm_topk_prob).toBe(true);
  });

  test("tokenizer.json and tokenizer_config.json are copied, chat_template.jinja folded in", async () => {
    const dir = editedCopy("qwen3_next_r2", {});
    const tok = byteTokenizer(300);
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tok.tokenizerJson));
    const { chat_template: _, ...cfg } = tok.tokenizerConfig;
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(cfg));
    writeFileSync(join(dir, "chat_template.jinja"), CHATML_TEMPLATE);
    const dest = out();
    await convertCheckpoint({ src: dir, out: dest, weights: "bf16" });
    const t = await loadTokenizer(dest);
    expect(t.decode(t.encode("héllo"))).toBe("héllo");
    expect(t.hasChatTemplate).toBe(true);
  });
});

describe("writing over another model (issue 22, items 5 and 6)", () => {
  test("convert --force from a checkpoint without tokenizer files removes the replaced model's tokenizer", async () => {
    const dest = out();
    await synthesize({ preset: "tiny", seed: 1, out: dest, weights: "q4" });
    expect(existsSync(join(dest, "tokenizer.json"))).toBe(true);
    await convertCheckpoint({ src: join(FIXTURES, "qwen3_next_r1"), out: dest, weights: "bf16", force: true, workers: 0 });
    expect(existsSync(join(dest, "tokenizer.json"))).toBe(false);
    expect(existsSync(join(dest, "tokenizer_config.json"))).toBe(false);
    const model = await Model.load(dest, { backend: "reference" });
    expect(model.tokenizer).toBeNull();
    await model.close();
  });

  test("temporary files a killed writer left are removed by the next run; a live writer's are kept", async () => {
    const dest = out();
    mkdirSync(dest);
    const dead = Bun.spawnSync(["true"]).pid; // a process that has exited
    const stale = [`.dense.bin.${dead}.1.abc123.tmp`, `.experts.bin.${dead}.2.zz9.tmp`, `.cherenkov.json.${dead}.7.q1.tmp`];
    for (const f of stale) writeFileSync(join(dest, f), "half a model");
    // only stale temps: the directory counts as empty (no --force needed)
    await convertCheckpoint({ src: join(FIXTURES, "qwen3_next_r1"), out: dest, weights: "bf16", workers: 0 });
    for (const f of stale) expect(existsSync(join(dest, f))).toBe(false);
    const live = `.dense.bin.${process.pid}.999.live1.tmp`;
    writeFileSync(join(dest, live), "another writer of this process");
    for (const f of stale) writeFileSync(join(dest, f), "half a model");
    await convertCheckpoint({ src: join(FIXTURES, "qwen3_next_r1"), out: dest, weights: "bf16", force: true, workers: 0 });
    for (const f of stale) expect(existsSync(join(dest, f))).toBe(false);
    expect(existsSync(join(dest, live))).toBe(true);
    expect(readdirSync(dest).filter((f) => f.endsWith(".tmp"))).toEqual([live]);
  });
});

describe("bad checkpoints fail before anything is written", () => {
  const expectFailure = async (src: string, pattern: RegExp) => {
    const dest = out();
    await expect(convertCheckpoint({ src, out: dest })).rejects.toThrow(pattern);
    expect(existsSync(dest)).toBe(false);
  };

  test("an unknown architecture names its model_type", async () => {
    const dir = editedCopy("qwen3_next_r2", { config: (c) => (c.model_type = "llama") });
    await expectFailure(dir, /config.json: model_type "llama" is not supported; cherenkov converts qwen3_next, qwen3_5_moe/);
  });

  test("a missing tensor is named", async () => {
    const dir = editedCopy("qwen3_next_r1", { drop: ["model.layers.3.self_attn.k_proj.weight"] });
    await expectFailure(dir, /missing tensor model\.layers\.3\.self_attn\.k_proj\.weight/);
    const experts = editedCopy("qwen3_5_moe_r2", { drop: ["mtp.layers.0.mlp.experts.down_proj"] });
    await expectFailure(experts, /missing tensor mtp\.layers\.0\.mlp\.experts\.down_proj/);
  });

  test("a shape that does not match the config, or an unreadable dtype, names the tensor (and both shapes and the config fields)", async () => {
    const wrong = editedCopy("qwen3_next_r1", {
      replace: { "model.layers.3.self_attn.q_norm.weight": { dtype: "F32", shape: [8], data: new Uint8Array(32) } },
    });
    await expectFailure(wrong, /tensor model\.layers\.3\.self_attn\.q_norm\.weight \(model\.safetensors\): shape \[8\], expected \[16\] = \[head_dim\]/);
    const fp8 = editedCopy("qwen3_next_r1", {
      replace: { "model.layers.3.self_attn.o_proj.weight": { dtype: "F8_E4M3", shape: [64, 64], data: new Uint8Array(4096) } },
    });
    await expectFailure(fp8, /tensor model\.layers\.3\.self_attn\.o_proj\.weight \(model\.safetensors\): dtype F8_E4M3 is not supported/);
    const config = editedCopy("qwen3_next_r1", { config: (c) => (c.moe_intermediate_size = 64) });
    await expectFailure(config, /tensor model\.layers\.0\.mlp\.experts\.0\.gate_proj\.weight .*shape \[32, 64\], expected \[64, 64\] = \[moe_intermediate_size, hidden_size\]/);
  });

  test("features cherenkov does not have are refused by name", async () => {
    await expectFailure(editedCopy("qwen3_next_r2", { config: (c) => (c.mlp_only_layers = [1]) }), /dense MLP layers \(mlp_only_layers \[1\]\) is not supported/);
    await expectFailure(
      editedCopy("qwen3_next_r2", { config: (c) => (c.rope_parameters = { rope_type: "yarn", rope_theta: 1e6, factor: 4 }) }),
      /rope_type "yarn" is not supported/,
    );
    const noConfig = editedCopy("qwen3_next_r2", {});
    rmSync(join(noConfig, "config.json"));
    await expectFailure(noConfig, /config.json is missing in/);
  });
});

describe("cherenkov convert", () => {
  test("converts, reports, and exits 0", async () => {
    const io = bufferIO();
    const dest = out();
    expect(await convertCommand([join(FIXTURES, "mlx_qwen3_5_moe_g32"), dest, "--kv", "f32"], io)).toBe(0);
    expect(io.out).toMatch(/^wrote .*: MLX qwen3_5_moe, q4, .* from .* in [\d.]+ s/);
    expect(io.err).toMatch(/MLX qwen3_5_moe checkpoint: 2 layers, 4 experts \(top 2\)/);
    const m = await openModel(dest);
    expect(m.config.attention.kv_cache).toBe("f32");
    m.close();
  });

  test("a bad checkpoint exits 1 with the reason; a bad command line is a usage error", async () => {
    const io = bufferIO();
    const bad = editedCopy("qwen3_next_r2", { config: (c) => (c.model_type = "mixtral") });
    expect(await convertCommand([bad, out()], io)).toBe(1);
    expect(io.err).toMatch(/cherenkov convert: config.json: model_type "mixtral" is not supported/);
    await expect(convertCommand([bad], io)).rejects.toThrow(/needs SRC_DIR and OUT_DIR/);
    await expect(convertCommand([bad, out(), "--dtype", "q8"], io)).rejects.toThrow(/--dtype: "q8" is not one of q4, bf16, f32/);
  });
});
