/**
 * `bun run bench:prefill --simulate` (spec/bench/prefill.ts): expert bytes read per prompt token (prefill in chunks) against
 * bytes per generated token (decode), on the expert layout of a real-size preset (default
 * 30b-a3b-shape: 48 layers x 128 experts, top-8, 2,949,120-byte q4 records), through the
 * engine's own pool (lib/gpu/residency.ts, default policy, decisions only: no file, no IO).
 *
 * A "short" variant of the model: only the routing is simulated, since expert bytes depend
 * only on which records each step's rows route to and on the pool. Every row of a step routes
 * each layer to top-k distinct experts drawn from that layer's popularity (Zipf exponent
 * --zipf over a per-layer random ranking; 0 = uniform), independently per row: no temporal
 * locality, so decode hits come from the pool's size and the popularity skew alone (real
 * routing, which repeats experts on consecutive tokens, makes decode read less and the ratio
 * larger). Per step and layer the engine acquires the union of its rows' experts, as
 * lib/gpu/step.ts does; a prefill chunk is --chunk rows (cut to slots / top-k rows only when the
 * pool is smaller than one layer, as the engine does).
 * The prompt (--prompt tokens) is prefilled from an empty pool, then --decode tokens are
 * generated one per step.
 *
 * Options: --preset, --chunk 2048, --prompt 8192, --decode 512, --pool 10,25,50 (percent of
 * the records), --zipf 0,1, --seed 1, --json.
 */
import { presetConfig, type PresetName } from "../../lib/convert/presets.ts";
import { createExpertPool, DEFAULT_POOL_POLICY } from "../../lib/gpu/residency.ts";
import { planExperts } from "../../lib/model/writer.ts";

/** The simulation's options (strings as the command line gives them). */
export interface SimulateOptions {
  preset: string;
  chunk: string;
  prompt: string;
  decode: string;
  pool: string;
  zipf: string;
  seed: string;
  json: boolean;
}

export const SIMULATE_DEFAULTS: Omit<SimulateOptions, "json"> = { preset: "30b-a3b-shape", chunk: "2048", prompt: "8192", decode: "512", pool: "10,25,50", zipf: "0,1", seed: "1" };

