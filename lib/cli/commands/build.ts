// `cherenkov build`: builds the package's native library (metal-shim) in place, for an
// install whose postinstall did not run (Bun runs a dependency's scripts only once it is
// trusted: `bun pm trust cherenkov` does both). The build script runs as its own process:
// the runtime never imports build tooling.
import { join } from "node:path";

import { PACKAGE_ROOT } from "../../native-library.ts";
import { parseFlags, type FlagSpec } from "../args.ts";
import type { CliIO } from "../io.ts";

export const buildUsage = `cherenkov build [--force]
  Builds the native library the cpu and metal backends load (metal-shim/build/ inside the
  package; needs a C++ compiler). Only needed when the install did not run it: Bun runs a
  dependency's postinstall only once trusted (bun pm trust cherenkov).
    --force     recompile every file`;

/** build's options (each shown with a description by `cherenkov help build`). */
export const BUILD_FLAGS: FlagSpec = { force: { type: "boolean" } };

export async function buildCommand(argv: string[], io: CliIO): Promise<number> {
  const { flags } = parseFlags(argv, BUILD_FLAGS, 0);
  const proc = Bun.spawn([process.execPath, join(PACKAGE_ROOT, "metal-shim", "build.ts"), ...(flags.force ? ["--force"] : [])], {
    cwd: PACKAGE_ROOT,
    stdout: "pipe",
    stderr: "pipe",
  });
  const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited]);
  if (out) io.stdout(out);
  if (err) io.stderr(err);
  return code === 0 ? 0 : 1;
}
