/**
 * Reads kernels/*.metal into a kernel table (parseKernelTable: every pipeline
 * with its [[buffer(i)]] and builtin bindings, parsed from each
 * `kernel void name(...)` signature, since C++ compilers ignore or reject
 * Metal's attributes) that any backend's emitter can use. The CPU emitter
 * (emitCpu) writes what the CPU backend compiles:
 *  - a copy of every kernels/ source made valid C++ by cppSource(): `threadgroup`
 *    storage becomes `static thread_local` (shared by the fibers of a threadgroup),
 *    `threadgroup` pointer/reference qualifiers are dropped, and the
 *    [[host_name("...")]] of explicit instantiations is blanked (g++ ignores it,
 *    clang rejects an attribute list there; the name lives in the table),
 *  - one C++ file per .metal with the binding table of its kernels,
 *  - registry.cpp listing every table.
 * Run by metal-shim/build.ts; `bun metal-shim/gen-bindings.ts` prints the table.
 */
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync, existsSync } from "node:fs";
import { dirname, join, relative, basename } from "node:path";

export type ParamBinding = { kind: "buffer"; index: number } | { kind: "builtin"; attr: string };

export interface KernelEntry {
  /** Pipeline name: the [[host_name]] if given, else the function name. */
  name: string;
  /** C++ expression naming the function (with template arguments). */
  fn: string;
  params: ParamBinding[];
  /** "kernels/file.metal:line" of the signature. */
  where: string;
  /**
   * The kernel's `[[max_total_threads_per_threadgroup(N)]]` (on the definition or, for an
   * instantiation, on its template), or null: the largest threadgroup the host may dispatch,
   * which lets a compiler give each thread more registers (CUDA: __launch_bounds__(N)).
   */
  maxThreads: number | null;
  /**
   * The kernel's body (or its template's) calls ck_inputs_ready() (kernels/grid.h): it waits
   * for the previous dispatch's results itself, after reading what no dispatch writes, so the
   * CUDA entry does not wait first (metal-shim/cuda/gen.ts).
   */
  waitsForInputs: boolean;
}

/** The builtin attributes the CPU backend binds (see metal-shim/cpu/bind.h). */
export const BUILTINS = [
  "thread_position_in_grid",
  "thread_position_in_threadgroup",
  "threadgroup_position_in_grid",
  "threads_per_threadgroup",
  "dispatch_threads_per_threadgroup",
  "threadgroups_per_grid",
  "threads_per_grid",
  "thread_index_in_threadgroup",
  "thread_index_in_simdgroup",
  "simdgroup_index_in_threadgroup",
  "simdgroups_per_threadgroup",
  "threads_per_simdgroup",
  "thread_execution_width",
] as const;

const MAX_BUFFER_INDEX = 30;

export class KernelParseError extends Error {}

/** Blanks comments (keeping every newline and offset) so positions map 1:1 onto the source. */
export function stripComments(src: string): string {
  let out = "";
  let i = 0;
  while (i < src.length) {
    const c = src[i]!;
    const next = src[i + 1];
    if (c === "/" && next === "/") {
      while (i < src.length && src[i] !== "\n") (out += " "), i++;
    } else if (c === "/" && next === "*") {
      const end = src.indexOf("*/", i + 2);
      const stop = end < 0 ? src.length : end + 2;
      for (; i < stop; i++) out += src[i] === "\n" ? "\n" : " ";
    } else if (c === '"' || c === "'") {
      let j = i + 1;
      while (j < src.length && src[j] !== c && src[j] !== "\n") j += src[j] === "\\" ? 2 : 1;
      out += src.slice(i, j + 1);
      i = j + 1;
    } else {
      out += c;
      i++;
    }
  }
  return out;
}

