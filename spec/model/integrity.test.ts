// Hostile or changing model directories (issue 13, items 1-3): a sealed index, bounded config
// numbers, size-capped regular JSON files, validated tokenizer ids, reported tokenizer errors,
// bounded chat templates, writers that never write through symlinks or truncate in place, and
// a loaded model that holds its files.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Model } from "../../lib/api/model.ts";
import { synthesize } from "../../lib/convert/synth.ts";
import { CONFIG_LIMITS, parseConfig } from "../../lib/model/config.ts";
import { ChecksumMismatchError, ModelFormatError } from "../../lib/model/errors.ts";
import { openModel } from "../../lib/model/format.ts";
import { sealManifest } from "../../lib/model/manifest.ts";
import { OutputDirError } from "../../lib/model/safe-write.ts";
import { loadTokenizer } from "../../lib/model/tokenizer.ts";
import { main } from "../../lib/cli/main.ts";
import { generateGreedy } from "../../lib/reference/generate.ts";
import { resealFiles } from "../fuzz/cases.ts";

const root = mkdtempSync(join(tmpdir(), "cherenkov-integrity-"));
const good = join(root, "good");
let copies = 0;
beforeAll(() => synthesize({ preset: "tiny", seed: 3, out: good, weights: "q4" }));
afterAll(() => rmSync(root, { recursive: true, force: true }));

function copy(): string {
  const dir = join(root, `copy${copies++}`);
  cpSync(good, dir, { recursive: true });
  return dir;
}
const readJson = (p: string) => JSON.parse(readFileSync(p, "utf8"));
const editManifest = (dir: string, edit: (m: any) => void, seal = true) => {
  const m = readJson(join(dir, "cherenkov.json"));
  edit(m);
  writeFileSync(join(dir, "cherenkov.json"), JSON.stringify(seal ? sealManifest(m) : m));
};
/** Runs `f` under a deadline: a hang fails the test instead of stalling the suite. */
async function within<T>(ms: number, f: () => Promise<T>): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`did not finish within ${ms} ms`)), ms)));
  try {
    return await Promise.race([f(), deadline]);
  } finally {
    clearTimeout(timer);
  }
}
async function errorOf(f: () => Promise<unknown>): Promise<Error> {
  try {
    await f();
  } catch (e) {
    return e as Error;
  }
  throw new Error("expected an error");
}

