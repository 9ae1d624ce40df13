// synthesize's distinctExpertLayers (bench:scale --distinct-layers): the first N expert layers
// are generated, later ones repeat their records byte for byte, every checksum holds, and the
// source records it, so such a model is never mistaken for a fully random one.
import { expect, test } from "bun:test";
import { synthesize } from "../../lib/convert/synth.ts";
import { openModel } from "../../lib/model/format.ts";
import { tempDir } from "../engine-step/helpers.ts";

test("distinctExpertLayers 2: layers 2.. repeat layers 0-1, checksums verify, the source says so", async () => {
  const tmp = tempDir("repeat");
  try {
    await synthesize({ preset: "tiny", seed: 4, out: tmp.dir, weights: "q4", distinctExpertLayers: 2, workers: 0 });
    const m = await openModel(tmp.dir, { verify: true });
    try {
      const { layers, perLayer } = m.expertLayout;
      expect(layers).toBeGreaterThan(2);
      for (let l = 2; l < layers; l++) for (let e = 0; e < perLayer; e++) expect(m.readExpertRecord(l, e).slice()).toEqual(m.readExpertRecord(l % 2, e).slice());
      expect(m.readExpertRecord(1, 0).slice()).not.toEqual(m.readExpertRecord(0, 0).slice());
      expect(m.manifest.writer.source).toEqual({ synth: { preset: "tiny", seed: 4, features: {}, distinctExpertLayers: 2 } });
    } finally {
      m.close();
    }
  } finally {
    tmp.remove();
  }
});