/** Blanks preprocessor lines (after comments are gone), keeping offsets. */
function blankPreprocessor(code: string): string {
  return code.replace(/^[ \t]*#.*$/gm, (line) => " ".repeat(line.length));
}

function lineOf(text: string, pos: number): number {
  let line = 1;
  for (let i = 0; i < pos && i < text.length; i++) if (text.charCodeAt(i) === 10) line++;
  return line;
}

/** Index just past the bracket that closes the one at `open` (<> count only when matching <). */
function matchBracket(code: string, open: number): number {
  const angle = code[open] === "<";
  let depth = 0;
  for (let i = open; i < code.length; i++) {
    const c = code[i]!;
    if ("([{".includes(c) || (angle && c === "<")) depth++;
    else if (")]}".includes(c) || (angle && c === ">")) {
      depth--;
      if (depth === 0) return i + 1;
    }
  }
  return -1;
}

/** Splits a parameter list on commas outside (), [], {} and <>. */
function splitParams(list: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < list.length; i++) {
    const c = list[i]!;
    if ("([{<".includes(c)) depth++;
    else if (")]}>".includes(c)) depth--;
    else if (c === "," && depth === 0) {
      out.push(list.slice(start, i));
      start = i + 1;
    }
  }
  if (list.slice(start).trim()) out.push(list.slice(start));
  return out.map((p) => p.trim());
}

