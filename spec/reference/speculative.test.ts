// Speculative decoding equals plain greedy, and a rollback restores every piece of state.
import { describe, expect, test } from "bun:test";
import { Rng } from "../../lib/model/rng.ts";
import { generateGreedy, MtpProposer, type DraftProposer, type SequenceState } from "../../lib/reference/index.ts";
import { randomTokens, tinyModel } from "./fixtures.ts";

const maxTokens = 24;

describe("speculative decoding = plain greedy", () => {
  for (const seed of [1, 2, 3]) {
    const model = tinyModel(seed);
    const prompt = randomTokens(seed, 10, model.config.vocab_size);
    const greedy = generateGreedy(model, prompt, { maxTokens });

    for (const drafts of [1, 2, 3]) {
      test(`seed ${seed}, ${drafts} MTP draft(s)`, () => {
        const spec = generateGreedy(model, prompt, { maxTokens, drafts });
        expect(spec.tokens).toEqual(greedy.tokens);
        expect(spec.margins).toEqual(greedy.margins);
        const s = spec.drafts!;
        expect(s.proposed).toBe(s.proposedByPosition.reduce((a, b) => a + b, 0));
        expect(s.accepted).toBe(s.byPosition.reduce((a, b) => a + b, 0));
        expect(s.proposedByPosition[0]).toBeGreaterThan(0);
        // Chained drafts are only accepted after their predecessor.
        for (let j = 1; j < drafts; j++) expect(s.byPosition[j]!).toBeLessThanOrEqual(s.byPosition[j - 1]!);
        console.log(`acceptance seed ${seed} drafts ${drafts}: ${s.accepted}/${s.proposed} by position ${s.byPosition.join(",")} of ${s.proposedByPosition.join(",")}`);
      });
    }
  }

  // Random MTP heads rarely agree with the trunk, so drive every accept length with drafts
  // that are the true continuation with one wrong token at a varying place.
  class CorruptedOracle implements DraftProposer {
    private rng = new Rng(99, "oracle");
    constructor(private truth: number[], private promptLength: number, private vocab: number) {}
    commit(): void {}
    propose(state: SequenceState, count: number): number[] {
      const emitted = state.length - this.promptLength + 1;
      const drafts = this.truth.slice(emitted, emitted + count);
      const wrong = this.rng.int(count + 1); // count = no wrong draft
      if (wrong < count) drafts[wrong] = (drafts[wrong]! + 1) % this.vocab;
      return drafts;
    }
  }

  for (const drafts of [1, 2, 3]) {
    test(`every accept length with ${drafts} corrupted oracle draft(s) gives the greedy tokens`, () => {
      const model = tinyModel(4);
      const prompt = randomTokens(4, 8, 320);
      const greedy = generateGreedy(model, prompt, { maxTokens: 30 });
      const proposer = new CorruptedOracle(greedy.tokens, prompt.length, 320);
      const spec = generateGreedy(model, prompt, { maxTokens: 30, drafts, proposer });
      expect(spec.tokens).toEqual(greedy.tokens);
      expect(spec.margins).toEqual(greedy.margins);
      const s = spec.drafts!;
      expect(s.accepted).toBeGreaterThan(0);
      expect(s.accepted).toBeLessThan(s.proposed);
      if (drafts > 1) expect(s.byPosition[drafts - 1]).toBeGreaterThan(0);
    });
  }

  test("after partial accepts the MTP cache holds exactly entry p = (h_p, tok[p+1]) at position p", () => {
    const model = tinyModel(4);
    const prompt = randomTokens(4, 8, 320);
    const greedy = generateGreedy(model, prompt, { maxTokens: 20 });
    // Runs the real MTP head (catch-up and chained rows) but verifies oracle drafts, so that
    // catch-ups span several accepted rows; remembers the MTP cache of the last step.
    const oracle = new CorruptedOracle(greedy.tokens, prompt.length, 320);
    const mtp = new MtpProposer(model);
    let seen: { length: number; cache: Map<string, ArrayLike<number>> } | null = null;
    const proposer: DraftProposer = {
      commit: (state, hidden, next) => mtp.commit(state, hidden, next),
      propose: (state, count) => {
        mtp.propose(state, count);
        seen = { length: state.mtpLength, cache: state.live() };
        return oracle.propose(state, count);
      },
    };
    const spec = generateGreedy(model, prompt, { maxTokens: 20, drafts: 3, proposer });
    expect(spec.tokens).toEqual(greedy.tokens);
    expect(spec.drafts!.accepted).toBeGreaterThan(0);
    // Direct: the trunk over the same tokens (prompt as one batch, then one row at a time),
    // then every MTP entry in one batch.
    const { length, cache } = seen!;
    const sequence = [...prompt, ...greedy.tokens];
    const state = model.newState();
    const hidden = model.forward(state, prompt).hidden;
    for (let p = prompt.length; p < length; p++) hidden.push(model.forward(state, [sequence[p]!]).hidden[0]!);
    model.mtpForward(state, hidden.slice(0, length), sequence.slice(1, length + 1));
    const want = state.live();
    for (const [name, values] of cache) if (name.startsWith("mtp.")) expect(Array.from(values)).toEqual(Array.from(want.get(name)!));
  });

  test("stopAtEos stops both ways at the same token", () => {
    const model = tinyModel(5);
    const prompt = randomTokens(5, 6, 320);
    const free = generateGreedy(model, prompt, { maxTokens: 16 });
    // Make the 5th generated token the EOS of a config copy.
    const eos = free.tokens[4]!;
    const stopping = tinyModel(5, {}, (c) => (c.eos_token_id = eos));
    const first = free.tokens.indexOf(eos);
    const plain = generateGreedy(stopping, prompt, { maxTokens: 16, stopAtEos: true });
    expect(plain.tokens).toEqual(free.tokens.slice(0, first + 1));
    const spec = generateGreedy(stopping, prompt, { maxTokens: 16, stopAtEos: true, drafts: 3, proposer: new CorruptedOracle(free.tokens, 6, 320) });
    expect(spec.tokens).toEqual(plain.tokens);
  });
});

