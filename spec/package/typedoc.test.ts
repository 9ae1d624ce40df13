// The API docs build without a warning (issue 11 item 7): typedoc with
// treatWarningsAsErrors (tsconfig.json), so a public type that references an unexported
// one, or a broken {@link}, fails here.
import { expect, test } from "bun:test";
import { join } from "node:path";

const ROOT = join(import.meta.dir, "..", "..");

test("typedoc builds the API docs with no warnings", () => {
  const proc = Bun.spawnSync([process.execPath, join(ROOT, "node_modules", "typedoc", "bin", "typedoc"), "--emit", "none"], {
    cwd: ROOT,
    stdout: "pipe",
    stderr: "pipe",
  });
  const output = (proc.stdout.toString() + proc.stderr.toString()).replace(/\x1b\[[0-9;]*m/g, "");
  expect(output).not.toContain("[warning]");
  expect(output).not.toContain("[error]");
  expect(proc.exitCode).toBe(0);
}, 300_000);
