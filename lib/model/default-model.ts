// The model `cherenkov run` and `Model.load()` use when no directory is given: qwen4-exp-tiny,
// trained for this project on permissively licensed Python source (docs/training.md) and
// shipped in the package (13 MB at q4), so nothing is downloaded.
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { ModelFormatError } from "./errors.ts";

export const DEFAULT_MODEL_DIR = fileURLToPath(new URL("../../examples/models/qwen4-exp-tiny", import.meta.url));

/** The default model's directory; an error saying to pass one where the package's files are absent (a bundled app). */
export async function defaultModelDir(): Promise<string> {
  if (!existsSync(DEFAULT_MODEL_DIR))
    throw new ModelFormatError(
      `no model directory was given, and the default model is not at ${DEFAULT_MODEL_DIR}: a bundled app (bun build, bun build --compile) ` +
        "carries the code, not the package's files; pass a model directory (the default one is examples/models/qwen4-exp-tiny in the cherenkov package)",
      { file: DEFAULT_MODEL_DIR },
    );
  return DEFAULT_MODEL_DIR;
}
