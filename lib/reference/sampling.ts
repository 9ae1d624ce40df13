// The sampling definition every backend follows (docs/sampling.md), written plainly: the
// oracle of kernels/sampling.metal. One row of logits z becomes a distribution p in a fixed
// order (penalties -> temperature -> top_k -> top_p -> min_p), and a token is drawn from p by
// inverse CDF in token-id order with a counter-based uniform u(seed, position, draw), so the
// same seed and the same logits give the same token on every backend. The penalty and
// temperature steps round to f32 after every operation, as the kernel does, so the filtered
// set is the kernel's exactly; the masses and the CDF walk are f64 here (f32 on the GPU).

/** The transform's parameters, validated and rounded to f32 (what the kernel receives). */
export interface SamplingParams {
  /** 0 = greedy (the distribution is one-hot on the argmax, ties to the lowest id). */
  temperature: number;
  /** Keep the k largest values (ties at the k-th value all kept); 0 = off. */
  topK: number;
  /** Keep the smallest top set whose mass reaches topP (ties kept); 1 = off. */
  topP: number;
  /** Keep tokens with p >= minP * p_max; 0 = off. */
  minP: number;
  /** z > 0 ? z / r : z * r for every token in the context; 1 = off. */
  repetitionPenalty: number;
  /** Subtracted once from every token generated so far in this generation; 0 = off. */
  presencePenalty: number;
  /** Subtracted per occurrence in the tokens generated so far; 0 = off. */
  frequencyPenalty: number;
}

/**
 * The sampling fields a caller may pass (GenerateOptions extends it; docs/sampling.md). Unset or
 * temperature 0: greedy, bit-exact as before. The transform runs in this order: penalties ->
 * temperature -> topK -> topP -> minP.
 */
export interface SamplingOptions {
  /** Softmax temperature, 0..100 (default 0 = greedy: the argmax, ties to the lowest id). */
  temperature?: number;
  /** Keep only the k most likely tokens (ties at the k-th all kept); 0 = off (default). */
  topK?: number;
  /** Nucleus: keep the most likely tokens up to this much probability mass, (0, 1]; 1 = off (default). */
  topP?: number;
  /** Keep tokens at least this fraction as likely as the most likely one, [0, 1]; 0 = off (default). */
  minP?: number;
  /** Divides positive logits and multiplies negative ones of every token in the context (prompt and output), (0, 100]; 1 = off (default). */
  repetitionPenalty?: number;
  /** Subtracted from the logit of every token this generation has produced, [-100, 100]; 0 = off (default). */
  presencePenalty?: number;
  /** Subtracted per occurrence in this generation's output, [-100, 100]; 0 = off (default). */
  frequencyPenalty?: number;
}

export const GREEDY: SamplingParams = Object.freeze({
  temperature: 0,
  topK: 0,
  topP: 1,
  minP: 0,
  repetitionPenalty: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
});

/** Validates sampling options (errors name the option) and rounds them to f32. */
export function samplingParams(o: SamplingOptions): SamplingParams {
  const num = (name: keyof SamplingOptions, lo: number, hi: number, dflt: number, loOpen = false): number => {
    const v = o[name];
    if (v === undefined || v === null) return dflt;
    if (typeof v !== "number" || !Number.isFinite(v) || v < lo || v > hi || (loOpen && v === lo))
      throw new RangeError(`${name} ${String(v)} must be a number in ${loOpen ? "(" : "["}${lo}, ${hi}]`);
    return Math.fround(v);
  };
  const topK = o.topK ?? 0;
  if (!Number.isInteger(topK) || topK < 0 || topK > 2 ** 31 - 1) throw new RangeError(`topK ${String(topK)} must be an integer >= 0 (0 = off)`);
  return {
    temperature: num("temperature", 0, 100, 0),
    topK,
    topP: num("topP", 0, 1, 1, true),
    minP: num("minP", 0, 1, 0),
    repetitionPenalty: num("repetitionPenalty", 0, 100, 1, true),
    presencePenalty: num("presencePenalty", -100, 100, 0),
    frequencyPenalty: num("frequencyPenalty", -100, 100, 0),
  };
}

