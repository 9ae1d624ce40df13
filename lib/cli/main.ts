#!/usr/bin/env bun
// The `cherenkov` command: one subcommand per file in commands/. Exit codes: 0 done,
// 1 the work failed (bad model files, IO; one line on stderr), 2 the command line was wrong.
import { ConfigError } from "../model/config.ts";
import { ModelFormatError } from "../model/errors.ts";
import packageJson from "../../package.json" with { type: "json" };
import { UsageError } from "./args.ts";
import { OutputDirError } from "../model/safe-write.ts";
import { buildCommand } from "./commands/build.ts";
import { chatCommand } from "./commands/chat.ts";
import { compareCommand } from "./commands/compare.ts";
import { convertCommand } from "./commands/convert.ts";
import { doctorCommand } from "./commands/doctor.ts";
import { helpText, usage } from "./commands/help.ts";
import { inspectCommand } from "./commands/inspect.ts";
import { runCommand } from "./commands/run.ts";
import { sealCommand } from "./commands/seal.ts";
import { serveCommand } from "./commands/serve.ts";
import { synthCommand } from "./commands/synth.ts";
import { processIO, type CliIO } from "./io.ts";
import { closest } from "./suggest.ts";

const commands: Record<string, (argv: string[], io: CliIO) => Promise<number>> = {
  synth: synthCommand,
  inspect: inspectCommand,
  run: runCommand,
  convert: convertCommand,
  serve: serveCommand,
  seal: sealCommand,
  build: buildCommand,
  chat: chatCommand,
  doctor: doctorCommand,
  compare: compareCommand,
};

export async function main(argv: string[], io: CliIO = processIO()): Promise<number> {
  const [name, ...rest] = argv;
  if (name === undefined || name === "help" || name === "--help" || name === "-h") {
    if (rest[0] !== undefined && !usage[rest[0]]) {
      io.stderr(`cherenkov: no command "${rest[0]}"\n\n${helpText()}`);
      return 2;
    }
    io.stdout(helpText(rest[0]));
    return 0;
  }
  if (name === "--version" || name === "version") {
    io.stdout(`cherenkov ${packageJson.version} (bun ${Bun.version})\n`);
    return 0;
  }
  const command = commands[name];
  if (!command) {
    const guess = closest(name, Object.keys(commands));
    io.stderr(`cherenkov: unknown command "${name}"${guess ? ` (did you mean ${guess}?)` : ""}\n\n${helpText()}`);
    return 2;
  }
  if (rest.includes("--help") || rest.includes("-h")) {
    io.stdout(helpText(name));
    return 0;
  }
  try {
    return await command(rest, io);
  } catch (e) {
    if (e instanceof UsageError) {
      io.stderr(`cherenkov ${name}: ${e.message}\n(cherenkov help ${name} shows the options)\n`);
      return 2;
    }
    if (e instanceof ModelFormatError || e instanceof ConfigError || e instanceof OutputDirError) {
      io.stderr(`cherenkov ${name}: ${e.message}\n`);
      return 1;
    }
    // One line, no stack trace (--verbose shows it): the message says what went wrong.
    const message = e instanceof Error ? e.message : String(e);
    const stack = rest.includes("--verbose") && e instanceof Error && e.stack ? `\n${e.stack}` : "";
    io.stderr(`cherenkov ${name}: ${message.split("\n")[0]}${stack}\n`);
    return 1;
  }
}

if (import.meta.main) process.exitCode = await main(process.argv.slice(2));