function parseParam(param: string, n: number, kernel: string, where: string): ParamBinding {
  const attr = /\[\[\s*(.*?)\s*\]\]/.exec(param);
  const fail = (why: string) =>
    new KernelParseError(`${where}: kernel ${kernel}, parameter ${n + 1} \`${param}\`: ${why}`);
  if (!attr) throw fail("has no [[...]] attribute (every kernel parameter needs [[buffer(i)]] or a builtin)");
  const text = attr[1]!;
  const buffer = /^buffer\s*\(\s*(\d+)\s*\)$/.exec(text);
  if (buffer) {
    const index = Number(buffer[1]);
    if (index > MAX_BUFFER_INDEX) throw fail(`buffer index ${index} is above ${MAX_BUFFER_INDEX}`);
    return { kind: "buffer", index };
  }
  if (/^threadgroup\s*\(/.test(text))
    throw fail("threadgroup pointer parameters are not in the subset: declare `threadgroup T name[N];` inside the kernel");
  if ((BUILTINS as readonly string[]).includes(text)) return { kind: "builtin", attr: text };
  throw fail(`attribute [[${text}]] is not supported (buffer(i) with a literal i, or one of: ${BUILTINS.join(", ")})`);
}

interface Found {
  name: string; // function name
  templateArgs: string | null; // "<float>" on instantiations
  hostName: string | null;
  kind: "definition" | "template" | "instantiation" | "declaration";
  params: string[] | null;
  line: number;
  maxThreads: number | null;
  waitsForInputs: boolean;
}

/** Finds every `kernel` declaration in one source. */
export function findKernels(source: string, file: string): Found[] {
  const code = blankPreprocessor(stripComments(source));
  const found: Found[] = [];
  // `p.kernel` or `p->kernel` is a field, not a declaration
  const re = /(?<!\.\s*|->\s*)\bkernel\b/g;
  for (let m = re.exec(code); m; m = re.exec(code)) {
    const at = m.index;
    const line = lineOf(code, at);
    const where = `${file}:${line}`;
    if (/\[\[\s*$/.test(code.slice(Math.max(0, at - 8), at)))
      throw new KernelParseError(`${where}: write \`kernel void name(...)\`, not [[kernel]]`);
    // What precedes `kernel` since the previous statement: template header, host_name.
    const prevEnd = Math.max(code.lastIndexOf(";", at), code.lastIndexOf("}", at), code.lastIndexOf("{", at));
    const prefix = code.slice(prevEnd + 1, at);
    const hostName = /\[\[\s*host_name\s*\(\s*"([^"]+)"\s*\)\s*\]\]/.exec(prefix)?.[1] ?? null;
    const bound = /\[\[\s*max_total_threads_per_threadgroup\s*\(\s*([^)]*?)\s*\)\s*\]\]/.exec(prefix)?.[1];
    if (bound !== undefined && !/^[1-9]\d*$/.test(bound))
      throw new KernelParseError(`${where}: [[max_total_threads_per_threadgroup(${bound})]]: write a literal thread count`);
    const maxThreads = bound === undefined ? null : Number(bound);
    if (maxThreads !== null && (maxThreads % 32 !== 0 || maxThreads > 1024))
      throw new KernelParseError(`${where}: [[max_total_threads_per_threadgroup(${maxThreads})]]: must be a multiple of 32, at most 1024`);
    const isTemplate = /\btemplate\s*</.test(prefix);
    const isInstantiation = !isTemplate && /\btemplate\b/.test(prefix);

    // Return type: a name (void, a typedef) or decltype(...), then the function name.
    let pos = at + "kernel".length;
    const skipSpace = () => {
      while (/\s/.test(code[pos] ?? "")) pos++;
    };
    skipSpace();
    if (/^decltype\s*\(/.test(code.slice(pos))) {
      pos = matchBracket(code, code.indexOf("(", pos));
      if (pos < 0) throw new KernelParseError(`${where}: unbalanced decltype(...)`);
    } else {
      const type = /^[A-Za-z_][\w:]*/.exec(code.slice(pos));
      if (!type) throw new KernelParseError(`${where}: cannot read the kernel's return type`);
      pos += type[0].length;
    }
    skipSpace();
    const head = /^[A-Za-z_]\w*/.exec(code.slice(pos));
    if (!head) throw new KernelParseError(`${where}: cannot read the kernel's name`);
    const name = head[0];
    pos += name.length;
    skipSpace();
    let templateArgs: string | null = null;
    if (code[pos] === "<") {
      const end = matchBracket(code, pos);
      if (end < 0) throw new KernelParseError(`${where}: unbalanced <...> after ${name}`);
      templateArgs = code.slice(pos, end).replace(/\s+/g, " ");
      pos = end;
      while (/\s/.test(code[pos] ?? "")) pos++;
    }
    let params: string[] | null = null;
    let hasBody = false;
    let waitsForInputs = false;
    if (code[pos] === "(") {
      const end = matchBracket(code, pos);
      if (end < 0) throw new KernelParseError(`${where}: unbalanced (...) in kernel ${name}`);
      params = splitParams(code.slice(pos + 1, end - 1));
      const after = code.slice(end).trimStart();
      hasBody = after.startsWith("{");
      if (hasBody) {
        const open = code.indexOf("{", end);
        const close = matchBracket(code, open);
        if (close < 0) throw new KernelParseError(`${where}: unbalanced {...} in kernel ${name}`);
        waitsForInputs = /\bck_inputs_ready\s*\(/.test(code.slice(open, close));
      }
      if (!hasBody && !after.startsWith(";"))
        throw new KernelParseError(`${where}: kernel ${name}: expected { or ; after the parameter list`);
    } else if (code[pos] !== ";") {
      throw new KernelParseError(`${where}: kernel ${name}: expected a parameter list`);
    }
    const kind = isTemplate ? "template" : isInstantiation ? "instantiation" : hasBody ? "definition" : "declaration";
    if (kind === "instantiation" && !hostName)
      throw new KernelParseError(`${where}: explicit instantiation of ${name} needs [[host_name("...")]]`);
    found.push({ name, templateArgs, hostName, kind, params, line, maxThreads, waitsForInputs });
  }
  return found;
}

/**
 * Rewrites `threadgroup` for C++: storage (`threadgroup float buf[32];`)
 * becomes `static thread_local`; as a qualifier of a pointer or reference
 * (`threadgroup float* p`) it is dropped. Offsets of lines are preserved.
 */
export function rewriteThreadgroup(source: string): string {
  const code = stripComments(source);
  const re = /\bthreadgroup\b/g;
  const edits: [number, number, string][] = [];
  for (let m = re.exec(code); m; m = re.exec(code)) {
    const end = m.index + m[0].length;
    const rest = code.slice(end);
    if (/^\s*\(/.test(rest)) continue; // [[threadgroup(i)]] attribute
    const stop = rest.search(/[;,)=[{>]/);
    const declarator = stop < 0 ? rest : rest.slice(0, stop);
    const isPointer = /[*&]/.test(declarator);
    edits.push([m.index, end, isPointer ? "" : "static thread_local"]);
  }
  let out = source;
  for (const [start, end, text] of edits.reverse()) out = out.slice(0, start) + text + out.slice(end);
  return out;
}

/**
 * Blanks `[[host_name("...")]]` (kept in the kernel table instead): C++ has no
 * such attribute and clang rejects an attribute list after `template`. Spaces
 * replace it, so columns and lines stay where they were.
 */
export function blankHostNames(source: string): string {
  // Scan a copy without comments and with string contents blanked (offsets kept), so
  // neither can hold a match, while `"name_" #T` inside a macro still can.
  const code = stripComments(source).replace(/"(?:[^"\\\n]|\\.)*"/g, (s) => `"${" ".repeat(s.length - 2)}"`);
  const re = /\[\[\s*host_name\s*\([^\]\n]*?\)\s*\]\]/g;
  let out = source;
  for (let m = re.exec(code); m; m = re.exec(code)) out = out.slice(0, m.index) + " ".repeat(m[0].length) + out.slice(m.index + m[0].length);
  return out;
}

/** A kernels/ source made valid C++ for a C++ backend (CPU, CUDA): lines and offsets kept. */
export function cppSource(source: string): string {
  return blankHostNames(rewriteThreadgroup(source));
}

function listSources(dir: string, exts: string[]): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const name of readdirSync(dir).sort()) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) out.push(...listSources(path, exts));
    else if (exts.some((e) => name.endsWith(e))) out.push(path);
  }
  return out;
}

/** One kernels/*.metal and the pipelines it defines. */
export interface KernelFile {
  /** Absolute path. */
  path: string;
  /** Relative to the repository root ("kernels/norm.metal"). */
  rel: string;
  /** C identifier derived from the file name ("norm"). */
  id: string;
  entries: KernelEntry[];
}

/** Every pipeline of kernels/, per file: what each backend's emitter starts from. */
export interface KernelTable {
  root: string;
  kernelsDir: string;
  /** Each kernels/*.metal, sorted by name (files without kernels included, with no entries). */
  files: KernelFile[];
  /** Every source a kernel file may include (.metal and .h under kernelsDir), sorted. */
  sources: string[];
}

/** Parses kernels/ into a KernelTable; throws KernelParseError naming file:line. */
export function parseKernelTable(root: string, kernelsDir = join(root, "kernels")): KernelTable {
  const files = [...collectKernels(root, kernelsDir)].map(([path, entries]) => ({ path, rel: relative(root, path), id: ident(path), entries }));
  return { root, kernelsDir, files, sources: listSources(kernelsDir, [".metal", ".h"]) };
}

/** Parses every kernel pipeline of the kernels/ directory (templates resolved). */
export function collectKernels(root: string, kernelsDir = join(root, "kernels")): Map<string, KernelEntry[]> {
  const all = listSources(kernelsDir, [".metal", ".h"]);
  const perFile = new Map<string, Found[]>();
  const templates = new Map<string, { params: string[]; where: string; maxThreads: number | null; waitsForInputs: boolean }>();
  for (const path of all) {
    const rel = relative(root, path);
    const found = findKernels(readFileSync(path, "utf8"), rel);
    perFile.set(path, found);
    for (const f of found) {
      if (f.kind !== "template") continue;
      const prev = templates.get(f.name);
      if (prev && prev.params.join() !== f.params!.join())
        throw new KernelParseError(`${rel}:${f.line}: template kernel ${f.name} is also defined at ${prev.where}`);
      templates.set(f.name, { params: f.params!, where: `${rel}:${f.line}`, maxThreads: f.maxThreads, waitsForInputs: f.waitsForInputs });
    }
  }
  const byFile = new Map<string, KernelEntry[]>();
  const seen = new Map<string, string>();
  for (const path of all) {
    const rel = relative(root, path);
    const isMetal = path.endsWith(".metal") && dirname(path) === kernelsDir;
    const entries: KernelEntry[] = [];
    for (const f of perFile.get(path)!) {
      const where = `${rel}:${f.line}`;
      if (f.kind === "template" || f.kind === "declaration") continue;
      if (!isMetal)
        throw new KernelParseError(`${where}: kernel ${f.name}: define and instantiate kernels in kernels/*.metal, not in headers`);
      let params = f.params;
      let maxThreads = f.maxThreads;
      let waitsForInputs = f.waitsForInputs;
      if (f.kind === "instantiation" && !params) {
        const t = templates.get(f.name);
        if (!t) throw new KernelParseError(`${where}: instantiation of ${f.name}, but no template kernel ${f.name} is defined`);
        params = t.params;
        maxThreads ??= t.maxThreads;
        waitsForInputs = t.waitsForInputs;
      }
      const name = f.hostName ?? f.name;
      if (!/^[A-Za-z_]\w*$/.test(name)) throw new KernelParseError(`${where}: kernel name "${name}" is not an identifier`);
      const other = seen.get(name);
      if (other) throw new KernelParseError(`${where}: kernel name ${name} is already used at ${other}`);
      seen.set(name, where);
      const bindings = params!.map((p, i) => parseParam(p, i, name, where));
      const indices = bindings.flatMap((b) => (b.kind === "buffer" ? [b.index] : []));
      const dup = indices.find((x, i) => indices.indexOf(x) !== i);
      if (dup !== undefined) throw new KernelParseError(`${where}: kernel ${name} declares [[buffer(${dup})]] twice`);
      entries.push({ name, fn: f.name + (f.templateArgs ?? ""), params: bindings, where, maxThreads, waitsForInputs });
    }
    if (isMetal) byFile.set(path, entries);
  }
  return byFile;
}

function ident(path: string): string {
  return basename(path, ".metal").replace(/\W/g, "_");
}

/** Writes `text` to `path` unless it already holds it (unchanged files keep their mtime). */
export function writeIfChanged(path: string, text: string): boolean {
  if (existsSync(path) && readFileSync(path, "utf8") === text) return false;
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, text);
  return true;
}

