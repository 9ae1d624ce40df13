// RoPE against transformers (Qwen3NextRotaryEmbedding + apply_rotary_pos_emb, float32) at
// positions up to 262143, for the rotary settings of our presets and of real checkpoints
// (fixture: spec/oracle/fixtures/rope/rope.json, made on the H200 machine by
// `python3 spec/oracle/rope_oracle.py OUT`). The frequencies must be bit-identical and the
// rotated vectors agree to f32 rounding; the old f64 angle rule is off by up to 6e-3 rad there.
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { ropeAngle, ropeInvFreq } from "../../lib/model/rope.ts";
import { ropeNeox } from "../../lib/reference/index.ts";

interface RopeCase {
  name: string;
  rope_theta: number;
  head_dim: number;
  rotary_dim: number;
  heads: number;
  inv_freq: string;
  cos: string;
  sin: string;
  q: string;
  q_embed: string;
  f64_rule_max_angle_drift: number;
}

const doc = (await Bun.file(join(import.meta.dir, "fixtures", "rope", "rope.json")).json()) as { positions: number[]; cases: RopeCase[]; source: string };
const f32 = (b64: string) => {
  const b = Buffer.from(b64, "base64");
  return new Float32Array(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
};
const P = doc.positions;

describe(`RoPE equals transformers' (${doc.source.split(" (")[0]})`, () => {
  test("the fixture reaches far past 4096", () => expect(Math.max(...P)).toBeGreaterThan(100_000));
  for (const c of doc.cases) {
    const rd = c.rotary_dim;
    test(`${c.name} (theta ${c.rope_theta}, rd ${rd}): inv_freq bit for bit`, () => {
      expect(Array.from(ropeInvFreq(rd, c.rope_theta))).toEqual(Array.from(f32(c.inv_freq)));
    });
    test(`${c.name}: cos and sin of every angle to f32 rounding`, () => {
      const inv = ropeInvFreq(rd, c.rope_theta);
      const cos = f32(c.cos);
      const sin = f32(c.sin);
      let worst = 0;
      P.forEach((pos, t) => {
        for (let i = 0; i < rd; i++) {
          const a = ropeAngle(pos, inv[i % (rd / 2)]!);
          worst = Math.max(worst, Math.abs(Math.cos(a) - cos[t * rd + i]!), Math.abs(Math.sin(a) - sin[t * rd + i]!));
        }
      });
      expect(worst).toBeLessThan(5e-7);
      // The drift this rule removes is real at these positions.
      expect(c.f64_rule_max_angle_drift).toBeGreaterThan(1e-4);
    });
    test(`${c.name}: ropeNeox rotates q as apply_rotary_pos_emb does, pass-through dims untouched`, () => {
      const q = f32(c.q);
      const want = f32(c.q_embed);
      const hd = c.head_dim;
      let worst = 0;
      for (let h = 0; h < c.heads; h++)
        P.forEach((pos, t) => {
          const off = (h * P.length + t) * hd;
          const x = q.slice(off, off + hd);
          ropeNeox(x, pos, rd, c.rope_theta);
          for (let i = 0; i < hd; i++) worst = Math.max(worst, Math.abs(x[i]! - want[off + i]!));
          for (let i = rd; i < hd; i++) expect(x[i]).toBe(q[off + i]!);
        });
      expect(worst).toBeLessThan(2e-6);
    });
  }
});
