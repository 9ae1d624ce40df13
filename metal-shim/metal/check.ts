#!/usr/bin/env bun
// Strict checks of the Metal backend that run on Linux (no Mac, no GPU here):
//  (a) kernels: every kernels/*.metal passes clang-19 -fsyntax-only as C++17
//      against strict/ (a prelude where device, constant and threadgroup are
//      distinct address spaces), plus a lint of kernel signatures that clang
//      cannot see (attributes are ignored by clang: missing address spaces,
//      buffer indices, builtin argument types);
//  (b) objc: every metal-shim/metal/*.m compiles with clang-19 as
//      Objective-C with ARC for arm64-apple-macos14.0 against the declarations
//      transcribed in sdk/, twice: as the macOS 14 SDK (Xcode 15, where the
//      macOS 15 API is not declared at all) and as the macOS 15 SDK (an
//      unknown selector, a wrong argument type, an unguarded macOS 15 call or
//      one without the compile-time SDK guard is an error) into a Mach-O object whose symbols
//      are then read: it exports exactly cherenkov.h's functions and imports
//      macOS 15 classes weakly; metal-shim/common/io.c compiles with
//      -Wall -Werror;
//  (c) abi: the .m files define every CK_API function of cherenkov.h with the
//      same return and parameter types.
// Usage: bun metal-shim/metal/check.ts [--json]. Exit status 0 when all pass.
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { cpus, tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { BUILTINS } from "../gen-bindings.ts";

export const METAL_DIR = dirname(new URL(import.meta.url).pathname);
export const REPO_ROOT = resolve(METAL_DIR, "../..");
export const STRICT_DIR = join(METAL_DIR, "strict");
export const SDK_DIR = join(METAL_DIR, "sdk");
export const HEADER = join(REPO_ROOT, "metal-shim/include/cherenkov.h");
export const IO_SOURCE = join(REPO_ROOT, "metal-shim/common/io.c");

export interface CheckResult {
  name: "kernels" | "objc" | "abi";
  ok: boolean;
  /** Files checked, relative to the repository root. */
  files: string[];
  /** Compiler and lint messages (empty when clean). */
  output: string;
}

/** $CK_CLANG when set (and only it), else clang-19; null when not installed. */
export function clangPath(): string | null {
  const chosen = process.env.CK_CLANG;
  const candidates = chosen ? [chosen] : ["clang-19", "/usr/lib/llvm-19/bin/clang"];
  for (const c of candidates) {
    const found = c.includes("/") ? (existsSync(c) ? c : null) : Bun.which(c);
    if (found) return found;
  }
  return null;
}

/** clang-19 (or $CK_CLANG); throws with the install command when absent. */
export function findClang(): string {
  const found = clangPath();
  if (!found) throw new Error("clang-19 not found (apt-get install clang-19, or set CK_CLANG)");
  return found;
}

interface Run {
  code: number;
  output: string;
}

async function run(cmd: string[]): Promise<Run> {
  const proc = Bun.spawn(cmd, { stdout: "pipe", stderr: "pipe" });
  const [out, err, code] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ]);
  return { code, output: out + err };
}

async function runAll(cmds: string[][]): Promise<Run[]> {
  const results: Run[] = new Array(cmds.length);
  let next = 0;
  const workers = Array.from({ length: Math.max(1, Math.min(cpus().length, cmds.length)) }, async () => {
    while (next < cmds.length) {
      const i = next++;
      results[i] = await run(cmds[i]!);
    }
  });
  await Promise.all(workers);
  return results;
}

const rel = (p: string) => relative(REPO_ROOT, p) || p;

// ---- (a) kernels -----------------------------------------------------------------------

interface Token {
  text: string;
  pos: number;
  kind: "ident" | "number" | "punct" | "string";
}

