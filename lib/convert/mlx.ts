// MLX (mlx-lm) checkpoints of Qwen3-Next / Qwen3.5-MoE as a TensorSource in Hugging Face
// terms. mlx-lm saves its own layout: routed experts stacked as mlp.switch_mlp.{gate,up,down}_proj
// [E, ...], conv1d as [C, K, 1], zero-centred norms stored as 1 + w, and quantized linears as
// `weight` (uint32 words) + `scales` + `biases` (w = scale * q + bias, affine). A word holds
// 32/bits values, value j in bits [bits*j, bits*(j+1)) (low first), so at 4 bits the words'
// little-endian bytes are exactly cherenkov's q4 nibbles (even column in the low nibble). A
// group of 64 (or 128) is two (four) groups of 32 with the same scale and bias: 4-bit MLX
// weights become q4 rows bit for bit.
import { bf16BitsToF32, f32ToBf16 } from "../model/dtype.ts";
import { Q4_GROUP } from "../model/q4.ts";
import { canonicalName, ConvertError, rowsCols, type TensorSource } from "./hf.ts";
import { RowMatrix } from "./rows.ts";
import { toF32, type Checkpoint } from "./safetensors.ts";

type Json = Record<string, unknown>;

/** Norm weights mlx-lm stores shifted (as 1 + w) in Qwen3-Next / Qwen3.5 (mlx_lm sanitize). */
const SHIFTED_NORM_SUFFIXES = [".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight", ".k_norm.weight"];

export interface QuantParams {
  group: number;
  bits: number;
}

/** Whether a checkpoint is in mlx-lm's layout (quantized, or float with MLX's conv/norm layout). */
export function isMlxCheckpoint(raw: Json, ckpt: Checkpoint): boolean {
  if (raw.quantization && typeof raw.quantization === "object") return true;
  return ckpt.names.some((n) => n.includes(".switch_mlp.") || n.endsWith(".scales") || (n.endsWith("conv1d.weight") && isMlxConv(ckpt.info(n).shape)));
}

/** mlx-lm keeps conv1d as [C, K, 1]; Hugging Face as [C, 1, K] (mlx-lm tests the last dim the same way). */
const isMlxConv = (shape: readonly number[]) => shape.length === 3 && shape[2] === 1 && shape[1]! > 1;

/** Unpacks MLX words of `bits` (2, 4 or 8) into one value per byte. */
export function unpackMlx(words: Uint8Array, bits: number, count: number): Uint8Array {
  if (bits !== 2 && bits !== 4 && bits !== 8) throw new Error(`MLX ${bits}-bit packing is not supported (2, 4, 8)`);
  const out = new Uint8Array(count);
  const mask = (1 << bits) - 1;
  const perByte = 8 / bits;
  for (let i = 0; i < count; i++) out[i] = (words[Math.floor(i / perByte)]! >> ((i % perByte) * bits)) & mask;
  return out;
}

/** f32(scale * q + bias) per group, as the q4 reader rounds (the product is exact in f64). */
export function dequantizeAffine(q: Uint8Array, scales: Float32Array, biases: Float32Array, group: number): Float32Array {
  const out = new Float32Array(q.length);
  for (let i = 0; i < q.length; i++) {
    const g = Math.floor(i / group);
    out[i] = scales[g]! * q[i]! + biases[g]!;
  }
  return out;
}

interface Entry {
  stored: string;
  /** dim-0 index into a stacked switch_mlp tensor */
  expert?: number;
  quant?: QuantParams & { scales: string; biases: string };
  shifted?: boolean;
  shape: number[];
}

export class MlxSource implements TensorSource {
  private entries = new Map<string, Entry>();
  readonly ignored: string[] = [];
  private readonly quant: Json;

  constructor(private readonly ckpt: Checkpoint, raw: Json) {
    this.quant = ((raw.quantization ?? raw.quantization_config ?? {}) as Json) || {};
    const mode = this.quant.mode;
    if (mode !== undefined && mode !== "affine")
      throw new ConvertError(`config.json: MLX quantization mode "${mode}" is not supported (only affine)`);
    const names = new Set(ckpt.names);
    const sanitized = ckpt.names.some((n) => n.endsWith("conv1d.weight") && isMlxConv(ckpt.info(n).shape));
    for (const stored of ckpt.names) {
      if (stored.endsWith(".scales") || stored.endsWith(".biases")) {
        const base = stored.slice(0, stored.lastIndexOf("."));
        if (names.has(`${base}.weight`)) continue;
      }
      const canon = canonicalName(stored);
      if (canon === null) {
        this.ignored.push(stored);
        continue;
      }
      const info = ckpt.info(stored);
      let shape = info.shape;
      let quant: Entry["quant"];
      if (stored.endsWith(".weight") && names.has(stored.replace(/\.weight$/, ".scales"))) {
        const base = stored.slice(0, -".weight".length);
        quant = { ...this.quantParams(base, info.shape, ckpt.info(`${base}.scales`).shape), scales: `${base}.scales`, biases: `${base}.biases` };
        if (!names.has(quant.biases)) throw new ConvertError(`${info.file}: quantized tensor ${stored} has scales but no ${quant.biases}`, stored);
        shape = [...info.shape.slice(0, -1), (info.shape[info.shape.length - 1]! * 32) / quant.bits];
      }
      if (canon.endsWith("conv1d.weight") && isMlxConv(shape)) shape = [shape[0]!, 1, shape[1]!];
      const shifted = sanitized && shape.length === 1 && SHIFTED_NORM_SUFFIXES.some((s) => canon.endsWith(s));
      const sw = canon.match(/^(.*\.mlp\.)switch_mlp\.(gate_proj|up_proj|down_proj)\.weight$/);
      if (sw) {
        // one logical per-expert tensor per slice of the stacked one
        for (let e = 0; e < shape[0]!; e++)
          this.entries.set(`${sw[1]}experts.${e}.${sw[2]}.weight`, { stored, expert: e, quant, shape: shape.slice(1) });
        continue;
      }
      this.entries.set(canon, { stored, quant, shifted, shape });
    }
  }

