// `cherenkov convert SRC_DIR OUT_DIR`: a Hugging Face or MLX Qwen3-Next / Qwen3.5-MoE
// checkpoint to a cherenkov model directory.
import { convertCheckpoint } from "../../convert/convert.ts";
import { importNative, isNativeCheckpoint } from "../../convert/native.ts";
import { ConvertError } from "../../convert/hf.ts";
import { CheckpointError } from "../../convert/safetensors.ts";
import { choiceFlag, parseFlags, UsageError, type FlagSpec } from "../args.ts";
import { processIO, progressSink, type CliIO } from "../io.ts";
import { formatBytes, ProgressBar } from "../progress.ts";

export const convertUsage = `cherenkov convert SRC_DIR OUT_DIR [options]
  Converts a Qwen3-Next or Qwen3.5-MoE checkpoint (Hugging Face safetensors in f32/bf16/f16,
  or MLX affine 4-bit) to a cherenkov model directory.
    --dtype q4|bf16|f32  weight storage (default q4; MLX 4-bit weights pass through bit-exact)
    --kv q8|f32          attention KV cache type recorded in the config (default q8)
    --no-mtp             leave out the MTP draft head even when the checkpoint has one
    --progress           draw the progress bar even when stderr is not a terminal
    --force              write into a non-empty OUT_DIR, replacing its model files`;

/** convert's options (each shown with a description by `cherenkov help convert`). */
export const CONVERT_FLAGS: FlagSpec = { dtype: { type: "string" }, kv: { type: "string" }, "no-mtp": { type: "boolean" }, progress: { type: "boolean" }, force: { type: "boolean" } };

export async function convertCommand(argv: string[], io: CliIO = processIO()): Promise<number> {
  const { flags, positionals } = parseFlags(
    argv,
    CONVERT_FLAGS,
    2,
  );
  if (positionals.length < 2) throw new UsageError("needs SRC_DIR and OUT_DIR");
  const [src, out] = positionals as [string, string];
  const weights = choiceFlag(flags, "dtype", ["q4", "bf16", "f32"] as const, "q4");
  const kvCache = choiceFlag(flags, "kv", ["q8", "f32"] as const, "q8");
  if (isNativeCheckpoint(src)) {
    // safetensors with cherenkov's own tensor names (spec/train exports qwen4-exp this way)
    await importNative(src, out, { weights, force: flags.force === true, log: (l) => io.stderr(l + "\n") });
    io.stdout(`wrote ${out}: native qwen4-exp, ${weights}\n`);
    return 0;
  }
  const bar = new ProgressBar("convert", progressSink(io, flags.progress === true));
  try {
    const r = await convertCheckpoint({
      src,
      out,
      weights,
      kvCache,
      mtp: !flags["no-mtp"],
      force: flags.force === true,
      onProgress: (d, t) => bar.update(d, t),
      log: (line) => io.stderr(`${line}\n`),
    });
    bar.finish();
    const rate = r.seconds > 0 ? r.sourceBytes / r.seconds : 0;
    io.stdout(
      `wrote ${out}: ${r.format === "mlx" ? "MLX" : "HF"} ${r.architecture}, ${weights}, ${formatBytes(r.bytes)} ` +
        `from ${formatBytes(r.sourceBytes)} in ${r.seconds.toFixed(2)} s (${formatBytes(rate)}/s of checkpoint)\n`,
    );
    return 0;
  } catch (e) {
    bar.finish();
    if (e instanceof ConvertError || e instanceof CheckpointError) {
      io.stderr(`cherenkov convert: ${e.message}\n`);
      return 1;
    }
    throw e;
  }
}