/** C++ tokens of `src` (comments, string contents and preprocessor lines skipped). */
export function tokenize(src: string): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  let lineStart = true;
  while (i < src.length) {
    const c = src[i]!;
    if (c === "\n") {
      lineStart = true;
      i++;
      continue;
    }
    if (c === " " || c === "\t" || c === "\r") {
      i++;
      continue;
    }
    if (lineStart && c === "#") {
      // A directive runs to the end of the line, including continuations.
      while (i < src.length && src[i] !== "\n") i += src[i] === "\\" && src[i + 1] === "\n" ? 2 : 1;
      continue;
    }
    lineStart = false;
    if (c === "/" && src[i + 1] === "/") {
      while (i < src.length && src[i] !== "\n") i++;
      continue;
    }
    if (c === "/" && src[i + 1] === "*") {
      const end = src.indexOf("*/", i + 2);
      i = end < 0 ? src.length : end + 2;
      continue;
    }
    if (c === '"' || c === "'") {
      const start = i++;
      while (i < src.length && src[i] !== c) i += src[i] === "\\" ? 2 : 1;
      i++;
      tokens.push({ text: src.slice(start, i), pos: start, kind: "string" });
      continue;
    }
    if (/[A-Za-z_]/.test(c)) {
      const m = /^[A-Za-z_]\w*/.exec(src.slice(i, i + 256))!;
      tokens.push({ text: m[0], pos: i, kind: "ident" });
      i += m[0].length;
      continue;
    }
    if (/[0-9]/.test(c) || (c === "." && /[0-9]/.test(src[i + 1] ?? ""))) {
      const m = /^[0-9.]+([eEpP][+-]?[0-9]+)?[A-Za-z0-9_.]*/.exec(src.slice(i, i + 64))!;
      tokens.push({ text: m[0], pos: i, kind: "number" });
      i += m[0].length;
      continue;
    }
    tokens.push({ text: c, pos: i, kind: "punct" });
    i++;
  }
  return tokens;
}

function lineCol(src: string, pos: number): { line: number; col: number } {
  let line = 1;
  let last = -1;
  for (let i = 0; i < pos; i++)
    if (src.charCodeAt(i) === 10) {
      line++;
      last = i;
    }
  return { line, col: pos - last };
}

const QUALIFIERS = new Set(["const", "volatile", "threadgroup", "static"]);
const SCALARS = ["float", "half", "bfloat", "int", "uint", "short", "ushort", "char", "uchar", "long", "ulong", "bool"];
function isBuiltinType(name: string): boolean {
  if (/^(packed_)?[a-z]+[234]$/.test(name) && SCALARS.includes(name.replace(/^packed_/, "").slice(0, -1))) return true;
  return SCALARS.includes(name) || /^atomic_(int|uint|bool|float)$/.test(name) || /^u?int(8|16|32|64)_t$/.test(name);
}

/**
 * The text clang checks, differing from the source only where C++ and MSL
 * disagree on spelling (line numbers are kept):
 *  - a `threadgroup` declaration inside a function becomes
 *    `static threadgroup ... = {}` (C++ forbids address spaces on automatic
 *    variables; `= {}` avoids constructors for structs and atomics);
 *  - `template [[host_name("x")]]` loses the attribute, which C++ does not
 *    allow at that place.
 */
/** Whether the `{` at tokens[t] opens a struct, class or union body (the keyword since the last `;`, `{` or `}`). */
function opensStructBody(tokens: { text: string }[], t: number): boolean {
  for (let u = t - 1; u >= 0; u--) {
    const x = tokens[u]!.text;
    if (x === ";" || x === "{" || x === "}" || x === ")") return false;
    if (x === "struct" || x === "class" || x === "union") return true;
  }
  return false;
}

