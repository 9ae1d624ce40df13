// The cherenkov command, run in-process (main with captured output) and, for the exit code
// and entry point, once as a real process.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { closeSync, cpSync, mkdtempSync, openSync, readFileSync, rmSync, writeSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { main } from "../../lib/cli/main.ts";
import { presetConfig } from "../../lib/convert/presets.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { denseTensorSpecs } from "../../lib/model/tensors.ts";
import { openModel } from "../../lib/model/format.ts";
import { generateGreedy } from "../../lib/reference/index.ts";

const root = mkdtempSync(join(tmpdir(), "cherenkov-cli-"));
const tiny = join(root, "tiny");
const savedHome = process.env.CHERENKOV_HOME;
afterAll(() => {
  if (savedHome === undefined) delete process.env.CHERENKOV_HOME;
  else process.env.CHERENKOV_HOME = savedHome;
  rmSync(root, { recursive: true, force: true });
});

async function cli(...argv: string[]) {
  let stdout = "";
  let stderr = "";
  const code = await main(argv, { stdout: (t) => (stdout += t), stderr: (t) => (stderr += t), stderrIsTTY: false });
  return { code, stdout, stderr };
}

beforeAll(async () => {
  const r = await cli("synth", "--preset", "tiny", "--seed", "5", "--out", tiny);
  expect(r.code).toBe(0);
});

describe("help", () => {
  test("lists the commands; help <command> shows its flags", async () => {
    const r = await cli("--help");
    expect(r.code).toBe(0);
    for (const c of ["synth", "inspect", "run"]) expect(r.stdout).toContain(`cherenkov ${c}`);
    const s = await cli("help", "synth");
    expect(s.stdout).toContain("--no-qsa");
    expect((await cli("inspect", "--help")).stdout).toContain("--verify");
  });

  test("an unknown command exits 2", async () => {
    const r = await cli("frobnicate");
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('unknown command "frobnicate"');
  });
});

describe("synth", () => {
  test("writes a model with the features asked for", async () => {
    const out = join(root, "plain");
    const r = await cli("synth", "--preset", "tiny", "--seed", "2", "--out", out, "--dtype", "bf16", "--no-hc", "--no-qsa", "--no-ple", "--no-mtp", "--kv", "f32");
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^wrote .*plain: preset tiny, seed 2, bf16, [\d.]+ [KM]B in [\d.]+ s/);
    const m = await openModel(out);
    expect(m.config).toEqual(presetConfig("tiny", { hc: false, qsa: false, ple: false, mtp: false, kvCache: "f32" }));
    expect(m.manifest.weights).toBe("bf16");
    m.close();
  });

  test("bad flags exit 2 naming the flag", async () => {
    const cases: [string[], RegExp][] = [
      [["--preset", "tiny", "--out", "x", "--bogus"], /unknown option --bogus/],
      [["--preset", "tiny", "--out", "x", "--seed"], /--seed/],
      [["--preset", "huge", "--out", "x"], /--preset: "huge" is not one of tiny, small/],
      [["--preset", "tiny"], /--out is required/],
      [["--out", "x"], /--preset is required/],
      [["--preset", "tiny", "--out", "x", "--dtype", "q8"], /--dtype: "q8"/],
      [["--preset", "tiny", "--out", "x", "--seed", "1.5"], /--seed: "1.5" is not an integer/],
      [["--preset", "tiny", "--out", "x", "extra"], /unexpected argument "extra"/],
    ];
    for (const [argv, message] of cases) {
      const r = await cli("synth", ...argv);
      expect(r.code).toBe(2);
      expect(r.stderr).toMatch(message);
    }
  });
});

describe("inspect", () => {
  test("prints the config, files, expert layout and a tensor table", async () => {
    const r = await cli("inspect", tiny);
    expect(r.code).toBe(0);
    const out = r.stdout;
    expect(out).toContain("cherenkov/2, weights q4");
    expect(out).toContain("config: qwen4-exp, vocab 320, hidden 64, 4 layers (3 deltanet, 1 attention)");
    expect(out).toMatch(/dense\.bin\s+[\d.]+ MB\s+\d+ bytes/);
    expect(out).toMatch(/experts: 5 layers x 8 records, stride 16384 bytes/);
    expect(out).toContain(`tensors (${denseTensorSpecs(presetConfig("tiny")).length}):`);
    expect(out).toMatch(/\n  embed\s+q4\s+\[320, 64\]\s+12800\s+0\n/);
    expect(out).toMatch(/\n  final_norm\s+f32\s+\[64\]\s+256\s+\d+\n/);
  });

  test("--json --verify gives the index as one JSON object", async () => {
    const r = await cli("inspect", tiny, "--json", "--verify");
    expect(r.code).toBe(0);
    const j = JSON.parse(r.stdout);
    expect(j.verified).toBe(true);
    expect(j.tensors.map((t: { name: string }) => t.name)).toEqual(denseTensorSpecs(presetConfig("tiny")).map((s) => s.name));
    expect(j.files["experts.bin"]).toBe(j.experts.layers * j.experts.per_layer * j.experts.stride);
    expect(j.config.vocab_size).toBe(320);
  });

  test("--verify on a damaged copy exits 1 naming the tensor", async () => {
    const bad = join(root, "damaged");
    cpSync(tiny, bad, { recursive: true });
    const m = JSON.parse(readFileSync(join(bad, "cherenkov.json"), "utf8"));
    const t = m.tensors.find((t: { name: string }) => t.name === "lm_head");
    const fd = openSync(join(bad, "dense.bin"), "r+");
    writeSync(fd, Uint8Array.of(0xaa, 0xbb), 0, 2, t.offset + 100);
    closeSync(fd);
    const r = await cli("inspect", bad, "--verify");
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/dense\.bin: tensor lm_head: checksum mismatch/);
  });

  test("a missing directory exits 1 naming it; no directory exits 2", async () => {
    const r = await cli("inspect", join(root, "missing"));
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`cannot open model directory ${join(root, "missing")}`);
    expect((await cli("inspect")).code).toBe(2);
  });
});

