// CI runs exactly the README's test command (issue 11): .ci/run names it once, and the
// README shows the same command after installing the same bun.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const ROOT = join(import.meta.dir, "..", "..");
const ci = readFileSync(join(ROOT, ".ci", "run"), "utf8");
const readme = readFileSync(join(ROOT, "README.md"), "utf8");

function shellVar(name: string): string {
  const m = ci.match(new RegExp(`^${name}="?([^"\\n]+)"?$`, "m"));
  if (!m) throw new Error(`.ci/run: no ${name}= line`);
  return m[1]!;
}

test(".ci/run runs the README's test command, under CI=true", () => {
  const command = shellVar("TEST_COMMAND");
  expect(readme).toContain(`npm i -g bun@${shellVar("BUN_VERSION")} && ${command}\n`);
  expect(ci).toContain('bash -c "$TEST_COMMAND"');
  expect(ci).toMatch(/^export CI=true$/m);
  // Nothing else is built or run before it: the command's own install and pretest do that.
  expect(ci).not.toMatch(/^\s*bun (run|install|test)\b/m);
});
