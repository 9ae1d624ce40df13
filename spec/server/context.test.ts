// The request context: what the operator asks for, else what the model declares, never more
// than the backend holds.
import { describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Model } from "../../lib/index.ts";
import { backendContextLimit, DEFAULT_CONTEXT, declaredContextLength, resolveContextLength } from "../../lib/server/context.ts";

/** Just what the context rules read of a model: its directory and its stats. */
function fakeModel(dir: string, engine: Record<string, unknown>): Model {
  return { dir, backendName: "cpu", stats: () => ({ engine }) } as unknown as Model;
}

describe("context length", () => {
  const dir = mkdtempSync(join(tmpdir(), "cherenkov-ctx-"));
  const declare = (v: unknown) => writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ model_max_length: v }));

  test("the model directory's model_max_length, unless it is Hugging Face's 'unknown'", () => {
    declare(2048);
    expect(declaredContextLength(dir)).toBe(2048);
    declare(1e30);
    expect(declaredContextLength(dir)).toBeNull();
    expect(declaredContextLength(join(dir, "missing"))).toBeNull();
    expect(resolveContextLength(fakeModel(dir, {}), undefined)).toBe(DEFAULT_CONTEXT);
  });

  test("the engine's maxContext caps the declared length, and a larger request is refused", () => {
    declare(32768);
    const engine = fakeModel(dir, { engine: { maxContext: 1024 } });
    expect(backendContextLimit(engine)).toBe(1024);
    expect(resolveContextLength(engine, undefined)).toBe(1024);
    expect(resolveContextLength(engine, 512)).toBe(512);
    expect(() => resolveContextLength(engine, 2048)).toThrow("maxContext: 2048");
    expect(resolveContextLength(fakeModel(dir, { backend: "reference" }), undefined)).toBe(32768);
    rmSync(dir, { recursive: true, force: true });
  });
});