  /** Group size and bits of a quantized module: config.json's per-module entry, else its default. */
  private quantParams(module: string, weightShape: number[], scalesShape: number[]): QuantParams {
    const own = this.quant[module];
    const p = (own && typeof own === "object" ? own : this.quant) as Json;
    const group = p.group_size as number | undefined;
    const bits = p.bits as number | undefined;
    const packed = weightShape[weightShape.length - 1]!;
    const groups = scalesShape[scalesShape.length - 1]!;
    if (typeof group !== "number" || typeof bits !== "number")
      throw new ConvertError(`config.json: no MLX quantization group_size/bits for ${module} (quantization: ${JSON.stringify(this.quant).slice(0, 200)})`, `${module}.weight`);
    if (groups * group !== (packed * 32) / bits)
      throw new ConvertError(
        `tensor ${module}.weight: ${packed} words per row at ${bits} bits do not match ${groups} scales of group ${group}; check config.json's quantization`,
        `${module}.weight`,
      );
    return { group, bits };
  }

  get names(): string[] {
    return [...this.entries.keys()];
  }

  has(name: string): boolean {
    return this.entries.has(name);
  }

  private entry(name: string): Entry {
    const e = this.entries.get(name);
    if (!e) throw new ConvertError(`missing tensor ${name}`, name);
    return e;
  }

  shape(name: string): number[] {
    return this.entry(name).shape;
  }

  where(name: string): string {
    return this.ckpt.info(this.entry(name).stored).file;
  }

  matrix(name: string, index?: number): RowMatrix {
    const e = this.entry(name);
    if (e.expert !== undefined && index !== undefined) throw new Error(`MlxSource: ${name} is already one expert's slice`);
    const slice = e.expert ?? index;
    const [rows, cols] = rowsCols(e.shape, index !== undefined);
    if (!e.quant) {
      const v = this.ckpt.readF32(e.stored, slice);
      if (e.shifted) for (let i = 0; i < v.length; i++) v[i] = v[i]! - 1;
      return RowMatrix.f32(rows, cols, v);
    }
    const { group, bits } = e.quant;
    const n = rows * cols;
    const words = this.readSlice(e.stored, slice);
    const scales = this.readSlice(e.quant.scales, slice);
    const biases = this.readSlice(e.quant.biases, slice);
    const scaleType = this.ckpt.info(e.quant.scales).dtype;
    if (bits === 4 && group % Q4_GROUP === 0) {
      const toBits = (bytes: Uint8Array, dtype: string, tensor: string) => (dtype === "BF16" ? new Uint16Array(bytes.slice().buffer) : exactBf16(bytes, dtype, tensor));
      const repeat = group / Q4_GROUP;
      const widen = (p: Uint16Array) => {
        if (repeat === 1) return p;
        const out = new Uint16Array(p.length * repeat);
        for (let i = 0; i < p.length; i++) out.fill(p[i]!, i * repeat, (i + 1) * repeat);
        return out;
      };
      return RowMatrix.fromQ4(rows, cols, {
        nibbles: words,
        scales: widen(toBits(scales, scaleType, e.quant.scales)),
        biases: widen(toBits(biases, this.ckpt.info(e.quant.biases).dtype, e.quant.biases)),
      });
    }
    const s = toF32(scales, scaleType, `tensor ${e.quant.scales}`);
    const b = toF32(biases, this.ckpt.info(e.quant.biases).dtype, `tensor ${e.quant.biases}`);
    return RowMatrix.f32(rows, cols, dequantizeAffine(unpackMlx(words, bits, n), s, b, group));
  }

  /** The bytes of a stored tensor, or of its slice along dim 0. */
  private readSlice(stored: string, slice: number | undefined): Uint8Array {
    const info = this.ckpt.info(stored);
    if (slice === undefined) return this.ckpt.read(stored);
    const per = info.bytes / info.shape[0]!;
    return this.ckpt.read(stored, slice * per, per);
  }
}


/**
 * The bf16 bits of f16/f32 scales or biases, which must all be exact bf16 values: cherenkov's q4
 * keeps them in bf16, and rounding them would silently change every weight of their groups.
 */
function exactBf16(bytes: Uint8Array, dtype: string, tensor: string): Uint16Array {
  const v = toF32(bytes, dtype, `tensor ${tensor}`);
  const bits = f32ToBf16(v);
  for (let i = 0; i < v.length; i++) {
    if (bf16BitsToF32(bits[i]!) !== v[i]! && !Number.isNaN(v[i]!))
      throw new ConvertError(
        `tensor ${tensor}: ${dtype} value ${v[i]} (index ${i}) has no exact bf16 form, and cherenkov's q4 keeps MLX scales and biases in bf16: ` +
          "converting would round them. Quantize the checkpoint with bf16 scales (mlx-lm does by default) or convert the unquantized checkpoint.",
        tensor,
      );
  }
  return bits;
}
