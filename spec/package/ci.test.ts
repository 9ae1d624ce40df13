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

test("every optional tool required under CI=true is one .ci/run installs", () => {
  const glob = new Bun.Glob("spec/**/*.test.ts");
  const required = new Set<string>();
  for (const file of glob.scanSync(ROOT)) {
    const text = readFileSync(join(ROOT, file), "utf8");
    for (const m of text.matchAll(/optionalTool\(\{([^}]*)\}/g)) {
      if (/requiredUnderCi:\s*false/.test(m[1]!)) continue;
      const tool = m[1]!.match(/tool:\s*"([^"]+)"/)?.[1];
      if (tool) required.add(tool);
    }
  }
  expect(required.size).toBeGreaterThan(0);
  const installed = [...ci.matchAll(/need\+=\(([^)]+)\)/g)].map((m) => m[1]!);
  for (const tool of required) expect({ tool, installedByCi: installed.includes(tool) }).toEqual({ tool, installedByCi: true });
});