export function rewriteForStrict(original: string): string {
  // host_name first, by pattern, so that instantiation macros (#define lines,
  // which the tokenizer skips) are covered too; blanks keep every position.
  const src = original.replace(/template(?:\s|\\\n)*\[\[[^\]]*\bhost_name\b[^\]]*\]\]/g, (m) =>
    "template" + m.slice("template".length).replace(/[^\n\\]/g, " "),
  );
  const tokens = tokenize(src);
  const edits: { pos: number; del: number; ins: string }[] = [];
  const stack: string[] = [];
  for (let t = 0; t < tokens.length; t++) {
    const tok = tokens[t]!;
    if (tok.kind === "punct") {
      // A struct's body ("S{") holds members, not automatic variables: a threadgroup
      // pointer member stays as it is.
      if (tok.text === "{") stack.push(opensStructBody(tokens, t) ? "S{" : "{");
      else if ("([".includes(tok.text)) stack.push(tok.text);
      else if (")]}".includes(tok.text)) stack.pop();
      continue;
    }
    if (tok.text !== "threadgroup") continue;
    const braces = stack.filter((x) => x === "{" || x === "S{");
    const inFunction = braces.at(-1) === "{" && !stack.includes("(") && !stack.includes("[");
    const prev = tokens[t - 1]?.text;
    if (!inFunction || !(prev === ";" || prev === "{" || prev === "}")) continue;
    // Find the declaration's end and whether it declares one name only.
    let depth = 0;
    let single = true;
    let u = t + 1;
    for (; u < tokens.length; u++) {
      const x = tokens[u]!.text;
      if ("([{".includes(x)) depth++;
      else if (")]}".includes(x)) depth--;
      else if (depth === 0 && (x === "," || x === "=")) single = false;
      else if (depth === 0 && x === ";") break;
    }
    edits.push({ pos: tok.pos, del: 0, ins: "static " });
    // Structs need `= {}` (no constructor can build an object in another
    // address space); built-in types must not get it (_Atomic rejects it).
    const typeName = tokens.slice(t + 1, u).find((x) => x.kind === "ident" && !QUALIFIERS.has(x.text))?.text ?? "";
    if (single && u < tokens.length && !isBuiltinType(typeName)) edits.push({ pos: tokens[u]!.pos, del: 0, ins: " = {}" });
  }
  let out = src;
  for (const e of edits.sort((a, b) => b.pos - a.pos)) out = out.slice(0, e.pos) + e.ins + out.slice(e.pos + e.del);
  return out;
}

// Thread-position attributes of compute kernels, and the argument types they allow.
const BUILTIN_ATTRIBUTES = new Set<string>([
  ...BUILTINS, // the ones the CPU backend binds, plus those Metal has that it does not:
  "grid_origin",
  "grid_size",
  "thread_index_in_quadgroup",
  "quadgroup_index_in_threadgroup",
  "quadgroups_per_threadgroup",
]);
const BUILTIN_TYPES = new Set(["uint", "uint2", "uint3", "ushort", "ushort2", "ushort3"]);

