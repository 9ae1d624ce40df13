// The README's install section (issue 21 item 12): cherenkov is not on the registry, so the
// README installs it from a tarball, with the file name `npm pack` writes, and says what the
// postinstall that `bun pm trust` runs is: package.json's own script, word for word.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const ROOT = join(import.meta.dir, "..", "..");
const readme = readFileSync(join(ROOT, "README.md"), "utf8");
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { name: string; version: string; scripts: Record<string, string> };

test("no install from the registry: the tarball npm pack writes, then bun pm trust", () => {
  expect(readme).not.toMatch(/^\s*(bun add|npm i(nstall)?) cherenkov\b/m);
  expect(readme).toContain("not on the npm registry");
  expect(readme).toContain(`bun add ./${pkg.name}-${pkg.version}.tgz`);
  expect(readme).toContain("npm pack --ignore-scripts");
  expect(readme).toContain(`bun pm trust ${pkg.name}`);
});

test("the README names the postinstall bun pm trust runs, as package.json has it", () => {
  expect(pkg.scripts.postinstall).toBeDefined();
  expect(readme).toContain(`The postinstall is \`${pkg.scripts.postinstall}\``);
});
