// Adaptive draft count (FACTS.md "MTP"): with streamed experts every verify row may route to
// its own experts, so a draft can cost more than it saves. The controller measures both sides
// and picks, each step, the k in 0..maxDrafts with the most expected tokens per millisecond:
//   tokens(k) = 1 + sum_{j=1..k} prod_{i<=j} p_i     (accepted drafts plus the bonus token)
//   rate(k)   = tokens(k) / cost(k)
// p_i is the EWMA of "draft i accepted, given drafts 1..i-1 were"; cost(k) the EWMA of the
// wall time of a step with k drafts (k = 0: a plain decode step). k = 0 is always a
// candidate, so drafting is only chosen when it measured faster. Each count is measured once
// at the start (a draft count's first steady step is cold on the engine: recorded, its CUDA
// graph not built yet; its time is not taken, the step is repeated); afterwards other counts
// are re-tried round robin from an exploration budget (a share of the measured decode time,
// default 2%), so a k that looked bad once can recover.
// An exploration is priced and charged what its steps take: the transition into k catches the
// MTP head up over every row since the last draft step and finds no command buffer prepared,
// which can cost many steady steps (on the H200's 30b shape ~3 plain steps), so the price is
// k's last transition time plus its steady time, not twice the steady time: priced at the
// steady time alone, explorations came about three times as often as the share allowed and
// drafts "auto" ran at 0.93x plain there. k's first measurement, and each exploration, that
// finds k clearly beaten (under 90% of the best rate) doubles what the next exploration of k
// must save up (up to MAX_BACKOFF times; reset on a close call, on an exploration that raised
// k's rate by 10%, and for every count when the best count changes): where drafting never pays
// (an MTP head that proposes nothing useful) exploring costs ~2% / 8 of the time, and the
// first re-try waits for twice the budget (re-tried at once, a count never accepted cost the
// H200's 30b shape 1-2% over its first few hundred tokens). The acceptance prior weighs as two
// observations, so a first measurement that accepted nothing is seen as such. The price of an
// exploration includes the step back to the best count (also a transition: nothing prepared,
// a cycle's rollback to run), charged to it as well.
// A step right after a change of count is not k's steady cost: a draft step after steps
// without drafts also runs the MTP head over the rows it skipped, and on the engine any step
// after a change finds no command buffer prepared for it (a plain step after a cycle also runs
// the cycle's pending rollback). Such a transition only updates the acceptance, and the next
// step repeats k to measure it; counted as plain's cost, it would make plain look slower than
// it is and drafting win where it loses.

/** The EWMA of `prev` (null: nothing seen yet, so x itself) after observing x with weight a. */
const ewma = (prev: number | null, x: number, a: number) => (prev === null ? x : (1 - a) * prev + a * x);

/** EWMA weight of an exploration step's observations. */
const EXPLORE_ALPHA = 0.5;
/** The most an exploration's budget is multiplied by after explorations that changed nothing. */
const MAX_BACKOFF = 8;
/** An explored count whose rate is at least this share of the best's is a close call: no backoff. */
const BACKOFF_MARGIN = 0.9;
/** An exploration that raised k's rate by this factor or more found a changed world: no backoff. */
const IMPROVED = 1.1;
/** Observations the acceptance prior weighs as (a position's first ones weigh 1/3, 1/4, ... until alpha). */
const PRIOR_WEIGHT = 2;

export interface DraftControllerOptions {
  /** The largest draft count the backend verifies. */
  maxDrafts: number;
  /** EWMA weight of a new observation (default 0.1: about the last ten steps). */
  alpha?: number;
  /** Acceptance assumed before a position has been observed (default 0.5). */
  priorAcceptance?: number;
  /** Share of the measured step time spent re-trying other counts (default 0.02). */
  exploreShare?: number;
}

export interface DraftControllerStats {
  /** Steps that ran with k drafts, by k. */
  steps: number[];
  /** Acceptance by draft position (EWMA), position 1 first. */
  acceptance: number[];
  /** Step time in ms by draft count (EWMA; null = never measured). */
  stepMs: (number | null)[];
}

