// Fuzz suite (issue 13 item 7): seeded corruptions of every model file and config/index field
// (flipped bits, truncation, zeroed ranges, appended bytes, hostile numbers in a re-sealed
// cherenkov.json, hostile tokenizer ids and chat templates, files replaced by /dev/zero, a
// directory, a FIFO or nothing), each run through `cherenkov inspect --verify`, the reference
// backend and the CPU engine in a child process. Every case must end, within a time limit,
// in a clean error naming what is wrong or in a result identical to the clean model's:
// never a crash, a hang, an unnamed error or a silently different result.
// CHERENKOV_FUZZ_CASES (default 40) and CHERENKOV_FUZZ_SEED (default 13) widen a manual run.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import type { Baseline, Outcome } from "./runner.ts";

const CASES = Number(process.env.CHERENKOV_FUZZ_CASES ?? 40);
const SEED = Number(process.env.CHERENKOV_FUZZ_SEED ?? 13);
/** A case that prints no end line within this time is a hang. */
const CASE_LIMIT_MS = 60_000;

const work = mkdtempSync(join(tmpdir(), "cherenkov-fuzz-"));
const base = join(work, "base");

beforeAll(async () => {
  await synthesize({ preset: "tiny", seed: 21, out: base, weights: "q4" });
  const m = await Model.load(base, { backend: "reference" });
  const prompt = [1, 40, 7, 300, 12];
  const g = await m.generate(prompt, { maxTokens: 4, stopAtEos: false });
  const baseline: Baseline = { prompt, tokens: g.tokens, chat: m.encode([{ role: "user", content: "hi" }]) };
  await m.close();
  writeFileSync(join(work, "baseline.json"), JSON.stringify(baseline));
});
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface PathResult {
  outcome: Outcome;
  message: string;
}
interface CaseResult {
  index: number;
  what: string;
  /** null when the case crashed or hung. */
  paths: { inspect: PathResult; reference: PathResult; cpu: PathResult } | null;
  fate?: "crash" | "hang";
  detail?: string;
}

/** Runs cases [from, CASES) in one child; returns the results and where it stopped. */
async function runChild(from: number): Promise<{ results: CaseResult[]; next: number }> {
  const child = Bun.spawn(["bun", join(import.meta.dir, "runner.ts"), base, String(SEED), String(from), String(CASES - from), work], {
    stdout: "pipe",
    stderr: "pipe",
  });
  const results: CaseResult[] = [];
  let current: { index: number; what: string } | null = null;
  let timer: ReturnType<typeof setTimeout> | null = null;
  let hung = false;
  const arm = () => {
    if (timer) clearTimeout(timer);
    timer = setTimeout(() => {
      hung = true;
      child.kill(9);
    }, CASE_LIMIT_MS);
  };
  arm();
  let buffer = "";
  for await (const chunk of child.stdout) {
    buffer += new TextDecoder().decode(chunk);
    let nl: number;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      if (!line.startsWith("{")) continue;
      const msg = JSON.parse(line);
      if ("start" in msg) {
        current = { index: msg.start, what: msg.what };
        arm();
      } else if ("end" in msg) {
        results.push({ index: msg.end, what: msg.what, paths: { inspect: msg.inspect, reference: msg.reference, cpu: msg.cpu } });
        current = null;
      }
    }
  }
  const code = await child.exited;
  if (timer) clearTimeout(timer);
  if (current) {
    const stderr = await new Response(child.stderr).text();
    results.push({ index: current.index, what: current.what, paths: null, fate: hung ? "hang" : "crash", detail: `exit ${code}: ${stderr.slice(-400)}` });
    return { results, next: current.index + 1 };
  }
  return { results, next: CASES };
}

test(`fuzz: ${CASES} corrupted model directories (seed ${SEED}) end in a clean error or an unchanged result`, async () => {
  const all: CaseResult[] = [];
  for (let from = 0; from < CASES; ) {
    const r = await runChild(from);
    all.push(...r.results);
    from = r.next;
  }
  const counts: Record<string, Record<string, number>> = { inspect: {}, reference: {}, cpu: {}, case: {} };
  const bad: string[] = [];
  for (const c of all) {
    if (!c.paths) {
      counts.case![c.fate!] = (counts.case![c.fate!] ?? 0) + 1;
      bad.push(`case ${c.index} (${c.what}): ${c.fate} ${c.detail}`);
      continue;
    }
    counts.case!.finished = (counts.case!.finished ?? 0) + 1;
    for (const [path, r] of Object.entries(c.paths)) {
      counts[path]![r.outcome] = (counts[path]![r.outcome] ?? 0) + 1;
      if (r.outcome === "different" || r.outcome === "unclean") bad.push(`case ${c.index} (${c.what}): ${path} ${r.outcome}: ${r.message}`);
    }
  }
  console.log(`fuzz seed ${SEED}, ${all.length} cases: ${JSON.stringify(counts)}`);
  if (process.env.CHERENKOV_FUZZ_VERBOSE) for (const c of all) console.log(JSON.stringify(c));
  expect(bad).toEqual([]);
  expect(all.length).toBe(CASES);
}, 600_000);
