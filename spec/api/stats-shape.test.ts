// model.stats() is typed all the way down: the object the reference and the engine return has
// exactly the keys (and value kinds) of the exported types, no more, no fewer. The expected
// shapes below are typed from those types (Shape<T> demands every key and rejects extras at
// compile time), so a field added to a type without the sample fails `bun run typecheck`, and a
// field added to or dropped from the runtime object without the type fails this test.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { Model } from "../../lib/index.ts";
import type {
  EngineBackendStats, LatencySummary, ModelStats, ReferenceBackendStats,
} from "../../lib/index.ts";
import { goldenCases } from "../golden/cases.ts";
import { buildGoldenModel } from "../golden/golden.ts";
import { tempDir } from "../engine-step/helpers.ts";
import { BACKEND } from "../selected-backend.ts";

// ---- shapes typed from the public types ----
type Shape<T> = { [K in keyof T]-?: FieldShape<T[K]> };
type FieldShape<V> = null extends V ? { $orNull: ValueShape<NonNullable<V>> } : ValueShape<V>;
type ValueShape<V> = [V] extends [number] ? "number"
  : [V] extends [string] ? "string"
  : [V] extends [boolean] ? "boolean"
  : [V] extends [readonly (infer E)[]] ? { $arrayOf: FieldShape<E> }
  : string extends keyof V ? { $recordOf: FieldShape<V extends Record<string, infer E> ? E : never> }
  : Shape<V>;

const latency: Shape<LatencySummary> = {
  count: "number", meanUs: "number", minUs: "number", maxUs: "number", p50Us: "number", p90Us: "number", p99Us: "number",
};

const modelShape: Shape<Omit<ModelStats, "engine">> = {
  backend: "string", generations: "number", promptTokens: "number", completionTokens: "number",
  prefillMs: "number", decodeMs: "number", drafts: { proposed: "number", accepted: "number" },
};

const referenceShape: Shape<ReferenceBackendStats> = { backend: "string" };

const engineShape: Shape<EngineBackendStats> = {
  backend: "string",
  pool: {
    backing: "string", capacity: "number", resident: "number", records: "number", recordBytes: "number",
    hits: "number", misses: "number", hitsWhileLoading: "number", evictions: "number", hitRate: "number",
    perLayer: { hits: { $arrayOf: "number" }, misses: { $arrayOf: "number" } },
  },
  io: {
    $orNull: {
      mode: "string", fallbackReason: { $orNull: "string" }, maxInFlight: "number", threadPool: "number",
      requestedBytes: "number", completedBytes: "number", reads: "number", failed: "number", cancelled: "number",
      cancelledBytes: "number", inFlight: "number", queued: "number",
      requestedByPriority: { demand: "number", lookahead: "number", ngram: "number" },
      latency, service: latency,
    },
  },
  lookahead: {
    predictions: "number", used: "number", wasted: "number", wastedBytes: "number", cancelled: "number",
    alreadyResident: "number", skipped: "number", accuracy: "number",
  },
  activity: {
    layers: "number", perLayer: "number", counts: { $arrayOf: { $arrayOf: "number" } },
    weights: { $arrayOf: { $arrayOf: "number" } }, rows: { $arrayOf: "number" }, rolledBackRows: "number",
  },
  memory: {
    workingSetLimit: "number", fixedBytes: "number", fixed: { $recordOf: "number" }, hostReserveBytes: "number",
    backing: { $orNull: "string" }, poolSlots: "number", recordBytes: "number", poolBytes: "number",
    poolReason: "string", mapped: { $recordOf: "number" }, mappedBytes: "number", rss: "number",
    heapUsed: "number", systemTotal: "number", systemFree: "number",
  },
  phases: { $recordOf: { count: "number", totalMs: "number", meanMs: "number", maxMs: "number" } },
  handshake: { all: latency, perLayer: { $arrayOf: latency } },
  resident: {
    preload: "string", preloaded: "boolean", preloadRecords: "number", preloadMs: "number", layers: "number",
    residentLayers: "number", fullyResident: "boolean", unavailable: { $orNull: "string" },
  },
  setup: {
    device: "string", rows: "number", prefillRows: "number", maxDrafts: "number", maxContext: "number",
    layersRun: "number", lookahead: "boolean", notes: { $arrayOf: "string" }, sequences: "number",
    trace: { $orNull: { path: "string", steps: "number" } },
  },
};

