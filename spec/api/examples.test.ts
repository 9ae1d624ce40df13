// Every example runs to completion as a user would run it (against the embedded model).
import { expect, test } from "bun:test";
import { readdirSync } from "node:fs";
import { join } from "node:path";

const root = join(import.meta.dir, "..", "..");
for (const file of readdirSync(join(root, "examples")).filter((f) => f.endsWith(".ts"))) {
  test(`examples/${file} runs`, async () => {
    const p = Bun.spawn(["bun", join("examples", file)], { cwd: root, stdout: "pipe", stderr: "pipe" });
    const [out, err, code] = await Promise.all([new Response(p.stdout).text(), new Response(p.stderr).text(), p.exited]);
    if (code !== 0) console.error(err);
    expect(code).toBe(0);
    expect(out.length).toBeGreaterThan(0);
  }, 60_000);
}