/** The binder type of one parameter in a generated table (ck::Buf<i> or a builtin's binder). */
export function binderOf(p: ParamBinding): string {
  return p.kind === "buffer" ? `ck::Buf<${p.index}>` : `ck::${p.attr}`;
}

/** What differs between backends in the generated per-file tables: the rest is emitTables'. */
export interface TableEmitter {
  /** The generator named in each file's first line ("metal-shim/gen-bindings.ts"). */
  generator: string;
  /** Extension of the generated files (".cpp", ".cu"). */
  ext: string;
  /** Lines before the kernel file's namespace (includes, usings). */
  prelude: string[];
  /** Lines included inside the namespace before the kernel file. */
  inNamespace?: string[];
  /** Lines after the namespace (e.g. the CUDA entry points), given the namespace. */
  after?: (ns: string, entries: KernelEntry[]) => string[];
  /** One row of the file's KernelInfo table. */
  row: (ns: string, k: KernelEntry) => string;
}

/**
 * Writes one table per .metal (genDir/<file><ext>) and genDir/registry<ext> listing them,
 * the same for every backend. Returns the files to compile and the kernel count.
 */
export function emitTables(table: KernelTable, genDir: string, e: TableEmitter): { sources: string[]; kernels: number } {
  const sources: string[] = [];
  const tables: string[] = [];
  let kernels = 0;
  for (const { id, rel, entries } of table.files) {
    if (entries.length === 0) continue;
    const ns = `ckk_${id}`;
    const after = e.after ? [...e.after(ns, entries), ``] : [];
    const text = [
      `// Generated by ${e.generator} from ${rel}. Do not edit.`,
      ...e.prelude,
      ``,
      `namespace ${ns} {`,
      ...(e.inNamespace ?? []),
      `#include "${rel}"`,
      `}  // namespace ${ns}`,
      ``,
      ...after,
      `extern const ck::KernelInfo ck_kernels_${id}[];`,
      `const ck::KernelInfo ck_kernels_${id}[] = {`,
      ...entries.map((k) => e.row(ns, k)),
      `};`,
      `extern const uint32_t ck_kernels_${id}_count;`,
      `const uint32_t ck_kernels_${id}_count = ${entries.length};`,
      ``,
    ].join("\n");
    const out = join(genDir, `${id}${e.ext}`);
    writeIfChanged(out, text);
    sources.push(out);
    tables.push(id);
    kernels += entries.length;
  }
  const registry = [
    `// Generated by ${e.generator}. Do not edit.`,
    `#include "abi.h"`,
    ``,
    ...tables.flatMap((id) => [
      `extern const ck::KernelInfo ck_kernels_${id}[];`,
      `extern const uint32_t ck_kernels_${id}_count;`,
    ]),
    ``,
    `namespace ck {`,
    `const KernelTable kAllTables[] = {`,
    ...(tables.length ? tables.map((id) => `    {ck_kernels_${id}, ck_kernels_${id}_count},`) : [`    {nullptr, 0},`]),
    `};`,
    `const uint32_t kAllTablesCount = ${tables.length};`,
    `}  // namespace ck`,
    ``,
  ].join("\n");
  const registryPath = join(genDir, `registry${e.ext}`);
  writeIfChanged(registryPath, registry);
  sources.push(registryPath);
  return { sources, kernels };
}

