// The npm package as a user gets it (issue 11 item 3, issue 13 item 6): `npm pack` ships
// what the runtime, the build and the examples need and nothing else; the tarball installs
// into a fresh app (bun init's tsconfig, sampling with a seed reproducible, from bun's cache, the package's postinstall
// blocked as Bun blocks it for any untrusted dependency), generates, type-checks under
// tsc --strict, bundles with `bun build` and `bun build --compile`, and `await using` works.
// A missing native library is one line naming what to run; an undeclared
// @cherenkov/shim-* package up the directory tree is never loaded.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { localLibraryPath } from "../../lib/native-library.ts";
import { optionalTool } from "../optional-tool.ts";

const ROOT = join(import.meta.dir, "..", "..");
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8"));
const scratch = mkdtempSync(join(tmpdir(), "cherenkov-pack-"));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

function sh(cmd: string[], cwd: string, env: Record<string, string> = {}) {
  const proc = Bun.spawnSync(cmd, { cwd, env: { ...process.env, ...env }, stdout: "pipe", stderr: "pipe" });
  return { code: proc.exitCode, out: proc.stdout.toString(), err: proc.stderr.toString() };
}

// npm writes the tarball a user installs (README); the checks need it and a git checkout.
const hasNpm = optionalTool({ tool: "npm", path: Bun.which("npm"), checks: "npm pack and the installed package (spec/package/pack.test.ts)", enable: "install Node.js with npm" });
const describePack = hasNpm ? describe : describe.skip;

let tarball = "";
let files: string[] = [];
beforeAll(() => {
  if (!hasNpm) return;
  const r = sh(["npm", "pack", "--json", "--ignore-scripts", "--pack-destination", scratch], ROOT);
  if (r.code !== 0) throw new Error(`npm pack failed: ${r.err}`);
  const [info] = JSON.parse(r.out) as { filename: string; files: { path: string }[] }[];
  tarball = join(scratch, info!.filename);
  files = info!.files.map((f) => f.path).sort();
}, 120_000);