describe("run", () => {
  test("--prompt-tokens --json prints the reference's greedy tokens and their text", async () => {
    const r = await cli("run", tiny, "--prompt-tokens", "1, 2,3", "--max-tokens", "5", "--json");
    expect(r.code).toBe(0);
    const j = JSON.parse(r.stdout);
    const model = await openModel(tiny);
    const expected = generateGreedy(model, [1, 2, 3], { maxTokens: 5, stopAtEos: true }).tokens;
    model.close();
    expect(j.tokens).toEqual(expected);
    expect(j.tokens.length).toBeGreaterThan(0);
    expect(j.text).toBe((await loadTokenizer(tiny)).decode(expected));
  });

  test("--prompt text and --chat tokenize through the tokenizer and template", async () => {
    const plain = await cli("run", tiny, "--prompt", "Hello", "--max-tokens", "3", "--json");
    const chat = await cli("run", tiny, "--prompt", "Hello", "--chat", "--max-tokens", "3", "--json");
    expect(plain.code).toBe(0);
    expect(chat.code).toBe(0);
    const model = await openModel(tiny);
    const tok = await loadTokenizer(tiny);
    const chatPrompt = tok.encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n", { addSpecialTokens: false });
    expect(JSON.parse(plain.stdout).tokens).toEqual(generateGreedy(model, tok.encode("Hello"), { maxTokens: 3, stopAtEos: true }).tokens);
    expect(JSON.parse(chat.stdout).tokens).toEqual(generateGreedy(model, chatPrompt, { maxTokens: 3, stopAtEos: true }).tokens);
    model.close();
    const text = await cli("run", tiny, "--prompt", "Hello", "--max-tokens", "3");
    expect(text.stdout).toBe(JSON.parse(plain.stdout).text + "\n");
  });

  test("without DIR it uses the embedded default model", async () => {
    process.env.CHERENKOV_HOME = join(root, "home");
    const r = await cli("run", "--prompt-tokens", "10,20", "--max-tokens", "2", "--json");
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout).tokens.length).toBeGreaterThan(0);
    // the shipped model's vocabulary (4096), not a synthetic one (320)
    const big = await cli("run", "--prompt-tokens", "4000", "--max-tokens", "1", "--json");
    expect(big.code).toBe(0);
  });

  test("bad input exits 2 with a clear message", async () => {
    const cases: [string[], RegExp][] = [
      [["--prompt-tokens", "1,320"], /--prompt-tokens: token 320 is outside the vocabulary \(vocab_size 320 in .*cherenkov\.json\)/],
      [["--prompt-tokens", "1,x"], /--prompt-tokens: "x" is not a token id/],
      [["--prompt-tokens", ""], /--prompt-tokens: no token ids given/],
      [["--prompt", "a", "--prompt-tokens", "1"], /give one of --prompt TEXT, --file FILE or --prompt-tokens IDS/],
      [[], /give a prompt: -p TEXT, -f FILE, --prompt-tokens IDS, or text on stdin/],
      [["--prompt-tokens", "1", "--chat"], /--chat needs a text prompt/],
      [["--prompt", "a", "--backend", "bogus"], /--backend: "bogus" is not one of auto/],
      ...(process.platform === "darwin" ? [] : ([[["--prompt", "a", "--backend", "metal"], /--backend: backend "metal" is not available/]] as [string[], RegExp][])),
      [["--prompt", "a", "--max-tokens", "0"], /--max-tokens: "0" is not an integer in 1\.\./],
      [["--prompt", "a", "--max-tokens"], /--max-tokens/],
      [["--prompt", "a", "--temperature", "1"], /unknown option --temperature \(did you mean --temp\?\)/],
      [["--prompt", "a", "--temp", "hot"], /--temp: "hot" is not a number/],
      [["--prompt", "a", "--top-p", "0"], /--top-p 0 must be a number in \(0, 1\]/],
      [["--prompt", "a", "--seed=-2"], /--seed -2 must be an integer in \[0, 2\^53\)/], // -1 is llama.cpp's random seed
      [["--prompt", "a", "--stats=yaml"], /--stats: "yaml" is not json/],
    ];
    for (const [argv, message] of cases) {
      const r = await cli("run", tiny, ...argv);
      expect(r.stderr).toMatch(message);
      expect(r.code).toBe(2);
    }
  });
});

test("as a process: bun run cherenkov exits 2 on out-of-vocabulary tokens, 0 on inspect", async () => {
  const cwd = join(import.meta.dir, "..", "..");
  const bad = Bun.spawnSync(["bun", "run", "cherenkov", "run", tiny, "--prompt-tokens", "1,99999"], { cwd });
  expect(bad.exitCode).toBe(2);
  expect(bad.stderr.toString()).toContain("token 99999 is outside the vocabulary");
  const ok = Bun.spawnSync(["bun", "lib/cli/main.ts", "inspect", tiny, "--json"], { cwd });
  expect(ok.exitCode).toBe(0);
  expect(JSON.parse(ok.stdout.toString()).format).toBe("cherenkov/2");
});
