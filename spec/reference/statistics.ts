// Chi-square goodness of fit for the sampling tests (spec/reference/sampling.test.ts,
// spec/kernels/sampling.test.ts).

/** Chi-square critical value with `df` degrees of freedom at upper-tail probability 1e-6. */
export function chiSquareCritical(df: number): number {
  const z = 4.7534; // standard normal upper 1e-6 quantile
  const a = 2 / (9 * df);
  return df * (1 - a + z * Math.sqrt(a)) ** 3;
}

/**
 * Pearson's statistic of counts against probabilities. Cells with p = 0 must have no counts;
 * cells expecting fewer than 5 are pooled into one (the usual validity rule).
 */
export function chiSquare(counts: ArrayLike<number>, p: ArrayLike<number>, n: number): { stat: number; df: number } {
  let stat = 0;
  let cells = 0;
  let poolCount = 0;
  let poolExpected = 0;
  for (let i = 0; i < p.length; i++) {
    if (p[i]! === 0) {
      if (counts[i]! !== 0) throw new Error(`token ${i} drawn ${counts[i]} times but its probability is 0`);
      continue;
    }
    const e = n * p[i]!;
    if (e < 5) {
      poolCount += counts[i]!;
      poolExpected += e;
      continue;
    }
    stat += (counts[i]! - e) ** 2 / e;
    cells++;
  }
  if (poolExpected > 0) {
    stat += (poolCount - poolExpected) ** 2 / poolExpected;
    cells++;
  }
  return { stat, df: cells - 1 };
}
