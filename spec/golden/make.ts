// `bun run golden` writes spec/golden/*.json; `bun run golden --check` verifies that the
// reference still reproduces them (exit 1 and a diff line per case otherwise).
import { existsSync } from "node:fs";
import { basename, dirname } from "node:path";
import { writeFileAtomic } from "../../lib/model/safe-write.ts";
import { goldenCases } from "./cases.ts";
import { goldenPath, runGolden, type GoldenRecord } from "./golden.ts";

const check = process.argv.includes("--check");
let failed = 0;
for (const c of goldenCases) {
  const t0 = performance.now();
  const rec = await runGolden(c);
  const path = goldenPath(c.name);
  const ms = (performance.now() - t0).toFixed(0);
  if (check) {
    if (!existsSync(path)) {
      console.log(`${c.name}: MISSING ${path}`);
      failed++;
      continue;
    }
    const want = (await Bun.file(path).json()) as GoldenRecord;
    const same = JSON.stringify(want.tokens) === JSON.stringify(rec.tokens) && JSON.stringify(want.prompt) === JSON.stringify(rec.prompt);
    if (!same) failed++;
    console.log(`${c.name}: ${same ? "ok" : `DIFFERS\n  want ${want.tokens}\n  got  ${rec.tokens}`} (${ms} ms)`);
  } else {
    // Temp file + rename: never through a symlink, never a half-written record.
    writeFileAtomic(dirname(path), basename(path), JSON.stringify(rec, null, 1) + "\n");
    const minMargin = Math.min(...rec.margins).toFixed(4);
    console.log(`${c.name}: ${rec.tokens.length} tokens, smallest margin ${minMargin} -> ${path} (${ms} ms)`);
  }
}
if (failed) {
  console.log(`${failed} golden case(s) failed`);
  process.exit(1);
}