describe("cherenkov.json is sealed (manifest checksum)", () => {
  test("a changed value without a new seal is refused before it is used", async () => {
    const dir = copy();
    editManifest(dir, (m) => (m.config.hc.sinkhorn_iters = 7), false);
    const e = await errorOf(() => openModel(dir));
    expect(e).toBeInstanceOf(ModelFormatError);
    expect(e.message).toMatch(/^cherenkov\.json: manifest checksum mismatch/);
  });

  test("a cherenkov/1 index (no seal) still loads; an unknown format is named", async () => {
    const dir = copy();
    editManifest(dir, (m) => {
      m.format = "cherenkov/1";
      delete m.manifest_checksum;
    }, false);
    (await openModel(dir, { verify: true })).close();
    editManifest(dir, (m) => (m.format = "cherenkov/9"), false);
    expect((await errorOf(() => openModel(dir))).message).toContain('format "cherenkov/9" is not supported');
  });

  test("a cherenkov/1 directory loads with a warning naming what is unverified; inspect --verify does not say all match; seal upgrades it", async () => {
    const dir = copy();
    editManifest(dir, (m) => {
      m.format = "cherenkov/1";
      delete m.manifest_checksum;
      delete m.files;
    }, false);
    const warnings: string[] = [];
    const model = await Model.load(dir, { backend: "reference", onWarning: (w) => void warnings.push(w) });
    await model.close();
    expect(warnings.length).toBe(1);
    for (const f of ["cherenkov.json (format cherenkov/1", "tokenizer.json (no checksum recorded", "tokenizer_config.json (no checksum recorded"]) expect(warnings[0]).toContain(f);
    expect(warnings[0]).toContain(`cherenkov seal ${dir}`);
    const out: string[] = [];
    const io = { stdout: (t: string) => void out.push(t), stderr: (t: string) => void out.push(t), stderrIsTTY: false };
    expect(await main(["inspect", dir, "--verify"], io)).toBe(0);
    expect(out.join("")).not.toContain("all match");
    expect(out.join("")).toContain("NOT verified (no checksum): cherenkov.json");
    out.length = 0;
    expect(await main(["inspect", dir, "--verify", "--json"], io)).toBe(0);
    expect(JSON.parse(out.join("")).verified).toBe(false);
    // sealed, nothing is left unverified and a changed template byte is named
    expect(await main(["seal", dir], io)).toBe(0);
    warnings.length = 0;
    await (await Model.load(dir, { backend: "reference", onWarning: (w) => void warnings.push(w) })).close();
    expect(warnings).toEqual([]);
    out.length = 0;
    expect(await main(["inspect", dir, "--verify"], io)).toBe(0);
    expect(out.join("")).toContain("checksums: all match");
    const cfgPath = join(dir, "tokenizer_config.json");
    writeFileSync(cfgPath, readFileSync(cfgPath, "utf8").replace("im_start", "im_starT"));
    out.length = 0;
    expect(await main(["inspect", dir, "--verify"], io)).toBe(1);
    expect(out.join("")).toContain("tokenizer_config.json: the file: checksum mismatch");
  });

  test("overlapping or out-of-order expert parts, and aliasing tensors, are refused", async () => {
    const a = copy();
    editManifest(a, (m) => (m.experts.parts[1].offset = m.experts.parts[0].offset));
    expect((await errorOf(() => openModel(a))).message).toMatch(/expert part up at \d+ overlaps or precedes gate/);
    const b = copy();
    editManifest(b, (m) => {
      const [g, u] = m.experts.parts;
      [g.offset, u.offset] = [u.offset, g.offset];
    });
    expect((await errorOf(() => openModel(b))).message).toMatch(/overlaps or precedes/);
    const c = copy();
    editManifest(c, (m) => (m.tensors[3].offset = m.tensors[2].offset));
    expect((await errorOf(() => openModel(c))).message).toMatch(/tensor .* overlaps/);
  });
});

describe("unreadable files (issue 22, item 10)", () => {
  /** openModel(dir)'s error message in a process without root's right to read any file. */
  // The unprivileged process runs openModel from a bundle in `root`: the checkout itself may sit
  // in a directory only its owner can enter (a clone in `mktemp -d`, mode 0700).
  let bundle: string | null = null;
  function openerBundle(): string {
    if (bundle) return bundle;
    const entry = join(root, "open-model.ts");
    const format = join(import.meta.dir, "../../lib/model/format.ts");
    writeFileSync(entry, `import { openModel } from ${JSON.stringify(format)};\ntry { (await openModel(process.argv[2]!)).close(); console.log("opened"); } catch (e) { console.log((e as Error).message); }\n`);
    const out = join(root, "open-model.js");
    const r = Bun.spawnSync([process.execPath, "build", entry, "--target=bun", "--outfile", out]);
    if (r.exitCode !== 0) throw new Error(`bun build of the opener failed: ${r.stderr.toString()}`);
    chmodSync(out, 0o644);
    return (bundle = out);
  }

  function openUnprivileged(dir: string): string {
    const asNobody = process.getuid?.() === 0 ? ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] : [];
    const r = Bun.spawnSync([...asNobody, process.execPath, openerBundle(), dir], { cwd: tmpdir(), env: { ...process.env, HOME: tmpdir() } });
    return r.stdout.toString().trim() || r.stderr.toString();
  }

  test("a file with mode 000 is reported as unreadable, not as missing", () => {
    const dir = copy();
    chmodSync(root, 0o755);
    chmodSync(dir, 0o755);
    for (const f of readdirSync(dir)) chmodSync(join(dir, f), 0o644);
    expect(openUnprivileged(dir)).toBe("opened");
    chmodSync(join(dir, "experts.bin"), 0o000);
    const message = openUnprivileged(dir);
    expect(message).toContain(`experts.bin in ${dir} exists but cannot be read (EACCES: permission denied`);
    expect(message).not.toContain("missing");
    rmSync(join(dir, "experts.bin"));
    expect(openUnprivileged(dir)).toContain("experts.bin is missing in");
  });
});

