// The model `cherenkov run` and `Model.load()` use when no directory is given: qwen4-exp-tiny,
// trained for this project on permissively licensed Python source (docs/training.md) and
// shipped in the package (13 MB at q4), so nothing is downloaded.
import { fileURLToPath } from "node:url";

export const DEFAULT_MODEL_DIR = fileURLToPath(new URL("../../examples/models/qwen4-exp-tiny", import.meta.url));

export async function defaultModelDir(): Promise<string> {
  return DEFAULT_MODEL_DIR;
}
