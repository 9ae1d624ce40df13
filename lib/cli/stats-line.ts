// `--stats`: the numbers people look at first, on one line (--stats=json prints everything).
import type { GenerationResult, ModelStats } from "../api/model.ts";

/** "48 tokens, 15.2 tokens/s (prefill 6 tokens in 0.41 s); pool hit rate 93.4%[; all experts resident]; IO 12.1 MB/s" */
export function statsLine(result: GenerationResult, stats: ModelStats): string {
  const t = result.timings;
  const parts = [
    `${result.usage.completionTokens} tokens, ${t.tokensPerSecond.toFixed(1)} tokens/s ` +
      `(prefill ${result.usage.promptTokens} tokens in ${(t.prefillMs / 1000).toFixed(2)} s)`,
  ];
  // The reference backend keeps no pool or IO counters.
  const engine = stats.engine.backend === "reference" ? null : stats.engine;
  if (engine) {
    const total = engine.pool.hits + engine.pool.misses;
    parts.push(`pool hit rate ${total > 0 ? ((100 * engine.pool.hits) / total).toFixed(1) : "-"}%`);
    if (engine.resident.fullyResident) parts.push("all experts resident");
  }
  // The load's preload is not the generation's IO.
  const bytes = engine?.io ? engine.io.completedBytes - engine.resident.preloadRecords * engine.pool.recordBytes : undefined;
  const seconds = (stats.prefillMs + stats.decodeMs) / 1000;
  if (typeof bytes === "number" && seconds > 0) parts.push(`IO ${(bytes / 1e6 / seconds).toFixed(1)} MB/s`);
  parts.push(`${stats.backend} backend`);
  return parts.join("; ");
}