/**
 * Writes every kernels/ source through `rewrite` to genDir/kernels/ (with a #line so
 * diagnostics name the original file). Unchanged files keep their mtime.
 */
export function writeKernelSources(table: KernelTable, genDir: string, rewrite: (source: string) => string): void {
  for (const path of table.sources) {
    const rel = relative(table.root, path);
    writeIfChanged(join(genDir, rel), `#line 1 "${rel}"\n` + rewrite(readFileSync(path, "utf8")));
  }
}

/** The CPU backend's sources: kernels/ through cppSource(), as C++. */
export function writeCppSources(table: KernelTable, genDir: string): void {
  writeKernelSources(table, genDir, cppSource);
}

/**
 * The CPU backend's emitter: the C++ sources (writeCppSources), one table per
 * .metal (genDir/<file>.cpp) and genDir/registry.cpp. Unchanged files keep
 * their mtime. Returns the C++ files to compile.
 */
export function emitCpu(table: KernelTable, genDir: string): { sources: string[]; kernels: number } {
  writeCppSources(table, genDir);
  return emitTables(table, genDir, {
    generator: "metal-shim/gen-bindings.ts",
    ext: ".cpp",
    prelude: [`#include <metal_stdlib>`, `#include "bind.h"`],
    row: (ns, k) =>
      `    ck::kernel_info<&${ns}::${k.fn}${k.params.map((p) => ", " + binderOf(p)).join("")}>(\n` +
      `        ${JSON.stringify(k.name)}, ${JSON.stringify(k.where)}, ${k.maxThreads ?? "ck::kMaxThreads"}),`,
  });
}

/** Parses kernels/ and runs the CPU emitter (what metal-shim/build.ts calls). */
export function generate(root: string, genDir: string): { sources: string[]; kernels: number } {
  return emitCpu(parseKernelTable(root), genDir);
}

if (import.meta.main) {
  const root = join(import.meta.dir, "..");
  try {
    for (const { rel, entries } of parseKernelTable(root).files) {
      for (const k of entries) {
        const params = k.params.map((p) => (p.kind === "buffer" ? `buffer(${p.index})` : p.attr)).join(", ");
        console.log(`${k.name.padEnd(32)} ${rel}  ${params}`);
      }
    }
  } catch (e) {
    if (!(e instanceof KernelParseError)) throw e;
    console.error(e.message);
    process.exit(1);
  }
}
