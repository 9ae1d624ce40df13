// system_fingerprint: what OpenAI's field promises, a value that changes when the serving
// configuration changes (so a client can tell why the same request answers differently).
import { createHash } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import pkg from "../../package.json";
import type { Model } from "../api/model.ts";
import { MANIFEST_FILE } from "../model/manifest.ts";

/** "fp_" + 12 hex digits of a hash over cherenkov's version, the backend and the model's manifest. */
export function systemFingerprint(model: Model, extra: Record<string, unknown> = {}): string {
  const h = createHash("sha256");
  h.update(`cherenkov ${pkg.version}\n${model.backendName}\n${JSON.stringify(extra)}\n`);
  // The manifest names every tensor with its checksum: new weights, new fingerprint. It was
  // read (and bounded) when the model loaded; the config stands in if it is gone since.
  const path = join(model.dir, MANIFEST_FILE);
  try {
    const st = statSync(path);
    h.update(st.isFile() && st.size <= 64 << 20 ? readFileSync(path) : JSON.stringify(model.config));
  } catch {
    h.update(JSON.stringify(model.config));
  }
  return `fp_${h.digest("hex").slice(0, 12)}`;
}