export const hasPenalties = (p: SamplingParams) => p.repetitionPenalty !== 1 || p.presencePenalty !== 0 || p.frequencyPenalty !== 0;
/** Greedy with nothing that changes the argmax: the engine's plain argmax path applies. */
export const isPlainGreedy = (p: SamplingParams) => p.temperature === 0 && !hasPenalties(p);

// ---- the uniform --------------------------------------------------------------------------

const M64 = (1n << 64n) - 1n;
const GAMMA = 0x9e3779b97f4a7c15n;

/** splitmix64's output function (Steele, Lea, Flood 2014), mod 2^64. */
function mix64(z: bigint): bigint {
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M64;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M64;
  return z ^ (z >> 31n);
}

/** What a uniform is for: draws of one position never share a number. */
export const Draw = {
  /** The token at a position (plain decoding, a rejected draft's replacement comes from `residual`). */
  sample: 0,
  /** Accept-or-reject of a draft token. */
  accept: 1,
  /** A replacement from normalize(max(0, p - q)) after a rejection. */
  residual: 2,
  /** The MTP head's draft at a position. */
  draft: 3,
} as const;

/**
 * The uniform in [0, 1) for (seed, position, draw), exactly (docs/sampling.md):
 * h = mix(seed + G); h = mix(h + position + G); h = mix(h + draw + G) (mod 2^64,
 * G = 0x9E3779B97F4A7C15, mix = splitmix64's output function); u = (h >> 40) * 2^-24.
 * `seed` is an integer in [0, 2^53); position is the index (in the sequence) of the token drawn.
 */
export function samplingUniform(seed: number, position: number, draw: number): number {
  let h = mix64((BigInt(seed) + GAMMA) & M64);
  h = mix64((h + BigInt(position) + GAMMA) & M64);
  h = mix64((h + BigInt(draw) + GAMMA) & M64);
  return Number(h >> 40n) / 16777216;
}

/** Checks a seed (an integer in [0, 2^53)); errors name the option. */
export function checkSeed(seed: unknown): number {
  if (typeof seed !== "number" || !Number.isSafeInteger(seed) || seed < 0) throw new RangeError(`seed ${String(seed)} must be an integer in [0, 2^53)`);
  return seed;
}

// ---- penalties ----------------------------------------------------------------------------

/**
 * Token counts the penalties read: all[t] = occurrences of t in the context (prompt and
 * generated), gen[t] = occurrences among the tokens generated by this generation. The storage
 * may be a device buffer (the engine reads it in the sampling kernel): [all | gen], 2 * vocab.
 */
export class PenaltyCounts {
  readonly data: Int32Array;
  constructor(
    readonly vocab: number,
    data?: Int32Array,
    private readonly onRelease?: () => void,
  ) {
    this.data = data ?? new Int32Array(2 * vocab);
    if (this.data.length < 2 * vocab) throw new Error(`PenaltyCounts: storage of ${this.data.length} ints, needs ${2 * vocab}`);
    this.data.fill(0, 0, 2 * vocab);
  }
  /** Counts `token` as part of the context; `generated` also as generated by this generation. */
  add(token: number, generated: boolean): void {
    if (!Number.isInteger(token) || token < 0 || token >= this.vocab) throw new RangeError(`penalty counts: token ${token} is outside the vocabulary (${this.vocab})`);
    this.data[token]!++;
    if (generated) this.data[this.vocab + token]!++;
  }
  /** Frees device storage (the engine's); the counts must not be used afterwards. */
  release(): void {
    this.onRelease?.();
  }
  all(t: number): number {
    return this.data[t]!;
  }
  gen(t: number): number {
    return this.data[this.vocab + t]!;
  }
}

