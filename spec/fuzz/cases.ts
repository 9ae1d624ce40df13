// The fuzz suite's corruptions of a model directory (spec/fuzz/fuzz.test.ts): each case is
// drawn from a seed, so a failing case is reproduced by its seed and index alone.
import { appendFileSync, closeSync, mkdirSync, openSync, readFileSync, readSync, rmSync, statSync, symlinkSync, truncateSync, writeFileSync, writeSync } from "node:fs";
import { join } from "node:path";
import { checksum } from "../../lib/model/checksum.ts";
import { sealManifest } from "../../lib/model/manifest.ts";

export const FILES = ["cherenkov.json", "dense.bin", "experts.bin", "ple.bin", "tokenizer.json", "tokenizer_config.json"] as const;

/** xorshift32: small, seeded, the same everywhere. */
export class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = (seed >>> 0) || 0x9e3779b9;
  }
  next(): number {
    let x = this.s;
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    this.s = x >>> 0;
    return this.s / 2 ** 32;
  }
  int(n: number): number {
    return Math.floor(this.next() * n);
  }
  pick<T>(xs: readonly T[]): T {
    return xs[this.int(xs.length)]!;
  }
}

/** Values no config or index number may take (each must be refused by name). */
const HOSTILE_INT = [-1, 1.5, 2 ** 31, 1e9, 2 ** 53 + 2, "7", null, [], {}];
const HOSTILE_FLOAT = [-1, 0, 1e300, "x", null, true];
const REAL_FIELDS = new Set(["rope_theta", "partial_rotary_factor", "rms_norm_eps", "eps"]);
const HOSTILE_TEMPLATES = [
  "{% for i in range(1000000000) %}x{% endfor %}",
  "{% for i in range(60000) %}{% for j in range(60000) %}xxxxxxxx{% endfor %}{% endfor %}",
  "{% for m in messages %}",
  "{{ raise_exception('boom') }}",
  "{% set x = 'a' %}{% for i in range(60000) %}{% set x = x ~ x %}{% endfor %}{{ x }}",
];

/** Paths of every number or boolean under `o`. */
function leaves(o: unknown, path: (string | number)[] = [], out: (string | number)[][] = []): (string | number)[][] {
  if (typeof o === "number" || typeof o === "boolean") out.push(path);
  else if (Array.isArray(o)) o.forEach((v, i) => leaves(v, [...path, i], out));
  else if (o && typeof o === "object") for (const [k, v] of Object.entries(o)) leaves(v, [...path, k], out);
  return out;
}

function setAt(o: any, path: (string | number)[], v: unknown) {
  for (const k of path.slice(0, -1)) o = o[k];
  o[path[path.length - 1]!] = v;
}

export interface FuzzCase {
  index: number;
  /** What was done, e.g. "flip byte 1234 of experts.bin". */
  what: string;
  apply(dir: string): void;
}

/** Records the tokenizer files' current checksums in cherenkov.json and seals it (a deliberate edit). */
export function resealFiles(dir: string): void {
  const m = readManifest(dir);
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) m.files[f] = checksum(readFileSync(join(dir, f)));
  writeManifest(dir, m);
}

const readManifest = (dir: string) => JSON.parse(readFileSync(join(dir, "cherenkov.json"), "utf8"));
const writeManifest = (dir: string, m: any) => writeFileSync(join(dir, "cherenkov.json"), JSON.stringify(sealManifest(m)));

