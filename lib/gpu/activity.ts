/**
 * Cumulative routed-expert activity per (layer, expert). Every routed row counts when it is
 * routed: verification and draft rows count even when the step is later rolled back (they
 * cost reads and compute all the same); {@link ExpertActivity.noteRolledBack} only keeps a
 * separate tally of how many rows that was.
 */

/** JSON-serialisable activity. */
export interface ActivitySnapshot {
  layers: number;
  perLayer: number;
  /** counts[layer][e]: rows routed to expert e of the layer. */
  counts: number[][];
  /** weights[layer][e]: sum of the routing weights those rows gave it. */
  weights: number[][];
  /** Rows routed per layer (each row counts once per layer). */
  rows: number[];
  /** Rows later rolled back (rejected drafts), included in the counts above. */
  rolledBackRows: number;
}

export class ExpertActivity {
  private readonly counts: Float64Array;
  private readonly weightSums: Float64Array;
  private readonly rowsPerLayer: Float64Array;
  private rolledBack = 0;

  constructor(
    readonly layers: number,
    readonly perLayer: number,
  ) {
    if (!Number.isInteger(layers) || layers < 1 || !Number.isInteger(perLayer) || perLayer < 1)
      throw new Error(`ExpertActivity: layers ${layers} and perLayer ${perLayer} must be positive integers`);
    this.counts = new Float64Array(layers * perLayer);
    this.weightSums = new Float64Array(layers * perLayer);
    this.rowsPerLayer = new Float64Array(layers);
  }

  /**
   * Records one layer of a step: `rows` rows, `experts` = their routed ids row-major
   * ([rows][topK] flattened, as the GPU's router writes them), `weights` (optional) alike.
   */
  record(layer: number, rows: number, experts: ArrayLike<number>, weights?: ArrayLike<number>): void {
    if (!Number.isInteger(layer) || layer < 0 || layer >= this.layers) throw new Error(`ExpertActivity.record: layer ${layer} is not in 0..${this.layers - 1}`);
    if (weights && weights.length !== experts.length)
      throw new Error(`ExpertActivity.record: layer ${layer}: ${experts.length} expert ids but ${weights.length} weights`);
    const base = layer * this.perLayer;
    for (let i = 0; i < experts.length; i++) {
      const e = experts[i]!;
      if (!Number.isInteger(e) || e < 0 || e >= this.perLayer)
        throw new Error(`ExpertActivity.record: layer ${layer}: expert id ${e} is not in 0..${this.perLayer - 1}`);
      this.counts[base + e]!++;
      if (weights) this.weightSums[base + e]! += weights[i]!;
    }
    this.rowsPerLayer[layer]! += rows;
  }

  /** Records a whole step as the reference's RouteStep lays it out: [layer][row][k]. */
  recordStep(step: { experts: number[][][]; weights?: number[][][] }): void {
    step.experts.forEach((rows, l) => {
      this.record(l, rows.length, rows.flat(), step.weights?.[l]?.flat());
    });
  }

  /** Notes that `rows` rows of an already recorded step were rolled back (they stay counted). */
  noteRolledBack(rows: number): void {
    this.rolledBack += rows;
  }

  /** Rows routed to expert e of `layer` so far. */
  count(layer: number, e: number): number {
    return this.counts[layer * this.perLayer + e]!;
  }

  snapshot(): ActivitySnapshot {
    const rowsOf = (a: Float64Array) => Array.from({ length: this.layers }, (_, l) => Array.from(a.subarray(l * this.perLayer, (l + 1) * this.perLayer)));
    return {
      layers: this.layers,
      perLayer: this.perLayer,
      counts: rowsOf(this.counts),
      weights: rowsOf(this.weightSums),
      rows: Array.from(this.rowsPerLayer),
      rolledBackRows: this.rolledBack,
    };
  }

  reset(): void {
    this.counts.fill(0);
    this.weightSums.fill(0);
    this.rowsPerLayer.fill(0);
    this.rolledBack = 0;
  }
}