export class DraftController {
  readonly maxDrafts: number;
  private readonly alpha: number;
  private readonly exploreShare: number;
  /** Milliseconds of exploration earned and not yet spent. */
  private budget = 0;
  /** A count to run again (its last step caught the MTP head up, so its time was not used). */
  private repeat: number | null = null;
  /** The count being re-tried: rare samples of a maybe changed world weigh more (EXPLORE_ALPHA). */
  private exploring: number | null = null;
  /** The explored count's rate before its exploration. */
  private rateBeforeExplore = 0;
  /** An exploration just measured its count: the step back (a transition) is charged to it too. */
  private returning = false;
  /** The best count at the last choice (null: none yet). */
  private lastBest: number | null = null;
  private readonly acceptance: number[];
  private readonly cost: (number | null)[];
  /** EWMA of the time of a step into k from another count (null = none seen yet). */
  private readonly transitionCost: (number | null)[];
  private readonly steps: number[];
  /** Per count: the multiple of its exploration price its next exploration must have saved up. */
  private readonly backoff: number[];
  /** Observations of each draft position so far. */
  private readonly seen: number[];
  /** Per count: whether a steady step of it was seen (the first is cold, its time not k's cost). */
  private readonly warmed: boolean[];
  private nextExplore = 0;

  constructor(opts: DraftControllerOptions) {
    const { maxDrafts } = opts;
    if (!Number.isInteger(maxDrafts) || maxDrafts < 0) throw new RangeError(`DraftController: maxDrafts ${maxDrafts} must be an integer >= 0`);
    this.maxDrafts = maxDrafts;
    this.alpha = opts.alpha ?? 0.1;
    if (!(this.alpha > 0 && this.alpha <= 1)) throw new RangeError(`DraftController: alpha ${this.alpha} must be in (0, 1]`);
    this.exploreShare = opts.exploreShare ?? 0.02;
    if (!(this.exploreShare >= 0 && this.exploreShare < 1)) throw new RangeError(`DraftController: exploreShare ${this.exploreShare} must be in [0, 1)`);
    const prior = opts.priorAcceptance ?? 0.5;
    this.acceptance = new Array(maxDrafts).fill(prior);
    this.cost = new Array(maxDrafts + 1).fill(null);
    this.transitionCost = new Array(maxDrafts + 1).fill(null);
    this.steps = new Array(maxDrafts + 1).fill(0);
    this.backoff = new Array(maxDrafts + 1).fill(1);
    this.seen = new Array(maxDrafts).fill(0);
    this.warmed = new Array(maxDrafts + 1).fill(false);
    this.warmed[0] = true;
  }

  /** Expected tokens a step with k drafts yields (accepted drafts plus the bonus). */
  expectedTokens(k: number): number {
    let tokens = 1;
    let all = 1;
    for (let j = 0; j < k; j++) {
      all *= this.acceptance[j]!;
      tokens += all;
    }
    return tokens;
  }

  /** The draft count for the next step, at most `limit` (tokens left to generate). */
  choose(limit = this.maxDrafts): number {
    const top = Math.max(0, Math.min(limit, this.maxDrafts));
    if (top === 0) return 0;
    if (this.repeat !== null && this.repeat <= top) {
      const k = this.repeat;
      this.repeat = null;
      return k;
    }
    this.repeat = null;
    // Measure every count once before trusting any rate (cheapest first).
    for (let k = 0; k <= top; k++) if (this.cost[k] === null) return k;
    const best = this.best(top);
    // A new best: the world changed, and the verdicts that backed the others off are stale.
    if (top === this.maxDrafts) {
      if (this.lastBest !== null && best !== this.lastBest) this.backoff.fill(1);
      this.lastBest = best;
    }
    // Round robin over the other counts, each when the budget pays for one step of it.
    for (let i = 0; i <= top; i++) {
      const k = (this.nextExplore + i) % (top + 1);
      if (k === best) continue;
      // Three steps (the transition into k, the one measured, the transition back to the
      // best), times k's backoff: what they take is charged as they are observed, the
      // backoff's surplus now.
      const price = this.explorationPrice(k, best);
      if (this.budget < price * this.backoff[k]!) continue;
      this.budget -= price * (this.backoff[k]! - 1);
      this.nextExplore = k + 1;
      this.exploring = k;
      this.rateBeforeExplore = this.rate(k);
      return k;
    }
    return best;
  }

  /** What re-trying k costs: a step into k (as the last one took), a steady one, and the step back to `best`. */
  private explorationPrice(k: number, best: number): number {
    return (this.transitionCost[k] ?? this.cost[k]!) + this.cost[k]! + (this.transitionCost[best] ?? this.cost[best]!);
  }