/** Runs the simulation and prints its table (or one JSON object). */
export async function simulatePrefill(opts: SimulateOptions): Promise<void> {
  const config = presetConfig(opts.preset as PresetName);
  const layout = planExperts(config, "q4");
  const trunk = config.num_layers;
  const perLayer = layout.per_layer;
  const topK = config.moe.top_k;
  const stride = layout.stride;

  /** xorshift32 in [0, 1). */
  function rng(seed: number): () => number {
    let x = seed >>> 0 || 1;
    return () => {
      x ^= x << 13;
      x >>>= 0;
      x ^= x >>> 17;
      x ^= x << 5;
      x >>>= 0;
      return x / 2 ** 32;
    };
  }

  /** Per layer: each expert's log-popularity, Zipf(s) over a random ranking. */
  function popularity(s: number, rand: () => number): Float64Array[] {
    return Array.from({ length: trunk }, () => {
      const rank = Array.from({ length: perLayer }, (_, i) => i).sort(() => rand() - 0.5);
      const logw = new Float64Array(perLayer);
      rank.forEach((e, r) => (logw[e] = -s * Math.log(r + 1)));
      return logw;
    });
  }

  /** top-k distinct experts, drawn without replacement by weight (Gumbel top-k, kept in a short sorted list). */
  function route(logw: Float64Array, rand: () => number, out: number[]): void {
    const best: number[] = [];
    const keys: number[] = [];
    for (let e = 0; e < perLayer; e++) {
      const key = logw[e]! - Math.log(-Math.log(rand() + 1e-12));
      if (best.length === topK && key <= keys[topK - 1]!) continue;
      let i = Math.min(best.length, topK - 1);
      while (i > 0 && keys[i - 1]! < key) i--;
      best.splice(i, 0, e);
      keys.splice(i, 0, key);
      if (best.length > topK) {
        best.pop();
        keys.pop();
      }
    }
    for (const e of best) out.push(e);
  }

  interface Result {
    poolPercent: number;
    slots: number;
    zipf: number;
    chunkRows: number;
    prefillRecordsPerToken: number;
    decodeRecordsPerToken: number;
    prefillBytesPerToken: number;
    decodeBytesPerToken: number;
    ratio: number;
    decodeHitRate: number;
  }

  async function run(poolPercent: number, zipf: number): Promise<Result> {
    const rand = rng(Number(opts.seed) * 7919 + poolPercent * 31 + zipf * 1000);
    const pop = popularity(zipf, rand);
    const slots = Math.round((poolPercent / 100) * trunk * perLayer);
    const model = { paths: { experts: "(simulation: no file)" }, expertLayout: { stride, layers: trunk, perLayer } };
    const pool = createExpertPool({ backing: "mapped", model, capacity: slots, policy: DEFAULT_POOL_POLICY });
    // The engine's cut (lib/gpu/load.ts): only a pool smaller than one layer limits a step's rows.
    const chunkRows = slots < perLayer ? Math.min(Number(opts.chunk), Math.max(1, Math.floor(slots / topK))) : Number(opts.chunk);
    const promptTokens = Number(opts.prompt);
    const step = (rows: number) => {
      for (let l = 0; l < trunk; l++) {
        const ids: number[] = [];
        for (let r = 0; r < rows; r++) route(pop[l]!, rand, ids);
        pool.acquire(l, ids);
        pool.release(l);
      }
    };
    for (let done = 0; done < promptTokens; done += chunkRows) step(Math.min(chunkRows, promptTokens - done));
    const afterPrefill = pool.poolStats();
    const decodeTokens = Number(opts.decode);
    for (let t = 0; t < decodeTokens; t++) step(1);
    const end = pool.poolStats();
    await pool.close();
    const prefillRecords = afterPrefill.misses / promptTokens;
    const decodeMisses = end.misses - afterPrefill.misses;
    const decodeHits = end.hits - afterPrefill.hits;
    const decodeRecords = decodeMisses / decodeTokens;
    return {
      poolPercent,
      slots,
      zipf,
      chunkRows,
      prefillRecordsPerToken: prefillRecords,
      decodeRecordsPerToken: decodeRecords,
      prefillBytesPerToken: prefillRecords * stride,
      decodeBytesPerToken: decodeRecords * stride,
      ratio: prefillRecords / decodeRecords,
      decodeHitRate: decodeHits / (decodeHits + decodeMisses),
    };
  }

  const results: Result[] = [];
  for (const zipf of opts.zipf.split(",").map(Number)) for (const p of opts.pool.split(",").map(Number)) results.push(await run(p, zipf));
  if (opts.json) {
    console.log(JSON.stringify({ bench: "prefill", preset: opts.preset, layers: trunk, perLayer, topK, recordBytes: stride, chunk: Number(opts.chunk), prompt: Number(opts.prompt), decode: Number(opts.decode), policy: DEFAULT_POOL_POLICY, results }));
  } else {
    console.log(`bench:prefill  ${opts.preset}: ${trunk} layers x ${perLayer} experts, top-${topK}, ${stride} B records; pool policy ${DEFAULT_POOL_POLICY}`);
    console.log(`  prompt ${opts.prompt} tokens in chunks of ${opts.chunk} rows from an empty pool, then ${opts.decode} decode tokens; routing i.i.d. per row (Zipf popularity)\n`);
    console.log("  zipf  pool  chunk rows  prefill MB/prompt token  decode MB/token  decode hits  prefill/decode");
    for (const r of results)
      console.log(
        `  ${String(r.zipf).padStart(4)}  ${`${r.poolPercent}%`.padStart(4)}  ${String(r.chunkRows).padStart(10)}  ${(r.prefillBytesPerToken / 1e6).toFixed(2).padStart(23)}  ${(r.decodeBytesPerToken / 1e6).toFixed(1).padStart(15)}  ${(100 * r.decodeHitRate).toFixed(1).padStart(10)}%  1/${(1 / r.ratio).toFixed(0)}`,
      );
  }
}