describePack("npm pack", () => {
  test("ships every tracked file the runtime, the native build and the examples need", () => {
    const ls = sh(["git", "ls-files"], ROOT);
    if (ls.code !== 0) throw new Error(`git ls-files failed (the checks need a git checkout): ${ls.err}`);
    const tracked = ls.out.split("\n").filter(Boolean);
    const needed = tracked.filter((f) =>
      /^(lib|kernels|metal-shim\/(include|cpu|common|cuda)|examples\/models\/qwen4-exp-tiny)\//.test(f) ||
      /^metal-shim\/metal\/[^/]+\.(m|h)$/.test(f) ||
      /^examples\/[^/]+\.ts$/.test(f) ||
      /^docs\/[^/]+\.md$/.test(f),
    );
    expect(needed.length).toBeGreaterThan(150);
    for (const f of ["package.json", "README.md", "LICENSE", "metal-shim/build.ts", "metal-shim/gen-bindings.ts", ...needed])
      expect({ file: f, shipped: files.includes(f) }).toEqual({ file: f, shipped: true });
  });

  test("ships no tests, CI, Linux check harness, transcribed SDK headers, build outputs or spare models", () => {
    const unwanted = files.filter((f) =>
      /^(spec|\.ci|\.dev|node_modules|docs\/api|metal-shim\/build|metal-shim\/metal\/(sdk|strict)|examples\/models\/(?!qwen4-exp-tiny))\//.test(f) ||
      f === "metal-shim/metal/check.ts" || f === "1" || /\.(o|so|dylib)$/.test(f),
    );
    expect(unwanted).toEqual([]);
    expect(files.some((f) => f.startsWith("metal-shim/metal/") && f.endsWith(".m"))).toBe(true);
  });

  test("package.json: license file, repository, homepage, keywords; no unused devDependencies", () => {
    expect(pkg.license).toBe("MIT");
    expect(readFileSync(join(ROOT, "LICENSE"), "utf8")).toStartWith("MIT License");
    expect(pkg.repository?.url).toMatch(/^git\+https:\/\//);
    expect(pkg.homepage).toMatch(/^https:\/\//);
    expect(pkg.keywords).toEqual(expect.arrayContaining(["llm", "mixture-of-experts", "metal", "bun"]));
    expect(Object.keys(pkg.devDependencies).sort()).toEqual(["@types/bun", "bun-types", "esbuild", "ollama", "openai", "typedoc", "typescript"]);
  });
});

// bun init's tsconfig.json (bun 1.4), comments dropped: strict, noUncheckedIndexedAccess, ...
const BUN_INIT_TSCONFIG = {
  compilerOptions: {
    lib: ["ESNext"], target: "ESNext", module: "Preserve", moduleDetection: "force", jsx: "react-jsx", allowJs: true,
    types: ["bun"], moduleResolution: "bundler", allowImportingTsExtensions: true, verbatimModuleSyntax: true, noEmit: true,
    strict: true, skipLibCheck: true, noFallthroughCasesInSwitch: true, noUncheckedIndexedAccess: true, noImplicitOverride: true,
    noUnusedLocals: false, noUnusedParameters: false, noPropertyAccessFromIndexSignature: false,
  },
};

const APP = `import { Model, type GenerationResult } from "cherenkov";

// A model directory as the first argument (a bundle has no package folder to find the default in).
const dir: string | undefined = process.argv[2];
const prompt = "def add(a, b):";
await using model = await Model.load(dir);
const sampled = { maxTokens: 8, temperature: 0.8, topP: 0.95, seed: 42 };
const first: GenerationResult = await model.generate(prompt, sampled);
const again = await model.generate(prompt, sampled);
{
  using chat = model.session();
  await chat.append(prompt);
  await chat.generate({ maxTokens: 2 });
}
console.log(JSON.stringify({ backend: model.backendName, tokens: first.tokens, same: again.text === first.text }));
`;

// What a bundle must still do although it carries no worker files (issue 21 item 1): chat
// prompts (the template), the server (its prompt encoder) and the engine (record hashing).
const FEATURES = `import { createServer, Model } from "cherenkov";

const dir: string | undefined = process.argv[2];
const backend = process.argv[3] === "cpu" ? "cpu" : "reference";
await using model = await Model.load(dir, { backend });
const messages = [{ role: "user" as const, content: "Write a function" }];
const chat = await model.generate(messages, { maxTokens: 6 });
const server = createServer({ model, port: 0 });
const res = await fetch(server.url + "/v1/chat/completions", {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ messages, max_tokens: 6 }),
});
const body = (await res.json()) as { choices?: { message: { content: string } }[] };
await server.stop();
console.log(JSON.stringify({ backend: model.backendName, chat: chat.tokens, status: res.status, served: body.choices?.[0]?.message.content ?? body }));
`;

describePack("installed into a fresh app", () => {
  let app = "";
  let modelDir = "";
  let installLog = "";
  beforeAll(() => {
    // An undeclared package named like the old prebuilt ones, up the tree from the app.
    const planted = join(scratch, "node_modules", "@cherenkov", `shim-${process.platform}-${process.arch}`);
    mkdirSync(planted, { recursive: true });
    writeFileSync(join(planted, "package.json"), JSON.stringify({ name: `@cherenkov/shim-${process.platform}-${process.arch}`, main: "index.js" }));
    writeFileSync(join(planted, "index.js"), `require("fs").writeFileSync(${JSON.stringify(join(scratch, "planted-ran"))}, "x"); module.exports = { cpu: "/bin/sh" };`);

    app = join(scratch, "app");
    mkdirSync(app);
    writeFileSync(join(app, "package.json"), JSON.stringify({
      name: "app", type: "module", private: true,
      dependencies: { cherenkov: `file:${tarball}` },
      devDependencies: { "@types/bun": pkg.devDependencies["@types/bun"], typescript: pkg.devDependencies.typescript },
    }, null, 2));
    writeFileSync(join(app, "tsconfig.json"), JSON.stringify(BUN_INIT_TSCONFIG, null, 2));
    writeFileSync(join(app, "index.ts"), APP);
    writeFileSync(join(app, "features.ts"), FEATURES);
    // From bun's cache (the checkout's own install filled it); only missing metadata is fetched.
    const r = sh([process.execPath, "install", "--prefer-offline"], app);
    if (r.code !== 0) throw new Error(`bun install in the app failed:\n${r.out}${r.err}`);
    installLog = r.out + r.err;
    modelDir = join(app, "node_modules", "cherenkov", "examples", "models", "qwen4-exp-tiny");
  }, 120_000);

  test("the postinstall did not run (untrusted), and nothing built the native library since", () => {
    expect(installLog).toContain("Blocked 1 postinstall");
    expect(existsSync(join(app, "node_modules", "cherenkov", "metal-shim", "build"))).toBe(false);
  });

  let expected = "";
  test("generates with the default model, sampled with a seed, reproducibly; await using and using work", () => {
    const r = sh([process.execPath, "index.ts"], app);
    expect(r.err).toBe("");
    const out = JSON.parse(r.out);
    expect(out.same).toBe(true);
    expect(out.tokens).toHaveLength(8);
    expected = JSON.stringify(out);
    expect(existsSync(join(app, "node_modules", "cherenkov", "metal-shim", "build"))).toBe(false);
  }, 60_000);

  test("the published types compile under tsc --strict with bun init's tsconfig", () => {
    const r = sh([join(app, "node_modules", ".bin", "tsc"), "--noEmit", "-p", "."], app);
    expect(r.out + r.err).toBe("");
    expect(r.code).toBe(0);
  }, 120_000);

  test("bun build bundles the app, and the bundle generates the same tokens", () => {
    const b = sh([process.execPath, "build", "index.ts", "--target", "bun", "--outdir", "out"], app);
    expect({ code: b.code, err: b.err }).toEqual({ code: 0, err: "" });
    const r = sh([process.execPath, join("out", "index.js"), modelDir], app);
    expect(r.err).toBe("");
    expect(r.out.trim()).toBe(expected);
  }, 60_000);

  test("bun build --compile makes an executable that generates the same tokens", () => {
    const b = sh([process.execPath, "build", "index.ts", "--compile", "--outfile", "app-bin"], app);
    expect({ code: b.code, err: b.err }).toEqual({ code: 0, err: "" });
    const r = sh([join(app, "app-bin"), modelDir], app);
    expect(r.err).toBe("");
    expect(r.out.trim()).toBe(expected);
  }, 120_000);

  // The checkout's CPU library, as an app that ships one would name it.
  const cpuLibrary = { CHERENKOV_SHIM_PATH: localLibraryPath("cpu") };
  const features: Record<string, string> = {};
  test("chat prompts, the server and the CPU engine work from the installed package", () => {
    for (const backend of ["reference", "cpu"]) {
      const r = sh([process.execPath, "features.ts", modelDir, backend], app, cpuLibrary);
      expect(r.err).toBe("");
      const out = JSON.parse(r.out);
      expect(out).toMatchObject({ backend, status: 200 });
      expect(out.chat).toHaveLength(6);
      expect(typeof out.served).toBe("string");
      features[backend] = r.out.trim();
    }
  }, 120_000);

  for (const kind of ["bun build", "bun build --compile"] as const) {
    test(`${kind}: chat prompts, the server and the CPU engine give the same results as the package (no worker files)`, () => {
      const exe = kind === "bun build" ? [process.execPath, join("features-out", "features.js")] : [join(app, "features-bin")];
      const args = kind === "bun build" ? ["--target", "bun", "--outdir", "features-out"] : ["--compile", "--outfile", "features-bin"];
      const b = sh([process.execPath, "build", "features.ts", ...args], app);
      expect({ code: b.code, err: b.err }).toEqual({ code: 0, err: "" });
      for (const backend of ["reference", "cpu"]) {
        const r = sh([...exe, modelDir, backend], app, cpuLibrary);
        expect(r.err).toBe("");
        expect(r.out.trim()).toBe(features[backend]!);
      }
      // Without a model directory: what to pass, not a path that exists only in the package.
      const bare = sh([...exe], app);
      expect(bare.out + bare.err).toContain("no model directory was given, and the default model is not at");
      expect(bare.out + bare.err).toContain("pass a model directory");
    }, 120_000);
  }

  test("the engine without its native library: one line saying what to run; the planted package is not loaded", () => {
    const script = `import { Model } from "cherenkov";
try { await Model.load(undefined, { backend: "cpu" }); console.log("loaded"); } catch (e) { console.log(e.name + ": " + e.message); }`;
    writeFileSync(join(app, "engine.ts"), script);
    const r = sh([process.execPath, "engine.ts"], app);
    const lib = join(app, "node_modules", "cherenkov", "metal-shim", "build", `libcherenkov_cpu.${process.platform === "darwin" ? "dylib" : "so"}`);
    expect(r.out).toBe(
      `BackendUnavailableError: backend "cpu" is not available here: cherenkov: the native cpu library ${lib} is not built: ` +
        "run bun pm trust cherenkov (runs its build), or bunx cherenkov build (needs a C++ compiler)\n",
    );
    expect(existsSync(join(scratch, "planted-ran"))).toBe(false);
  }, 60_000);
});
