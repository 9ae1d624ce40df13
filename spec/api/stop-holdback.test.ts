// The stop-string hold-back: however a text is split into token pieces, what it releases adds up
// to the text before the first stop string, and never runs ahead of it.
import { describe, expect, test } from "bun:test";
import { StopHoldback } from "../../lib/api/stop-holdback.ts";

/** Every way to cut `text` into pieces at the given number of cut points (all positions, small texts). */
function* splits(text: string, cuts: number, from = 1): Generator<string[]> {
  if (cuts === 0) {
    yield [text];
    return;
  }
  for (let i = from; i < text.length; i++) for (const rest of splits(text.slice(i), cuts - 1)) yield [text.slice(0, i), ...rest];
}

function run(pieces: string[], stops: string[]) {
  const full = pieces.join("");
  const hits = stops.map((s) => full.indexOf(s)).filter((i) => i >= 0);
  const final = hits.length > 0 ? full.slice(0, Math.min(...hits)) : full;
  const h = new StopHoldback(stops);
  let out = "";
  for (const p of pieces) {
    out += h.push(p);
    // released text is always a prefix of the final text
    expect(final.startsWith(out)).toBe(true);
  }
  expect(h.text).toBe(final);
  out += h.flush();
  return { out, final };
}

describe("StopHoldback", () => {
  const cases: [string, string[]][] = [
    ["abcXYdefXYZghi", ["XYZ"]],
    ["hello world\n\nbye", ["\n\n", "wor"]],
    ["aaab", ["aab"]],
    ["no stop here", ["zz"]],
    ["stop at start", ["sto"]],
  ];
  for (const [text, stops] of cases)
    test(`"${text.replaceAll("\n", "\\n")}" with ${JSON.stringify(stops)}: every split releases exactly the text before the stop`, () => {
      for (const cuts of [0, 1, 2, 3])
        for (const pieces of splits(text, cuts)) {
          const { out, final } = run(pieces, stops);
          expect(out).toBe(final);
        }
    });

  test("without stop strings text is released as it comes", () => {
    const h = new StopHoldback([]);
    expect(h.push("ab")).toBe("ab");
    expect(h.push("c")).toBe("c");
    expect(h.flush()).toBe("");
  });

  test("a possible stop start is held until the next piece decides", () => {
    const h = new StopHoldback(["END"]);
    expect(h.push("abcE")).toBe("abc");
    expect(h.push("N")).toBe("");
    expect(h.push("x")).toBe("ENx");
    expect(h.push("EN")).toBe("");
    expect(h.push("D more")).toBe("");
    expect(h.stoppedAt).toBe(6);
    expect(h.flush()).toBe("");
    expect(h.text).toBe("abcENx");
  });

  test("at the end, text held for a stop string that never completed is flushed", () => {
    const h = new StopHoldback(["END"]);
    expect(h.push("abEN")).toBe("ab");
    expect(h.flush()).toBe("EN");
    expect(h.stoppedAt).toBe(-1);
  });
});

