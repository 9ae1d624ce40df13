// `bun test` (any file) first brings the native library up to date in this checkout, as
// `bun run test`'s pretest does: tests run against the sources they sit next to. This is
// test tooling; the library itself never builds at runtime (lib/native-library.ts).
import { buildNative } from "../metal-shim/build.ts";

const lines = await buildNative();
if (lines.length) console.error(lines.join("\n"));
