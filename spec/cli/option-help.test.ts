// Every option a command's parser accepts is described by `cherenkov help COMMAND`: an option
// line ("  --name ARG   what it does", flags in the left column, then two or more spaces and a
// non-empty description) names it, with its short form when it has one.
import { describe, expect, test } from "bun:test";
import type { FlagSpec } from "../../lib/cli/args.ts";
import { optionTables, usage } from "../../lib/cli/commands/help.ts";
import { main } from "../../lib/cli/main.ts";
import type { CliIO } from "../../lib/cli/io.ts";

/** `cherenkov help command`'s stdout, through main() as a user runs it. */
async function helpOf(command: string): Promise<string> {
  let out = "";
  const io: CliIO = { stdout: (s) => void (out += s), stderr: (s) => void (out += s), stderrIsTTY: false };
  const code = await main(["help", command], io);
  expect(code).toBe(0);
  return out;
}

/** Option lines of a help text: the flag column and its description. */
function optionLines(help: string): { flags: string; description: string }[] {
  return help.split("\n").flatMap((line) => {
    const m = line.match(/^\s+(-\S.*?)\s{2,}(\S.*)$/);
    return m ? [{ flags: m[1]!, description: m[2]!.trim() }] : [];
  });
}

const mentions = (flags: string, flag: string) => new RegExp(`(^|[\\s,/|])${flag.replace(/[-]/g, "\\-")}(?![\\w-])`).test(flags);

/** The options of `spec` that no option line of `help` describes, in words. */
function undescribed(help: string, spec: FlagSpec): string[] {
  const lines = optionLines(help);
  return Object.entries(spec).flatMap(([name, o]) => {
    const line = lines.find((l) => mentions(l.flags, `--${name}`));
    if (!line || line.description === "") return [`--${name}: no description`];
    if (o.short && !mentions(line.flags, `-${o.short}`)) return [`--${name}: its short form -${o.short} is not shown`];
    return [];
  });
}

describe("every CLI option has a description in `cherenkov help COMMAND`", () => {
  test("every command that has help text has an option table, and the reverse", () => {
    expect(Object.keys(optionTables).sort()).toEqual(Object.keys(usage).sort());
  });

  for (const command of Object.keys(optionTables)) {
    test(command, async () => {
      const spec = optionTables[command]!;
      expect(undescribed(await helpOf(command), spec)).toEqual([]);
    });
  }

  test("the check itself fails on an option without a description or without its short form", () => {
    const help = "cherenkov x\n    --alpha N     what alpha does\n    --beta\n    --gamma N  \n    --delta D     delta\n";
    expect(undescribed(help, { alpha: { type: "string" }, beta: { type: "boolean" }, gamma: { type: "string" }, delta: { type: "string", short: "d" }, eps: { type: "boolean" } })).toEqual([
      "--beta: no description",
      "--gamma: no description",
      "--delta: its short form -d is not shown",
      "--eps: no description",
    ]);
    // --pool is not described by a line that only names --pool-slots.
    expect(undescribed("    --pool-slots N   records\n", { pool: { type: "string" } })).toEqual(["--pool: no description"]);
  });
});