/** Case `index` of the suite with `seed`; `sizes` are the clean files' sizes. */
export function fuzzCase(seed: number, index: number, sizes: Record<string, number>, manifest: any): FuzzCase {
  const r = new Rng(seed * 7919 + index * 104729 + 1);
  const file = r.pick(FILES);
  const size = sizes[file]!;
  const kinds = ["flip", "flip", "flip", "truncate", "zero", "extend", "config", "config", "config", "index", "index", "index", "tokenizer", "template", "replace"] as const;
  const kind = r.pick(kinds);
  const mk = (what: string, apply: (dir: string) => void): FuzzCase => ({ index, what, apply });
  switch (kind) {
    case "flip": {
      const at = r.int(size);
      const bit = 1 << r.int(8);
      return mk(`flip bit ${bit} of byte ${at} of ${file}`, (dir) => {
        const fd = openSync(join(dir, file), "r+");
        const b = new Uint8Array(1);
        readSync(fd, b, 0, 1, at);
        writeSync(fd, Uint8Array.of(b[0]! ^ bit), 0, 1, at);
        closeSync(fd);
      });
    }
    case "truncate": {
      const to = r.int(size);
      return mk(`truncate ${file} to ${to} bytes`, (dir) => truncateSync(join(dir, file), to));
    }
    case "zero": {
      const at = r.int(size);
      const n = 1 + r.int(Math.min(65536, size - at));
      return mk(`zero ${n} bytes of ${file} at ${at}`, (dir) => {
        const fd = openSync(join(dir, file), "r+");
        writeSync(fd, new Uint8Array(n), 0, n, at);
        closeSync(fd);
      });
    }
    case "extend": {
      const n = 1 + r.int(20000);
      return mk(`append ${n} bytes to ${file}`, (dir) => appendFileSync(join(dir, file), new Uint8Array(n).fill(0x5a)));
    }
    case "config":
    case "index": {
      const all = leaves(manifest).filter((p) => (kind === "config" ? p[0] === "config" : p[0] !== "config" && p[0] !== "writer"));
      const path = r.pick(all);
      let cur: any = manifest;
      for (const k of path) cur = cur[k];
      // Real-valued fields get values outside their range (1.5 is a valid rope_theta).
      const real = typeof cur === "number" && (!Number.isInteger(cur) || REAL_FIELDS.has(String(path[path.length - 1])));
      const hostile = typeof cur === "boolean" ? r.pick(["yes", 1, null]) : real ? r.pick(HOSTILE_FLOAT) : r.pick(HOSTILE_INT);
      return mk(`set ${path.join(".")} = ${JSON.stringify(hostile)} (sealed)`, (dir) => {
        const m = readManifest(dir);
        setAt(m, path, hostile);
        writeManifest(dir, m);
      });
    }
    case "tokenizer": {
      const id = r.pick([2 ** 31, -1, 1.5, 1e9, "3", null]);
      const target = r.int(2);
      return mk(`set (and re-record) a tokenizer.json ${target ? "vocab" : "added token"} id to ${JSON.stringify(id)}`, (dir) => {
        const p = join(dir, "tokenizer.json");
        const t = JSON.parse(readFileSync(p, "utf8"));
        if (target) {
          const keys = Object.keys(t.model.vocab);
          t.model.vocab[keys[r.int(keys.length)]!] = id;
        } else t.added_tokens[r.int(t.added_tokens.length)].id = id;
        writeFileSync(p, JSON.stringify(t));
        resealFiles(dir);
      });
    }
    case "template": {
      const tpl = r.pick(HOSTILE_TEMPLATES);
      return mk(`chat_template (re-recorded) = ${JSON.stringify(tpl.slice(0, 40))}`, (dir) => {
        const p = join(dir, "tokenizer_config.json");
        const c = JSON.parse(readFileSync(p, "utf8"));
        c.chat_template = tpl;
        writeFileSync(p, JSON.stringify(c));
        resealFiles(dir);
      });
    }
    case "replace": {
      const how = r.pick(["/dev/zero", "directory", "missing", "fifo"] as const);
      return mk(`replace ${file} with ${how}`, (dir) => {
        const p = join(dir, file);
        rmSync(p, { force: true });
        if (how === "/dev/zero") symlinkSync("/dev/zero", p);
        else if (how === "directory") mkdirSync(p);
        else if (how === "fifo") Bun.spawnSync(["mkfifo", p]);
      });
    }
  }
}

export function fileSizes(dir: string): Record<string, number> {
  return Object.fromEntries(FILES.map((f) => [f, statSync(join(dir, f)).size]));
}