/** Messages (clang style) for kernel signatures Metal would reject. */
export function lintKernelSignatures(src: string, shownPath: string): string[] {
  const tokens = tokenize(src);
  const problems: string[] = [];
  const at = (pos: number, msg: string) => {
    const { line, col } = lineCol(src, pos);
    problems.push(`${shownPath}:${line}:${col}: error: ${msg}`);
  };
  let parens = 0;
  for (let t = 0; t < tokens.length; t++) {
    const tok = tokens[t]!;
    if (tok.text === "(") parens++;
    else if (tok.text === ")") parens--;
    if (tok.text !== "kernel" || parens !== 0) continue;
    // An explicit instantiation (template [[host_name("x")]] kernel ...) repeats
    // a template's signature, which is linted where the template is defined.
    let back = t - 1;
    if (tokens[back]?.text === "]") {
      let depth = 0;
      for (; back >= 0; back--) {
        if (tokens[back]!.text === "]") depth++;
        else if (tokens[back]!.text === "[" && --depth === 0) break;
      }
      back--;
    }
    if (tokens[back]?.text === "template") continue;
    // kernel <return type> <name>(params)
    let open = t + 1;
    while (open < tokens.length && tokens[open]!.text !== "(" && tokens[open]!.text !== ";") open++;
    if (tokens[open]?.text !== "(") continue;
    const name = tokens[open - 1]!.text;
    const returnType = tokens.slice(t + 1, open - 1).map((x) => x.text).join(" ");
    if (returnType !== "void") at(tok.pos, `kernel '${name}' must return void, not '${returnType}'`);
    // Split the parameter list at top-level commas.
    const params: Token[][] = [[]];
    let depth = 0;
    let u = open + 1;
    for (; u < tokens.length; u++) {
      const x = tokens[u]!.text;
      if (x === "(" || x === "[" || x === "<") depth++;
      else if (x === "]" || x === ">") depth--;
      else if (x === ")") {
        if (depth === 0) break;
        depth--;
      } else if (x === "," && depth === 0) {
        params.push([]);
        continue;
      }
      params[params.length - 1]!.push(tokens[u]!);
    }
    const buffers = new Map<number, string>();
    const builtins = new Set<string>();
    for (const p of params) {
      if (p.length === 0) continue;
      const attrStart = p.findIndex((x, k) => x.text === "[" && p[k + 1]?.text === "[");
      const decl = attrStart < 0 ? p : p.slice(0, attrStart);
      const attr = attrStart < 0 ? [] : p.slice(attrStart + 2).filter((x) => x.text !== "]");
      const paramName = decl[decl.length - 1]!.text;
      const typeWords = decl.slice(0, -1).map((x) => x.text);
      const indirect = typeWords.includes("*") || typeWords.includes("&");
      const where = p[0]!.pos;
      const what = `argument '${paramName}' of kernel '${name}'`;
      if (attr.length === 0) {
        at(where, `${what} has no attribute: Metal needs [[buffer(n)]] or a thread-position attribute`);
        continue;
      }
      const attrName = attr[0]!.text;
      if (attrName === "buffer") {
        const index = Number(attr[2]?.text);
        if (!Number.isInteger(index) || index < 0 || index > 30)
          at(where, `${what}: [[buffer(${attr[2]?.text})]] is outside 0..30`);
        else if (buffers.has(index)) at(where, `${what}: [[buffer(${index})]] is also used by '${buffers.get(index)}'`);
        else buffers.set(index, paramName);
        if (!indirect) {
          at(where, `${what}: a [[buffer]] argument must be a device or constant pointer or reference`);
        } else if (typeWords.includes("threadgroup")) {
          at(where, `${what}: a [[buffer]] argument cannot be in the threadgroup address space`);
        } else if (!typeWords.includes("device") && !typeWords.includes("constant")) {
          at(where, `${what}: a pointer or reference argument needs an address space (device or constant)`);
        }
      } else if (attrName === "threadgroup") {
        at(where, `${what}: [[threadgroup(n)]] arguments cannot be sized through cherenkov.h; declare the array inside the kernel`);
      } else if (BUILTIN_ATTRIBUTES.has(attrName)) {
        if (builtins.has(attrName)) at(where, `${what}: [[${attrName}]] appears twice`);
        builtins.add(attrName);
        const base = typeWords.filter((w) => w !== "const");
        if (indirect || base.length !== 1 || !BUILTIN_TYPES.has(base[0]!))
          at(where, `${what}: [[${attrName}]] needs a uint, ushort or their 2- or 3-vectors, not '${typeWords.join(" ")}'`);
      } else {
        at(where, `${what}: unknown attribute [[${attrName}]]`);
      }
    }
    t = u;
  }
  return problems;
}

function kernelFlags(includeDir: string): string[] {
  return [
    "-x", "c++", "-std=c++17", "-fsyntax-only",
    "-nostdinc", "-isystem", STRICT_DIR, "-include", join(STRICT_DIR, "metal_builtins.h"),
    "-iquote", includeDir,
    "-D__METAL_VERSION__=310", "-D__METAL_MACOS__=1", "-DCK_STRICT_CHECK=1",
    "-fno-exceptions", "-fno-rtti", "-fno-color-diagnostics", "-ferror-limit=40",
    "-Wno-unknown-attributes", "-Wno-duplicate-decl-specifier",
    "-Werror=return-type", "-Werror=vla-cxx-extension", "-Werror=uninitialized",
  ];
}

/**
 * Check (a) on every *.metal in `kernelDir` (or the given files of it). The
 * directory's *.metal and *.h are copied, rewritten (rewriteForStrict), into a
 * scratch directory that clang compiles; messages name the original paths.
 */
