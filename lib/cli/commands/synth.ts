// `cherenkov synth`: writes a seeded synthetic model directory.
import { presetNames } from "../../convert/presets.ts";
import { synthesize } from "../../convert/synth.ts";
import { choiceFlag, intFlag, parseFlags, requiredString, UsageError, type FlagSpec } from "../args.ts";
import { progressSink, type CliIO } from "../io.ts";
import { formatBytes, ProgressBar } from "../progress.ts";

/** synth's options (each shown with a description by `cherenkov help synth`). */
export const SYNTH_FLAGS: FlagSpec = {
  preset: { type: "string" },
  seed: { type: "string" },
  out: { type: "string" },
  dtype: { type: "string" },
  kv: { type: "string" },
  "no-hc": { type: "boolean" },
  "no-qsa": { type: "boolean" },
  "no-ple": { type: "boolean" },
  "no-mtp": { type: "boolean" },
  progress: { type: "boolean" },
  force: { type: "boolean" },
};

export async function synthCommand(argv: string[], io: CliIO): Promise<number> {
  const { flags } = parseFlags(
    argv,
    SYNTH_FLAGS,
    0,
  );
  if (flags.preset === undefined) throw new UsageError(`--preset is required (${presetNames.join(", ")})`);
  const preset = choiceFlag(flags, "preset", presetNames, presetNames[0]!);
  const out = requiredString(flags, "out");
  const seed = intFlag(flags, "seed", 0, 0, 0xffffffff);
  const weights = choiceFlag(flags, "dtype", ["q4", "bf16", "f32"] as const, "q4");
  const kvCache = choiceFlag(flags, "kv", ["q8", "f32"] as const, "q8");
  const features = {
    hc: !flags["no-hc"],
    qsa: !flags["no-qsa"],
    ple: !flags["no-ple"],
    mtp: !flags["no-mtp"],
    kvCache,
  };
  const bar = new ProgressBar("synth", progressSink(io, flags.progress === true));
  const r = await synthesize({ preset, features, seed, out, weights, force: flags.force === true, onProgress: (d, t) => bar.update(d, t) });
  bar.finish();
  const rate = r.seconds > 0 ? r.bytes / r.seconds : 0;
  io.stdout(`wrote ${out}: preset ${preset}, seed ${seed}, ${weights}, ${formatBytes(r.bytes)} in ${r.seconds.toFixed(2)} s (${formatBytes(rate)}/s)\n`);
  return 0;
}