/**
 * y = penalized(z) / T in f32, op by op as the kernel does. `extras`: tokens generated after
 * those in `counts` (earlier drafts of the same step), counted as generated. With T = 0 the
 * division is skipped (y is only argmaxed).
 */
export function transformLogits(z: ArrayLike<number>, p: SamplingParams, counts: PenaltyCounts | null, extras: readonly number[] = []): Float32Array {
  const f = Math.fround;
  const y = new Float32Array(z.length);
  const pen = counts !== null && hasPenalties(p);
  for (let i = 0; i < z.length; i++) {
    let v = f(z[i]!);
    if (pen) {
      let extra = 0;
      for (const e of extras) if (e === i) extra++;
      const all = counts.all(i) + extra;
      const gen = counts.gen(i) + extra;
      if (all > 0) v = v > 0 ? f(v / p.repetitionPenalty) : f(v * p.repetitionPenalty);
      if (gen > 0) v = f(v - f(f(f(gen) * p.frequencyPenalty) + p.presencePenalty));
    }
    y[i] = p.temperature > 0 ? f(v / p.temperature) : v;
  }
  return y;
}

/** Index of the largest value, ties to the lowest index. */
function argmaxOf(y: ArrayLike<number>): number {
  let b = 0;
  for (let i = 1; i < y.length; i++) if (y[i]! > y[b]!) b = i;
  return b;
}

/**
 * The distribution of one row (docs/sampling.md): penalties, temperature, then top_k (keep
 * y >= the k-th largest y), top_p (keep y >= the largest value v whose set {y >= v} holds at
 * least topP of the top_k set's mass), min_p (keep exp(y - max) >= minP); p proportional to
 * exp(y - max) on what is kept, 0 elsewhere. Ties at a threshold are all kept. T = 0: one-hot
 * on the argmax of the penalized logits (lowest id on a tie).
 */
export function samplingDistribution(z: ArrayLike<number>, p: SamplingParams, counts: PenaltyCounts | null = null, extras: readonly number[] = []): Float64Array {
  const y = transformLogits(z, p, counts, extras);
  const n = y.length;
  const out = new Float64Array(n);
  if (p.temperature === 0) {
    out[argmaxOf(y)] = 1;
    return out;
  }
  const m = y[argmaxOf(y)]!;
  const order = Array.from({ length: n }, (_, i) => i).sort((a, b) => y[b]! - y[a]! || a - b);
  let tau = -Infinity;
  if (p.topK > 0 && p.topK < n) tau = y[order[p.topK - 1]!]!;
  if (p.topP < 1) {
    let total = 0;
    for (const i of order) if (y[i]! >= tau) total += Math.exp(y[i]! - m);
    let acc = 0;
    for (const i of order) {
      if (y[i]! < tau) break;
      acc += Math.exp(y[i]! - m);
      if (acc >= p.topP * total) {
        tau = Math.max(tau, y[i]!);
        break;
      }
    }
  }
  let total = 0;
  for (let i = 0; i < n; i++) {
    const e = Math.exp(y[i]! - m);
    if (y[i]! >= tau && e >= p.minP) {
      out[i] = e;
      total += e;
    }
  }
  for (let i = 0; i < n; i++) out[i] = out[i]! / total;
  return out;
}

/**
 * Inverse CDF in token-id order: the lowest id i with weight > 0 whose running sum (ids 0..i)
 * exceeds u * total. Weights need not be normalized. Falls back to the highest id with
 * weight > 0 when rounding leaves u * total at or past the sum.
 */
export function drawIndex(w: ArrayLike<number>, u: number): number {
  let total = 0;
  let last = -1;
  for (let i = 0; i < w.length; i++) {
    if (w[i]! > 0) {
      total += w[i]!;
      last = i;
    }
  }
  if (last < 0) throw new Error("sampling: the distribution has no mass");
  const target = u * total;
  let acc = 0;
  for (let i = 0; i < w.length; i++) {
    if (!(w[i]! > 0)) continue;
    acc += w[i]!;
    if (target < acc) return i;
  }
  return last;
}