export async function checkKernels(kernelDir = join(REPO_ROOT, "kernels"), only?: string[]): Promise<CheckResult> {
  const clang = findClang();
  const names = existsSync(kernelDir) ? readdirSync(kernelDir) : [];
  const metal = (only ?? names.filter((n) => n.endsWith(".metal"))).sort();
  const scratch = mkdtempSync(join(tmpdir(), "ck-strict-"));
  try {
    for (const n of names.filter((n) => /\.(metal|h)$/.test(n))) {
      writeFileSync(join(scratch, n), rewriteForStrict(readFileSync(join(kernelDir, n), "utf8")));
    }
    const shown = rel(kernelDir);
    const lint = metal.flatMap((n) => lintKernelSignatures(readFileSync(join(kernelDir, n), "utf8"), `${shown}/${n}`));
    const runs = await runAll(metal.map((n) => [clang, ...kernelFlags(scratch), join(scratch, n)]));
    const clangOut = runs
      .map((r) => r.output.split(scratch).join(shown))
      .filter((o) => o.trim().length > 0)
      .join("");
    const failed = lint.length > 0 || runs.some((r) => r.code !== 0);
    return {
      name: "kernels",
      ok: !failed,
      files: metal.map((n) => `${shown}/${n}`),
      output: [...lint, clangOut].filter(Boolean).join("\n"),
    };
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

// ---- (b) Objective-C ----------------------------------------------------------------------

/** The deployment target: MSL 3.1 (bfloat) needs macOS 14. */
export const OBJC_TARGET = "arm64-apple-macos14.0";

/** SDK generations the Objective-C is compiled against: macOS 14 (Xcode 15) and 15 (Xcode 16). */
export type SdkGeneration = 14 | 15;
export const SDK_GENERATIONS: readonly SdkGeneration[] = [14, 15];

export function objcFlags(target = OBJC_TARGET, sdk: SdkGeneration = 15): string[] {
  return [
    "-target", target, "-x", "objective-c", `-DCK_SDK_VERSION=${sdk}0000`,
    "-fobjc-arc", "-fblocks", "-nostdlibinc", "-isystem", SDK_DIR, "-iquote", METAL_DIR,
    "-fno-color-diagnostics", "-ferror-limit=40",
    "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wmissing-prototypes", "-Wshorten-64-to-32",
    "-Wsign-compare", "-Wformat=2", "-Wstrict-prototypes", "-Wunguarded-availability", "-Wdeprecated",
    "-Wshadow", "-Wconditional-uninitialized", "-Werror",
  ];
}

export function metalSources(): string[] {
  return readdirSync(METAL_DIR)
    .filter((n) => n.endsWith(".m"))
    .sort()
    .map((n) => join(METAL_DIR, n));
}

export interface MachOSymbol {
  name: string;
  defined: boolean;
  /** Visible outside the linked library (external, not private external). */
  exported: boolean;
  /** An undefined reference that may be missing at load time (weak import). */
  weak: boolean;
}

/** The symbol table of a 64-bit little-endian Mach-O object file. */
export function machOSymbols(bytes: Uint8Array): MachOSymbol[] {
  const v = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (v.getUint32(0, true) !== 0xfeedfacf) throw new Error("not a 64-bit little-endian Mach-O file");
  const ncmds = v.getUint32(16, true);
  let at = 32;
  for (let c = 0; c < ncmds; c++) {
    const cmd = v.getUint32(at, true);
    if (cmd === 0x2 /* LC_SYMTAB */) {
      const symoff = v.getUint32(at + 8, true);
      const nsyms = v.getUint32(at + 12, true);
      const stroff = v.getUint32(at + 16, true);
      const out: MachOSymbol[] = [];
      for (let i = 0; i < nsyms; i++) {
        const e = symoff + 16 * i;
        const strx = v.getUint32(e, true);
        const type = v.getUint8(e + 4);
        const desc = v.getUint16(e + 6, true);
        if (type & 0xe0) continue; // debugger entries
        let end = stroff + strx;
        while (bytes[end] !== 0) end++;
        const name = new TextDecoder().decode(bytes.subarray(stroff + strx, end));
        const defined = (type & 0x0e) !== 0;
        out.push({ name, defined, exported: defined && (type & 0x01) !== 0 && (type & 0x10) === 0, weak: !defined && (desc & 0x40) !== 0 });
      }
      return out;
    }
    at += v.getUint32(at + 4, true);
  }
  return [];
}

/** Classes and functions sdk/ marks as newer than the given macOS version. */
export function newerThan(macos: number): string[] {
  const deployment = macos;
  const text = readFileSync(join(SDK_DIR, "Metal/Metal.h"), "utf8") + readFileSync(join(SDK_DIR, "Foundation/Foundation.h"), "utf8");
  const names: string[] = [];
  for (const m of text.matchAll(/CK_SDK_MACOS\(([\d.]+)\)\s*@interface\s+(\w+)/g))
    if (Number(m[1]) > deployment) names.push(`_OBJC_CLASS_$_${m[2]}`);
  for (const m of text.matchAll(/extern[^;(]*\b(\w+)\s*\([^;]*\)[^;]*CK_SDK_MACOS\(([\d.]+)\)\s*;/g))
    if (Number(m[2]) > deployment) names.push(`_${m[1]}`);
  return names;
}

export interface ObjcOptions {
  /** Also compile this C file on the host with -Wall -Werror (null: skip). */
  ioSource?: string | null;
  /** clang target triple (deployment target included). */
  target?: string;
  /** Oldest macOS the library must load on (default: the target's). */
  loadsOn?: number;
  /** SDK generations to compile against (default both, 14 and 15). */
  sdks?: readonly SdkGeneration[];
}

/**
 * Check (b) on the given .m files (default: metal-shim/metal/*.m) and io.c.
 * Each .m is compiled to an arm64 Mach-O object (so ARC and @available are
 * lowered for real, not only parsed); the objects must then export exactly
 * the CK_API functions of cherenkov.h and import anything newer than the
 * deployment target weakly (else the library would not load on macOS 14).
 */
export async function checkObjc(files = metalSources(), opts: ObjcOptions = {}): Promise<CheckResult> {
  const clang = findClang();
  const ioSource = opts.ioSource === undefined ? IO_SOURCE : opts.ioSource;
  const target = opts.target ?? OBJC_TARGET;
  const scratch = mkdtempSync(join(tmpdir(), "ck-objc-"));
  try {
    const sdks = opts.sdks ?? SDK_GENERATIONS;
    // One compile per (SDK generation, file); messages say which SDK they came from.
    const units = sdks.flatMap((sdk) => files.map((f, i) => ({ sdk, file: f, object: join(scratch, `${sdk}-${i}.o`) })));
    const cmds = units.map((u) => [clang, ...objcFlags(target, u.sdk), "-O2", "-fvisibility=hidden", "-c", u.file, "-o", u.object]);
    if (ioSource) cmds.push([clang, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-fno-color-diagnostics", ioSource]);
    const runs = await runAll(cmds);
    const problems: string[] = runs.map((r, i) => (r.output.trim() && units[i] ? `[macOS ${units[i]!.sdk} SDK] ${r.output}` : r.output)).filter((o) => o.trim());
    if (files.length === 0) problems.push("no .m files");
    if (runs.every((r) => r.code === 0) && files.length > 0) {
      const api = new Set(apiSignatures(readFileSync(HEADER, "utf8"), false).map((s) => `_${s.name}`));
      const oldest = opts.loadsOn ?? Number(/macos([\d.]+)/.exec(target)![1]);
      const newer = new Set(newerThan(oldest));
      for (const sdk of sdks) {
        const exportedBy = new Map<string, string[]>();
        for (const u of units.filter((x) => x.sdk === sdk)) {
          for (const sym of machOSymbols(readFileSync(u.object))) {
            if (sym.exported) exportedBy.set(sym.name, [...(exportedBy.get(sym.name) ?? []), rel(u.file)]);
            if (!sym.defined && newer.has(sym.name) && !sym.weak)
              problems.push(`[macOS ${sdk} SDK] ${rel(u.file)}: ${sym.name} is newer than macOS ${oldest} but not weakly imported: the library would not load there`);
          }
        }
        for (const [name, where] of exportedBy) {
          if (!api.has(name)) problems.push(`[macOS ${sdk} SDK] ${where.join(", ")}: exports ${name}, which cherenkov.h does not declare`);
          else if (where.length > 1) problems.push(`[macOS ${sdk} SDK] ${name} is exported by ${where.length} files: ${where.join(", ")}`);
        }
      }
    }
    const failed = runs.some((r) => r.code !== 0) || problems.length > 0;
    return {
      name: "objc",
      ok: !failed,
      files: [...files, ...(ioSource ? [ioSource] : [])].map(rel),
      output: problems.map((x) => x.trimEnd()).join("\n"),
    };
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

// ---- (c) ABI -------------------------------------------------------------------------------

export interface Signature {
  name: string;
  /** Return type and parameter types, names removed, spacing normalised. */
  shape: string;
}

const normalise = (s: string) =>
  s.replace(/\s+/g, " ").replace(/\s*\*\s*/g, "* ").replace(/\s+,/g, ",").trim().replace(/\*\s+$/, "*");

function dropParamName(param: string): string {
  const p = param.trim();
  if (p === "void" || p === "") return p;
  // The last identifier is the name when something (a type or '*') precedes it.
  const m = /^(.*?[\w*&\s])\s*\b([A-Za-z_]\w*)\s*$/.exec(p);
  return m && /[\w*]/.test(m[1]!) && !/^(const|unsigned|signed)$/.test(m[1]!.trim()) ? m[1]!.trim() : p;
}

function shapeOf(ret: string, params: string): string {
  const list = params.split(",").map(dropParamName).map(normalise).join(", ");
  return `${normalise(ret)} (${list})`;
}

/** CK_API function declarations (header) or definitions (sources). */
export function apiSignatures(text: string, definitions: boolean): Signature[] {
  const noComments = text.replace(/\/\*[\s\S]*?\*\//g, " ").replace(/\/\/[^\n]*/g, " ");
  const re = definitions
    ? /\bCK_API\s+([^;{}()]*?)\b(ck_\w+)\s*\(([^)]*)\)\s*\{/g
    : /\bCK_API\s+([^;{}()]*?)\b(ck_\w+)\s*\(([^)]*)\)\s*;/g;
  const out: Signature[] = [];
  for (const m of noComments.matchAll(re)) out.push({ name: m[2]!, shape: shapeOf(m[1]!, m[3]!) });
  return out;
}

/** Check (c): every CK_API of the header is defined once, with its shape. */
export function checkAbi(header = HEADER, sources = metalSources()): CheckResult {
  const declared = apiSignatures(readFileSync(header, "utf8"), false);
  const defined = sources.flatMap((f) => apiSignatures(readFileSync(f, "utf8"), true).map((s) => ({ ...s, file: f })));
  const problems: string[] = [];
  if (declared.length === 0) problems.push(`${rel(header)}: no CK_API declarations found`);
  for (const d of declared) {
    const defs = defined.filter((x) => x.name === d.name);
    if (defs.length === 0) problems.push(`${d.name}: declared in ${rel(header)}, defined in no .m file`);
    else if (defs.length > 1) problems.push(`${d.name}: defined ${defs.length} times (${defs.map((x) => rel(x.file)).join(", ")})`);
    else if (defs[0]!.shape !== d.shape)
      problems.push(`${d.name}: ${rel(defs[0]!.file)} defines '${defs[0]!.shape}', ${rel(header)} declares '${d.shape}'`);
  }
  for (const x of defined)
    if (!declared.some((d) => d.name === x.name)) problems.push(`${x.name}: defined in ${rel(x.file)} but not declared in ${rel(header)}`);
  return {
    name: "abi",
    ok: problems.length === 0,
    files: [header, ...sources].map(rel),
    output: problems.join("\n"),
  };
}

// ---- command line ----------------------------------------------------------------------------

if (import.meta.main) {
  const json = process.argv.includes("--json");
  const results = [await checkKernels(), await checkObjc(), checkAbi()];
  if (json) {
    console.log(JSON.stringify(results, null, 2));
  } else {
    for (const r of results) {
      console.log(`${r.ok ? "PASS" : "FAIL"} ${r.name}: ${r.files.length} file(s)`);
      for (const f of r.files) console.log(`  ${f}`);
      if (r.output.trim()) console.log(r.output.trimEnd().replace(/^/gm, "  | "));
    }
  }
  process.exit(results.every((r) => r.ok) ? 0 : 1);
}