describe("rollback", () => {
  const live = (s: SequenceState) => Object.fromEntries([...s.live()].map(([k, v]) => [k, Array.from(v)]));

  for (const keep of [0, 1, 2]) {
    test(`a verify batch of 4 rows rolled back to row ${keep} equals a state that never saw the rest`, () => {
      const model = tinyModel(6);
      const prompt = randomTokens(6, 10, 320);
      const batch = [11, 22, 33, 44];
      const prepare = () => {
        const state = model.newState();
        const r = model.forward(state, prompt);
        model.mtpForward(state, r.hidden, [...prompt.slice(1), batch[0]!]);
        return state;
      };
      // A: the full verify batch, with chained MTP rows before it, then a partial accept.
      const a = prepare();
      const committed = a.mtpLength;
      const h = model.forward(model.newState(), prompt).hidden.at(-1)!;
      model.mtpForward(a, [h, h], [5, 6]);
      a.truncateMtp(committed);
      const verify = model.forward(a, batch, { snapshots: true });
      a.restore(verify.snapshots![keep]!);
      // B: only the accepted rows, run the same way.
      const b = prepare();
      model.forward(b, batch.slice(0, keep + 1), { snapshots: true });
      expect(live(a)).toEqual(live(b));
      // Both continue identically, bit for bit, trunk and MTP.
      const ra = model.forward(a, [7, 8, 9]);
      const rb = model.forward(b, [7, 8, 9]);
      ra.logits.forEach((l, i) => expect(Array.from(l)).toEqual(Array.from(rb.logits[i]!)));
      const ma = model.mtpForward(a, ra.hidden, [8, 9, 10]);
      const mb = model.mtpForward(b, rb.hidden, [8, 9, 10]);
      ma.logits.forEach((l, i) => expect(Array.from(l)).toEqual(Array.from(mb.logits[i]!)));
    });
  }

  test("the rolled-back state really changed: it differs from the state before restore", () => {
    const model = tinyModel(6);
    const state = model.newState();
    model.forward(state, [1, 2, 3]);
    const snap = state.snapshot();
    const before = [...state.live()].map(([k, v]) => [k, Array.from(v)]);
    model.forward(state, [4, 5], { snapshots: true });
    const changed = [...state.live()].filter(([k, v]) => JSON.stringify(Array.from(v)) !== JSON.stringify(before.find((e) => e[0] === k)![1]));
    // Every kind of state moved: DeltaNet S and conv, KV, QSA keys, PLE history, tokens.
    const names = changed.map(([k]) => k).join(" ");
    for (const part of ["dn.S", "dn.conv", "attn.k.values", "attn.ik.values", "ple.history", "tokens", "length"]) expect(names).toContain(part);
    state.restore(snap);
    expect([...state.live()].map(([k, v]) => [k, Array.from(v)])).toEqual(before);
  });

  test("a snapshot/restore round trip reproduces the same logits", () => {
    const model = tinyModel(7);
    const state = model.newState();
    model.forward(state, randomTokens(7, 9, 320));
    const snap = state.snapshot();
    const first = model.forward(state, [3, 1, 4]).logits;
    state.restore(snap);
    const again = model.forward(state, [3, 1, 4]).logits;
    first.forEach((l, i) => expect(Array.from(again[i]!)).toEqual(Array.from(l)));
  });

  test("stale and foreign snapshots are refused", () => {
    const model = tinyModel(7);
    const state = model.newState();
    model.forward(state, [1, 2]);
    const r = model.forward(state, [3, 4, 5, 6], { snapshots: true });
    state.restore(r.snapshots![1]!);
    expect(() => state.restore(r.snapshots![3]!)).toThrow(/ahead|stale/);
    model.forward(state, [9, 9]);
    expect(() => state.restore(r.snapshots![3]!)).toThrow(/stale/);
    state.restore(r.snapshots![0]!); // still valid: before the truncation point
    expect(state.tokens).toEqual([1, 2, 3]);
    expect(() => model.newState().restore(r.snapshots![0]!)).toThrow(/another sequence/);
  });

  test("a snapshot taken while chained draft rows sat in the MTP cache is stale once they are dropped", () => {
    const model = tinyModel(7);
    const state = model.newState();
    const r = model.forward(state, [1, 2, 3, 4]);
    model.mtpForward(state, r.hidden.slice(0, -1), [2, 3, 4]);
    const committed = state.mtpLength;
    const h = r.hidden.at(-1)!;
    model.mtpForward(state, [h, h], [5, 6]); // chained draft rows
    const during = state.snapshot();
    expect(during.mtpLength).toBe(committed + 2);
    state.truncateMtp(committed);
    model.mtpForward(state, [h, h], [7, 8]); // other rows at the same MTP positions
    expect(() => state.restore(during)).toThrow(/stale/);
    // A snapshot taken before the chained rows is still good, and truncating nothing logs nothing.
    const fresh = model.newState();
    const r2 = model.forward(fresh, [1, 2, 3, 4]);
    model.mtpForward(fresh, r2.hidden.slice(0, -1), [2, 3, 4]);
    const before = fresh.snapshot();
    model.mtpForward(fresh, [h], [5]);
    fresh.truncateMtp(fresh.mtpLength - 1);
    fresh.truncateMtp(fresh.mtpLength);
    model.forward(fresh, [9]);
    fresh.restore(before);
    expect(fresh.length).toBe(4);
    expect(fresh.mtpLength).toBe(committed);
  });
});