/** Everything a row's draw depends on besides its logits. */
export interface RowSampling {
  params: SamplingParams;
  seed: number;
  /** Index in the sequence of the token this row draws. */
  position: number;
  counts?: PenaltyCounts | null;
  /** Tokens drawn after `counts` was last updated (earlier drafts of the step). */
  extras?: readonly number[];
}

/** The token a row draws (Draw.sample, or Draw.draft for the MTP head's proposals). */
export function sampleToken(z: ArrayLike<number>, s: RowSampling, draw: number = Draw.sample): number {
  const p = samplingDistribution(z, s.params, s.counts ?? null, s.extras ?? []);
  return drawIndex(p, samplingUniform(s.seed, s.position, draw));
}

/**
 * Speculative sampling's verification of draft x (drawn from q) against the target p: accept
 * when u_accept * q(x) < p(x) (probability min(1, p(x)/q(x))); otherwise the token is drawn
 * from normalize(max(0, p - q)) with u_residual (from p itself if rounding left that empty).
 * Returns the token and whether it is the draft.
 */
export function verifyDraft(p: ArrayLike<number>, q: ArrayLike<number>, x: number, seed: number, position: number): { token: number; accepted: boolean } {
  if (samplingUniform(seed, position, Draw.accept) * q[x]! < p[x]!) return { token: x, accepted: true };
  const r = new Float64Array(p.length);
  let any = false;
  for (let i = 0; i < p.length; i++) {
    r[i] = Math.max(0, p[i]! - q[i]!);
    if (r[i]! > 0) any = true;
  }
  const u = samplingUniform(seed, position, Draw.residual);
  return { token: drawIndex(any ? r : p, u), accepted: false };
}

// ---- logprobs -------------------------------------------------------------------------------

export interface TopLogprob {
  id: number;
  logprob: number;
}

/**
 * Log-probabilities under the model's own distribution, log_softmax(z) of the raw logits
 * (before penalties, temperature and filters), as OpenAI and vLLM report them: the chosen
 * token's and the `top` most likely (value descending, ties to the lower id).
 */
export function tokenLogprobs(z: ArrayLike<number>, id: number, top: number): { logprob: number; top: TopLogprob[] } {
  let m = -Infinity;
  for (let i = 0; i < z.length; i++) m = Math.max(m, z[i]!);
  let s = 0;
  for (let i = 0; i < z.length; i++) s += Math.exp(z[i]! - m);
  const lse = m + Math.log(s);
  const order = Array.from({ length: z.length }, (_, i) => i).sort((a, b) => z[b]! - z[a]! || a - b);
  return { logprob: z[id]! - lse, top: order.slice(0, top).map((i) => ({ id: i, logprob: z[i]! - lse })) };
}

/**
 * One speculative step under sampling: logits[j] are the target rows of the verify batch
 * [next, ...drafts], qs[j] the distribution draft j was drawn from. Row j draws position
 * s.position + j with the earlier drafts as extras; drafts are verified in order until one is
 * rejected (its replacement ends the step) or all pass (then row k draws the bonus token).
 */
export function speculativeTokens(logits: ArrayLike<number>[], drafts: readonly number[], qs: ArrayLike<number>[], s: RowSampling): { tokens: number[]; accepted: number } {
  const extras = s.extras ?? [];
  const tokens: number[] = [];
  for (let j = 0; j <= drafts.length; j++) {
    const row: RowSampling = { ...s, position: s.position + j, extras: [...extras, ...drafts.slice(0, j)] };
    if (j === drafts.length) {
      tokens.push(sampleToken(logits[j]!, row));
      return { tokens, accepted: j };
    }
    const p = samplingDistribution(logits[j]!, s.params, s.counts ?? null, row.extras);
    const v = verifyDraft(p, qs[j]!, drafts[j]!, s.seed, row.position);
    tokens.push(v.token);
    if (!v.accepted) return { tokens, accepted: j };
  }
  throw new Error("unreachable");
}