describe("every numeric config field has an upper bound", () => {
  const base = () => readJson(join(good, "cherenkov.json")).config;
  test("sinkhorn_iters = 1e9 and max_drafts = 2^31 are refused by name, at once", async () => {
    for (const [path, value, field] of [
      [["hc", "sinkhorn_iters"], 1e9, "config.hc.sinkhorn_iters"],
      [["mtp", "max_drafts"], 2 ** 31, "config.mtp.max_drafts"],
      [["vocab_size"], 2 ** 31, "config.vocab_size"],
      [["moe", "experts"], 1e7, "config.moe.experts"],
      [["attention", "rope_theta"], 1e300, "config.attention.rope_theta"],
    ] as const) {
      const c = base();
      let o = c;
      for (const k of path.slice(0, -1)) o = o[k];
      o[path[path.length - 1]!] = value;
      expect(() => parseConfig(c)).toThrow(field);
      const dir = copy();
      editManifest(dir, (m) => (m.config = c));
      const e = await within(5000, () => errorOf(() => openModel(dir)));
      expect(e.message).toContain(field);
    }
    expect(CONFIG_LIMITS.sinkhorn_iters).toBeLessThan(1000);
  });
});

describe("JSON files: regular files under a size cap", () => {
  test("cherenkov.json symlinked to /dev/zero is refused without reading it", async () => {
    const dir = copy();
    rmSync(join(dir, "cherenkov.json"));
    symlinkSync("/dev/zero", join(dir, "cherenkov.json"));
    const e = await within(5000, () => errorOf(() => openModel(dir)));
    expect(e.message).toMatch(/^cherenkov\.json: .* is not a regular file/);
  });

  test("tokenizer.json as a FIFO is refused without blocking; an oversize one is refused by its size", async () => {
    const dir = copy();
    rmSync(join(dir, "tokenizer.json"));
    Bun.spawnSync(["mkfifo", join(dir, "tokenizer.json")]);
    const e = await within(5000, () => errorOf(() => loadTokenizer(dir)));
    expect(e.message).toMatch(/^tokenizer\.json: .* is not a regular file/);
    rmSync(join(dir, "tokenizer.json"));
    writeFileSync(join(dir, "tokenizer.json"), "");
    truncateSync(join(dir, "tokenizer.json"), 200 << 20); // sparse: no disk used
    expect((await errorOf(() => loadTokenizer(dir))).message).toMatch(/^tokenizer\.json: 209715200 bytes, more than the \d+-byte limit/);
  });

  test("a binary file that is not a regular file is named", async () => {
    const dir = copy();
    rmSync(join(dir, "experts.bin"));
    symlinkSync("/dev/zero", join(dir, "experts.bin"));
    expect((await errorOf(() => openModel(dir))).message).toMatch(/^experts\.bin: .* is not a regular file/);
  });
});