  /** The count with the most expected tokens per ms among 0..top (all measured). */
  private best(top: number): number {
    let best = 0;
    let bestRate = this.rate(0);
    for (let k = 1; k <= top; k++) {
      const rate = this.rate(k);
      if (rate > bestRate) {
        best = k;
        bestRate = rate;
      }
    }
    return best;
  }

  /**
   * Records a step that proposed k drafts, accepted `accepted` of them and took `ms`.
   * `transition`: the step followed a step of another count (a draft step's MTP head first ran
   * the rows of earlier steps), so `ms` is not the steady cost of k: the next step repeats k.
   */
  observe(k: number, accepted: number, ms: number, transition = false): void {
    if (!Number.isInteger(k) || k < 0 || k > this.maxDrafts) throw new RangeError(`DraftController.observe: k ${k} outside 0..${this.maxDrafts}`);
    if (!Number.isInteger(accepted) || accepted < 0 || accepted > k) throw new RangeError(`DraftController.observe: accepted ${accepted} outside 0..${k}`);
    if (!(ms >= 0)) throw new RangeError(`DraftController.observe: step time ${ms} ms must be >= 0`);
    // A draft count's first steady step is cold too (on the engine its accept counts' cycles
    // are recorded, their CUDA graphs not built yet: the tiny model's took 2-5x a warm one's on
    // the H200): like a transition, it only updates the acceptance, and k is repeated.
    const cold = !transition && !this.warmed[k];
    if (!transition) this.warmed[k] = true;
    const steady = !transition && !cold;
    const explored = this.exploring === k;
    const firstMeasure = steady && this.cost[k] === null;
    const a = explored ? Math.max(this.alpha, EXPLORE_ALPHA) : this.alpha;
    if (steady) this.exploring = null;
    this.steps[k]!++;
    this.budget += this.exploreShare * ms;
    if (explored || (this.returning && transition)) this.budget -= ms;
    this.returning = explored && steady;
    if (!steady) this.repeat = k;
    if (transition) this.transitionCost[k] = ewma(this.transitionCost[k] ?? null, ms, a);
    if (steady) this.cost[k] = ewma(this.cost[k] ?? null, Math.max(ms, 1e-6), a);
    // Positions 1..accepted were accepted; position accepted+1 (if proposed) was rejected; later
    // ones are unobserved. The prior counts as PRIOR_WEIGHT observations, so a count's first
    // measurement is not mostly the prior (at alpha 0.1 two rejections left 0.41 of a 0.5
    // prior, and drafts that never pay looked close to paying until several explorations had
    // run) nor one sample alone (weighed as one, a single early rejection backed a count that
    // pays off, and a simulated world took ~500 steps to reach its best count instead of ~50).
    for (let j = 0; j < Math.min(k, accepted + 1); j++) {
      const hit = j < accepted ? 1 : 0;
      const w = Math.max(a, 1 / (this.seen[j]! + 1 + PRIOR_WEIGHT));
      this.seen[j]!++;
      this.acceptance[j] = (1 - w) * this.acceptance[j]! + w * hit;
    }
    // A verdict after k's first measurement or an exploration of it: k within BACKOFF_MARGIN of
    // the best measured rate (a close call that noise in the estimates may have decided), or
    // an exploration that raised k's rate by IMPROVED (the world changed; its estimates lag),
    // keeps exploring at the full rate; k clearly beaten doubles its backoff.
    if ((explored || firstMeasure) && steady) {
      const rate = this.rate(k);
      const close = rate >= BACKOFF_MARGIN * this.bestMeasuredRate() || (explored && rate >= IMPROVED * this.rateBeforeExplore);
      this.backoff[k] = close ? 1 : Math.min(2 * this.backoff[k]!, MAX_BACKOFF);
    }
  }

  /** The best expected tokens per ms among the counts measured so far. */
  private bestMeasuredRate(): number {
    let best = 0;
    for (let k = 0; k <= this.maxDrafts; k++) if (this.cost[k] !== null) best = Math.max(best, this.rate(k));
    return best;
  }

  /** Expected tokens per ms of k drafts (k measured). */
  private rate(k: number): number {
    return this.expectedTokens(k) / this.cost[k]!;
  }

  stats(): DraftControllerStats {
    return { steps: this.steps.slice(), acceptance: this.acceptance.slice(), stepMs: this.cost.slice() };
  }
}