// ---- the runtime check ----
const isPlain = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** Every way `value` differs from `shape`, one line each naming the path ("" when none). */
function mismatches(value: unknown, shape: unknown, path: string): string[] {
  if (typeof shape === "string") return typeof value === shape ? [] : [`${path}: ${typeof value}, typed ${shape}`];
  const s = shape as Record<string, unknown>;
  if ("$orNull" in s) return value === null ? [] : mismatches(value, s.$orNull, path);
  if ("$arrayOf" in s) {
    if (!Array.isArray(value)) return [`${path}: not an array`];
    return value.flatMap((v, i) => mismatches(v, s.$arrayOf, `${path}[${i}]`));
  }
  if (!isPlain(value)) return [`${path}: ${value === null ? "null" : typeof value}, typed an object`];
  if ("$recordOf" in s) return Object.entries(value).flatMap(([k, v]) => mismatches(v, s.$recordOf, `${path}.${k}`));
  const out: string[] = [];
  for (const k of Object.keys(s)) if (!(k in value)) out.push(`${path}.${k}: typed but missing`);
  for (const k of Object.keys(value)) if (!(k in s)) out.push(`${path}.${k}: returned but not in the type`);
  for (const k of Object.keys(s)) if (k in value) out.push(...mismatches(value[k], s[k], `${path}.${k}`));
  return out;
}

function statsMismatches(stats: ModelStats): string[] {
  const { engine, ...rest } = stats;
  const engineShapeOf = engine.backend === "reference" ? referenceShape : engineShape;
  return [...mismatches(rest, modelShape, "stats"), ...mismatches(engine, engineShapeOf, "stats.engine")];
}

// ---- the models ----
const c = goldenCases.find((x) => x.name === "tiny-all-s2")!;
let dir: string;
const tmp = tempDir("stats-shape");
beforeAll(async () => {
  dir = await buildGoldenModel(c);
});
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
  tmp.remove();
});

describe("stats() matches its exported types exactly", () => {
  test("the checker itself catches a missing key, an extra key and a wrong kind", () => {
    const good = { backend: "reference", generations: 0, promptTokens: 0, completionTokens: 0, prefillMs: 0, decodeMs: 0, drafts: { proposed: 0, accepted: 0 }, engine: { backend: "reference" } } as ModelStats;
    expect(statsMismatches(good)).toEqual([]);
    const { decodeMs: _, ...missing } = good;
    expect(statsMismatches(missing as ModelStats)).toEqual(["stats.decodeMs: typed but missing"]);
    expect(statsMismatches({ ...good, engine: { backend: "reference", pool: {} } } as unknown as ModelStats)).toEqual(["stats.engine.pool: returned but not in the type"]);
    expect(statsMismatches({ ...good, drafts: { proposed: "1", accepted: 0 } } as unknown as ModelStats)).toEqual(["stats.drafts.proposed: string, typed number"]);
  });

  test("reference backend", async () => {
    await using model = await Model.load(dir, { backend: "reference" });
    await model.generate(c.prompt, { maxTokens: 3 });
    const stats = model.stats();
    expect(stats.engine.backend).toBe("reference");
    expect(statsMismatches(stats)).toEqual([]);
  });

  for (const backing of ["wired", "mapped"] as const) {
    test(`engine (${BACKEND}, ${backing} backing, with a routing trace)`, async () => {
      await using model = await Model.load(dir, { backend: BACKEND, engine: { backing, trace: join(tmp.dir, `${backing}.jsonl`) } });
      await model.generate(c.prompt, { maxTokens: 3 });
      const stats = model.stats();
      expect(stats.engine.backend).toBe(BACKEND);
      if (stats.engine.backend === "reference") throw new Error("unreachable");
      // Both nullable branches and the records are really exercised, not only typed.
      expect(stats.engine.io === null).toBe(backing === "mapped");
      expect(stats.engine.setup.trace).not.toBeNull();
      expect(Object.keys(stats.engine.phases).length).toBeGreaterThan(0);
      expect(stats.engine.handshake.perLayer.length).toBeGreaterThan(0);
      expect(statsMismatches(stats)).toEqual([]);
      // The whole object is plain data: JSON round-trips it exactly.
      expect(JSON.parse(JSON.stringify(stats))).toEqual(stats);
    });
  }
});