describe("tokenizer", () => {
  test("a vocab id of 2^31 is refused before the tokenizer library sees it (it would spin)", async () => {
    for (const edit of [
      (t: any) => (t.model.vocab[Object.keys(t.model.vocab)[5]!] = 2 ** 31),
      (t: any) => (t.added_tokens[0].id = 2 ** 31),
      (t: any) => (t.added_tokens[0].id = -1),
      (t: any) => (t.added_tokens[0].id = 1.5),
    ]) {
      const dir = copy();
      const t = readJson(join(dir, "tokenizer.json"));
      edit(t);
      writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(t));
      resealFiles(dir);
      const e = await within(5000, () => errorOf(() => loadTokenizer(dir)));
      expect(e.message).toMatch(/^tokenizer\.json: (model\.vocab|added_tokens).*: id .* is not an integer in 0\.\./);
    }
  });

  test("Model.load reports a broken tokenizer instead of running without one", async () => {
    const dir = copy();
    writeFileSync(join(dir, "tokenizer.json"), "{ not json");
    // Its checksum in cherenkov.json names the change first; re-recorded, the JSON error shows.
    expect((await errorOf(() => Model.load(dir, { backend: "reference" }))).message).toMatch(/^tokenizer\.json: checksum mismatch/);
    resealFiles(dir);
    const e = await errorOf(() => Model.load(dir, { backend: "reference" }));
    expect(e.message).toMatch(/^tokenizer\.json: not valid JSON/);
    const t = copy();
    const cfg = readJson(join(t, "tokenizer_config.json"));
    cfg.chat_template = "{% for x in %}";
    writeFileSync(join(t, "tokenizer_config.json"), JSON.stringify(cfg));
    resealFiles(t);
    expect((await errorOf(() => Model.load(t, { backend: "reference" }))).message).toMatch(/^tokenizer_config\.json: chat_template does not parse/);
    // No tokenizer.json at all is allowed: token ids only.
    const n = copy();
    rmSync(join(n, "tokenizer.json"));
    const m = await Model.load(n, { backend: "reference" });
    expect(m.tokenizer).toBeNull();
    await m.close();
  });

  test("an edited chat template is named by its checksum until `cherenkov seal` records it; seal refuses a damaged index", async () => {
    const dir = copy();
    const cfg = readJson(join(dir, "tokenizer_config.json"));
    cfg.chat_template = "{% for m in messages %}<{{ m.content }}>{% endfor %}";
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(cfg));
    expect((await errorOf(() => loadTokenizer(dir))).message).toMatch(/^tokenizer_config\.json: checksum mismatch/);
    const out: string[] = [];
    const io = { stdout: (t: string) => void out.push(t), stderr: (t: string) => void out.push(t), stderrIsTTY: false };
    expect(await main(["seal", dir], io)).toBe(0);
    expect((await loadTokenizer(dir)).applyChatTemplate([{ role: "user", content: "hi" }])).toBe("<hi>");
    (await openModel(dir, { verify: true })).close();
    // A changed config value is not sealable: the index's own seal is checked first.
    const m = readJson(join(dir, "cherenkov.json"));
    m.config.rms_norm_eps = 1e-5;
    writeFileSync(join(dir, "cherenkov.json"), JSON.stringify(m));
    expect(await main(["seal", dir], io)).toBe(1);
    expect(out.join("")).toContain("manifest checksum mismatch");
  });

  test("a chat template with a huge loop stops at the limits, and the event loop keeps running", async () => {
    const dir = copy();
    const cfg = readJson(join(dir, "tokenizer_config.json"));
    const msgs = [{ role: "user", content: "hi" }];
    for (const [template, why] of [
      ["{% for i in range(1000000000) %}x{% endfor %}", /range\(\) of 1000000000 items exceeds the limit/],
      ["{% for i in range(60000) %}{% for j in range(60000) %}xxxxxxxx{% endfor %}{% endfor %}", /took longer than \d+ ms/],
    ] as const) {
      cfg.chat_template = template;
      writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(cfg));
      resealFiles(dir);
      const tok = await loadTokenizer(dir);
      let ticks = 0;
      const tick = setInterval(() => ticks++, 20);
      const e = await errorOf(() => tok.applyChatTemplateAsync(msgs));
      clearInterval(tick);
      expect(e.message).toMatch(why);
      // Stopped by the time limit, a timer of this thread: the 20 ms interval, due earlier, fired
      // first, which it could not while this thread rendered (a /health request would be served).
      if (why.source.startsWith("took longer")) expect(ticks).toBeGreaterThan(0);
      expect(() => tok.applyChatTemplate(msgs)).toThrow(why);
    }
    // After a stopped render the worker is replaced: a normal template works again.
    cfg.chat_template = "{% for m in messages %}[{{ m.content }}]{% endfor %}";
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(cfg));
    resealFiles(dir);
    const tok = await loadTokenizer(dir);
    expect(await tok.applyChatTemplateAsync(msgs)).toBe("[hi]");
    expect(tok.applyChatTemplate(msgs)).toBe("[hi]");
  }, 30000);
});

