// The API docs build without a warning (issue 11 item 7): typedoc with
// treatWarningsAsErrors (tsconfig.json), so a public type that references an unexported
// one, or a broken {@link}, fails here.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
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

// Finding the API docs (issue 21 item 8): the README says how to build them, and the class a
// user starts from has a summary there.
test("the README says how to build the API reference, and Model has a summary", () => {
  const readme = readFileSync(join(ROOT, "README.md"), "utf8");
  expect(readme).toContain("bun run docs");
  expect(readme).toContain("docs/api/index.html");
  const src = readFileSync(join(ROOT, "lib", "api", "model.ts"), "utf8");
  expect(src).toMatch(/\/\*\*\n(?: \*[^\n]*\n)+ \*\/\nexport class Model \{/);
});