describe("writers and files under a loaded model", () => {
  test("synth refuses a non-empty output directory without force", async () => {
    const dir = join(root, "nonempty");
    mkdirSync(dir);
    writeFileSync(join(dir, "notes.txt"), "keep me");
    const e = await errorOf(() => synthesize({ preset: "tiny", seed: 1, out: dir, weights: "q4" }));
    expect(e).toBeInstanceOf(OutputDirError);
    expect(e.message).toContain("is not empty");
    await synthesize({ preset: "tiny", seed: 1, out: dir, weights: "q4", force: true });
    expect(readFileSync(join(dir, "notes.txt"), "utf8")).toBe("keep me");
    (await openModel(dir, { verify: true })).close();
  });

  test("a symlink in the output directory is replaced, never written through", async () => {
    const dir = join(root, "symlinked");
    mkdirSync(dir);
    const victim = join(root, "victim.txt");
    writeFileSync(victim, "outside the model directory");
    for (const f of ["dense.bin", "experts.bin", "ple.bin", "cherenkov.json", "tokenizer.json", "tokenizer_config.json"]) symlinkSync(victim, join(dir, f));
    await synthesize({ preset: "tiny", seed: 1, out: dir, weights: "q4", force: true });
    expect(readFileSync(victim, "utf8")).toBe("outside the model directory");
    (await openModel(dir, { verify: true })).close();
  });

  test("rewriting a loaded model's directory is invisible to it (it holds the old files)", async () => {
    const dir = join(root, "served");
    await synthesize({ preset: "tiny", seed: 11, out: dir, weights: "q4" });
    const model = await openModel(dir);
    const before = generateGreedy(model, [1, 2, 3], { maxTokens: 6 }).tokens;
    const fresh = await openModel(dir);
    await synthesize({ preset: "tiny", seed: 12, out: dir, weights: "q4", force: true });
    // `model` decoded some tensors already; `fresh` decodes everything after the rewrite.
    expect(generateGreedy(fresh, [1, 2, 3], { maxTokens: 6 }).tokens).toEqual(before);
    expect(generateGreedy(model, [1, 2, 3], { maxTokens: 6 }).tokens).toEqual(before);
    await fresh.verify();
    model.close();
    fresh.close();
    expect(existsSync(join(dir, "cherenkov.json"))).toBe(true);
    expect(readJson(join(dir, "cherenkov.json")).writer.source.synth.seed).toBe(12);
  });

  test("a file truncated in place under a loaded model gives a clean error, not SIGBUS", async () => {
    const dir = copy();
    const model = await openModel(dir);
    truncateSync(join(dir, "dense.bin"), 0);
    truncateSync(join(dir, "experts.bin"), 0);
    truncateSync(join(dir, "ple.bin"), 0);
    expect(() => model.get("embed")).toThrow(/^dense\.bin: short read of tensor embed .* truncated after it was opened/);
    expect(() => model.readExpertRecord(1, 2)).toThrow(/^experts\.bin: short read of record layer 1 expert 2/);
    expect(() => model.pleTable(model.config.ple!.layers[0]!, 0, 0)).toThrow(/^ple\.bin: short read of table/);
    model.close();
  });

  test("a corrupted expert record read by the reference fails naming file, layer and expert; others still load", async () => {
    const dir = copy();
    const m = readJson(join(dir, "cherenkov.json"));
    const { stride, per_layer } = m.experts;
    const bytes = readFileSync(join(dir, "experts.bin"));
    bytes[(2 * per_layer + 5) * stride + 100] ^= 0x40;
    writeFileSync(join(dir, "experts.bin"), bytes);
    const model = await openModel(dir);
    const e = (() => {
      try {
        model.expert(2, 5);
      } catch (err) {
        return err as ChecksumMismatchError;
      }
      throw new Error("expected a checksum error");
    })();
    expect(e).toBeInstanceOf(ChecksumMismatchError);
    expect(e.message).toMatch(/^experts\.bin: record layer 2 expert 5: checksum mismatch/);
    expect([e.file, e.layer, e.expert]).toEqual(["experts.bin", 2, 5]);
    expect(model.expert(2, 4).gate.length).toBeGreaterThan(0);
    model.close();
  });
});
