// Projections (kernels/matvec.metal) against lib/reference matmulRows, for every storage
// dtype, with the reference computing on the stored values (bf16/f16 rounded, q4
// dequantized), so the only difference left is f32 accumulation order.
import { afterAll, describe, expect, test } from "bun:test";

import { encodeMatvec, encodeMatvecs, oneRowForm, prefersSplit, splitSimdgroups } from "../../lib/gpu/projections.ts";
import type { DType } from "../../lib/model/config.ts";
import { matmulRows } from "../../lib/reference/ops.ts";
import { expectClose, expectGuard, NB_CASES, openDevice, outputF32, randomF32, readF32, recordingNames, rows, run, uploadF32, uploadWeight } from "./harness.ts";

const dev = openDevice();
afterAll(() => dev.close());

// Sums of `in` products of values in [-1, 1): f32 rounding in another order grows like
// sqrt(in) ulps of the sum of |terms| (measured ~5e-6 at in = 1088); 4e-7 * in leaves room.
const dotTolerance = (inDim: number) => ({ abs: 4e-7 * inDim });

const DTYPES: DType[] = ["f32", "bf16", "f16", "q4"];

const FORMS = ["rows", "split"] as const;

describe.each(DTYPES.flatMap((d) => FORMS.map((f) => [d, f] as const)))("matvec %s (%s form)", (dtype, form) => {
  // Widths: out not a multiple of the 16-row tile; in wider than one pass of 32 lanes.
  const shapes = (nb: number): [number, number] => (nb === 1024 ? [19, 64] : [37, dtype === "q4" ? 1088 : 548]);

  test.each(NB_CASES)("nb = %i", (nb) => {
    const [out, inDim] = shapes(nb);
    const { ref, host } = uploadWeight(dev, dtype, [out, inDim], 11 + nb);
    const x = randomF32(nb * inDim, nb, 1, `x-${dtype}`);
    const xb = uploadF32(dev, x);
    const y = outputF32(dev, nb * out);
    run(dev, (ctx) => encodeMatvec(ctx, ref, rows(xb, inDim), rows(y, out), nb, { form }));
    const want = matmulRows(host.values, x, nb, out, inDim);
    expectClose(readF32(y, nb * out), want, dotTolerance(inDim), `matvec_${dtype}_f32 nb=${nb}`, out);
    expectGuard(y, nb * out);
  });

  test("accumulates into y, over row ranges split across threadgroups", () => {
    const nb = 9;
    const [out, inDim] = [21, 96];
    const { ref, host } = uploadWeight(dev, dtype, [out, inDim], 5);
    const x = randomF32(nb * inDim, 3, 1, "acc-x");
    const y0 = randomF32(nb * out, 4, 1, "acc-y");
    const xb = uploadF32(dev, x);
    const y = uploadF32(dev, y0);
    run(dev, (ctx) => encodeMatvec(ctx, ref, rows(xb, inDim), rows(y, out), nb, { accumulate: true, rowsPerGroup: 4, form }));
    const want = matmulRows(host.values, x, nb, out, inDim).map((v, i) => v + y0[i]!);
    expectClose(readF32(y, nb * out), want, dotTolerance(inDim), `matvec_${dtype}_f32 accumulate`, out);
  });

  // One batch row per threadgroup: q4 takes the decode (one-row) kernels, here over several rows.
  test("one row per threadgroup (the q4 one-row form), several rows", () => {
    const nb = 3;
    const [out, inDim] = [37, 1088];
    const { ref, host } = uploadWeight(dev, dtype, [out, inDim], 17);
    const x = randomF32(nb * inDim, 21, 1, "r1-x");
    const xb = uploadF32(dev, x);
    const y = outputF32(dev, nb * out);
    run(dev, (ctx) => encodeMatvec(ctx, ref, rows(xb, inDim), rows(y, out), nb, { rowsPerGroup: 1, form }));
    expectClose(readF32(y, nb * out), matmulRows(host.values, x, nb, out, inDim), dotTolerance(inDim), `matvec_${dtype} one-row form`, out);
    expectGuard(y, nb * out);
  });
});

// The split form's threadgroup is sized by the host (splitSimdgroups): q4 at one group a lane,
// so a wide input gets up to 8 simdgroups; the kernel reads its simdgroup count, and every
// count must give the reference's sums.
test("q4 split form sized by the input: 1 to 8 simdgroups, against the reference", () => {
  expect([512, 1024, 1088, 2048, 4096, 5120, 8192, 16384].map((i) => splitSimdgroups("q4", i))).toEqual([1, 1, 2, 2, 4, 5, 8, 8]);
  expect(splitSimdgroups("bf16", 2048)).toBe(8);
  for (const [out, inDim, nb] of [[9, 5120, 1], [6, 4096, 2], [5, 8192, 1]] as const) {
    const { ref, host } = uploadWeight(dev, "q4", [out, inDim], 23 + inDim);
    const x = randomF32(nb * inDim, 29, 1, "split-x");
    const xb = uploadF32(dev, x);
    const y = outputF32(dev, nb * out);
    run(dev, (ctx) => encodeMatvec(ctx, ref, rows(xb, inDim), rows(y, out), nb, { form: "split" }));
    expectClose(readF32(y, nb * out), matmulRows(host.values, x, nb, out, inDim), dotTolerance(inDim), `matvec_split_q4 in ${inDim}`, out);
    expectGuard(y, nb * out);
  }
});

// The one-row q4 rows form stages its input row in threadgroup memory up to 2,048 columns
// (matvec_q4_staged_r1; MV_STAGE_COLS, kernels/matvec.h); CHERENKOV_Q4_STAGE_X=0 keeps
// matvec_q4_r1, which reads x from device memory, as wider rows do: the same bits either way,
// accumulating too, over rows served one per threadgroup.
test.each([[37, 1088], [64, 2048], [9, 4160], [21, 1024]])("one-row q4 [%i, %i]: staged and device-memory x give the same bits", (out, inDim) => {
  const nb = 3;
  const { ref, host } = uploadWeight(dev, "q4", [out, inDim], 70 + inDim);
  const xv = randomF32(nb * inDim, 71, 1, "stage1-x");
  const x = uploadF32(dev, xv);
  const y0 = randomF32(nb * out, 72, 1, "stage1-y");
  const forms = ["1", "0"] as const;
  const ys = forms.map(() => uploadF32(dev, y0));
  const names: string[][] = forms.map(() => []);
  forms.forEach((stage, i) => {
    process.env.CHERENKOV_Q4_STAGE_X = stage;
    try {
      run(dev, (ctx) => encodeMatvec(recordingNames(ctx, names[i]!), ref, rows(x, inDim), rows(ys[i]!, out), nb, { rowsPerGroup: 1, form: "rows", accumulate: true }));
    } finally {
      delete process.env.CHERENKOV_Q4_STAGE_X;
    }
  });
  const staged = inDim <= 2048 ? "matvec_q4_staged_r1_f32" : "matvec_q4_r1_f32";
  expect(names).toEqual([[staged], ["matvec_q4_r1_f32"]]);
  const got = ys.map((y) => readF32(y, nb * out));
  expect(got[0]).toEqual(got[1]!);
  const want = matmulRows(host.values, xv, nb, out, inDim).map((v, i) => v + y0[i]!);
  expectClose(got[0]!, want, dotTolerance(inDim), `matvec_q4_staged_r1 in ${inDim}`, out);
});

// matvec_multi's q4 decode form stages its input row in threadgroup memory up to 2,048
// columns (MV_STAGE_COLS, kernels/matvec.h); wider rows read x from device memory. Both give
// the bits of separate one-row matvecs.
test.each([1088, 4160])("matvec_multi q4 one-row form, in = %i: the same bits as separate matvecs", (inDim) => {
  const outs = [21, 8];
  const ws = outs.map((o, i) => uploadWeight(dev, "q4", [o, inDim], 60 + i).ref);
  const x = uploadF32(dev, randomF32(inDim, 61, 1, "stage-x"));
  const ys = outs.map((o) => outputF32(dev, o));
  const sep = outs.map((o) => outputF32(dev, o));
  run(dev, (ctx) => {
    encodeMatvecs(ctx, ws.map((w, i) => ({ w, y: rows(ys[i]!, outs[i]!) })), rows(x, inDim), 1, { form: "rows" });
    ws.forEach((w, i) => encodeMatvec(ctx, w, rows(x, inDim), rows(sep[i]!, outs[i]!), 1, { form: "rows" }));
  });
  outs.forEach((o, i) => expect(readF32(ys[i]!, o)).toEqual(readF32(sep[i]!, o)));
});

test("prefersSplit: narrow weights on a GPU; q4 below 192 rows-form threadgroups (at any row count); never on the CPU", () => {
  expect(prefersSplit("cpu", 32)).toBe(false);
  expect(prefersSplit("cuda", 32)).toBe(true);
  expect(prefersSplit("cuda", 2048)).toBe(false);
  expect(prefersSplit("cuda", 2048, "q4")).toBe(true); // the [2048, 4096] out projections
  expect(prefersSplit("metal", 2048, "q4")).toBe(true);
  expect(prefersSplit("cuda", 4096, "q4")).toBe(false);
  expect(prefersSplit("cuda", 2048, "bf16")).toBe(false);
});

test("oneRowForm: q4 kernels with one row per pass take their _r1 form; other dtypes keep theirs", () => {
  expect(oneRowForm("matvec_q4_f32", "q4", 1)).toBe("matvec_q4_r1_f32");
  expect(oneRowForm("matvec_split_q4_f32", "q4", 1)).toBe("matvec_split_q4_r1_f32");
  expect(oneRowForm("moe_down_q4_f32", "q4", 4)).toBe("moe_down_q4_f32");
  expect(oneRowForm("matvec_bf16_f32", "bf16", 1)).toBe("matvec_bf16_f32");
});

describe("matvec strides and errors", () => {
  test("reads and writes rows at strides and offsets inside larger buffers", () => {
    const [nb, out, inDim, xs, ys] = [3, 8, 32, 40, 12];
    const { ref, host } = uploadWeight(dev, "bf16", [out, inDim], 2);
    const xData = randomF32(nb * xs + 16, 9);
    const xb = uploadF32(dev, xData);
    const y = outputF32(dev, 4 + nb * ys);
    run(dev, (ctx) => encodeMatvec(ctx, ref, { buffer: xb, offset: 64, stride: xs * 4 }, { buffer: y, offset: 16, stride: ys * 4 }, nb));
    for (let r = 0; r < nb; r++) {
      const want = matmulRows(host.values, xData.subarray(16 + r * xs, 16 + r * xs + inDim), 1, out, inDim);
      expectClose(readF32(y, out, 4 + r * ys), want, dotTolerance(inDim), "matvec_bf16_f32 strided");
      expect(Number.isNaN(y.f32[4 + r * ys + out]!)).toBe(true); // the gap between rows is untouched
    }
  });

  test("rejects a q4 weight whose input width is not a multiple of 32, and a bad row count", () => {
    const { ref } = uploadWeight(dev, "q4", [4, 32], 1);
    const x = dev.buffer(1024);
    expect(() => run(dev, (ctx) => encodeMatvec(ctx, { ...ref, shape: [4, 48] }, rows(x, 48), rows(x, 4), 1))).toThrow(
      "needs an input width that is a multiple of 32",
    );
    expect(() => run(dev, (ctx) => encodeMatvec(ctx, ref, rows(x, 32), rows(x, 4), 0))).toThrow("nb 0 must be");
  });
});

describe("encodeMatvecs (matvec_multi: several projections of one input)", () => {
  // Same pass and sums as one matvec each in the same form (rows: matvec_multi, split:
  // matvec_multi_split): the same bits, whatever weight a simdgroup or threadgroup lands on.
  test.each(DTYPES.flatMap((d) => [1, 3].flatMap((nb) => (["rows", "split"] as const).map((form) => [d, nb, form] as const))))("%s weights, nb = %i, %s form: the same bits as separate matvecs", (dtype, nb, form) => {
    const inDim = dtype === "q4" ? 96 : 52;
    const outs = [37, 8, 1, 21];
    const ws = outs.map((o, i) => uploadWeight(dev, dtype, [o, inDim], 40 + i).ref);
    const x = uploadF32(dev, randomF32(nb * inDim, 7 + nb, 1, "multi-x"));
    const ys = outs.map((o) => outputF32(dev, nb * o));
    const sep = outs.map((o) => outputF32(dev, nb * o));
    run(dev, (ctx) => {
      encodeMatvecs(ctx, ws.map((w, i) => ({ w, y: rows(ys[i]!, outs[i]!) })), rows(x, inDim), nb, { form });
      ws.forEach((w, i) => encodeMatvec(ctx, w, rows(x, inDim), rows(sep[i]!, outs[i]!), nb, { form }));
    });
    outs.forEach((o, i) => {
      expect([...new Uint32Array(ys[i]!.f32.buffer, ys[i]!.f32.byteOffset, nb * o)]).toEqual([...new Uint32Array(sep[i]!.f32.buffer, sep[i]!.f32.byteOffset, nb * o)]);
      expectGuard(ys[i]!, nb * o);
    });
  });

  test.each(["rows", "split"] as const)("batch rows in groups (a GPU's default for prompt chunks), %s form: the same bits as one group", (form) => {
    const nb = 40;
    const inDim = 64;
    const outs = [9, 4];
    const ws = outs.map((o, i) => uploadWeight(dev, "bf16", [o, inDim], 80 + i).ref);
    const x = uploadF32(dev, randomF32(nb * inDim, 11, 1, "groups-x"));
    const one = outs.map((o) => outputF32(dev, nb * o));
    const grouped = outs.map((o) => outputF32(dev, nb * o));
    run(dev, (ctx) => {
      encodeMatvecs(ctx, ws.map((w, i) => ({ w, y: rows(one[i]!, outs[i]!) })), rows(x, inDim), nb, { form, rowsPerGroup: nb });
      encodeMatvecs(ctx, ws.map((w, i) => ({ w, y: rows(grouped[i]!, outs[i]!) })), rows(x, inDim), nb, { form, rowsPerGroup: 12 });
    });
    outs.forEach((o, i) => {
      expect([...new Uint32Array(grouped[i]!.f32.buffer, grouped[i]!.f32.byteOffset, nb * o)]).toEqual([...new Uint32Array(one[i]!.f32.buffer, one[i]!.f32.byteOffset, nb * o)]);
      expectGuard(grouped[i]!, nb * o);
    });
  });

  test("rows enough for the GEMM send each q4 projection there, whatever shares its input (the bf16 ones stay matvecs)", () => {
    const inDim = 64;
    const nb = 40;
    const all = [uploadWeight(dev, "q4", [16, inDim], 90).ref, uploadWeight(dev, "q4", [8, inDim], 91).ref, uploadWeight(dev, "bf16", [6, inDim], 92).ref, uploadWeight(dev, "bf16", [2, inDim], 93).ref];
    const x = uploadF32(dev, randomF32(nb * inDim, 5, 1, "gemm-x"));
    const ys = all.map((w) => outputF32(dev, nb * w.shape[0]!));
    const names: string[] = [];
    const saved = process.env.CHERENKOV_GEMM_MIN_ROWS;
    process.env.CHERENKOV_GEMM_MIN_ROWS = "32";
    try {
      run(dev, (ctx) => encodeMatvecs(recordingNames(ctx, names), all.map((w, i) => ({ w, y: rows(ys[i]!, w.shape[0]!) })), rows(x, inDim), nb));
    } finally {
      if (saved === undefined) delete process.env.CHERENKOV_GEMM_MIN_ROWS;
      else process.env.CHERENKOV_GEMM_MIN_ROWS = saved;
    }
    expect(names.map((n) => n.replace("_split", ""))).toEqual(["gemm_q4_f32", "gemm_q4_f32", "matvec_multi_bf16_f32"]);
  });

  // A decode row's bf16 and q4 projections of one input (DeltaNet's b, a, qkv, z) go in one
  // matvec_multi_q4_r1 dispatch, bf16 first: the q4 ones give the bits of rows-form matvecs,
  // the bf16 ones those of split-form matvecs (which a verify batch runs on a GPU).
  test.each([96, 4160])("decode, in = %i: bf16 and q4 projections of one input in one dispatch, the bits of separate matvecs", (inDim) => {
    const all = [uploadWeight(dev, "q4", [21, inDim], 94).ref, uploadWeight(dev, "q4", [8, inDim], 95).ref, uploadWeight(dev, "bf16", [6, inDim], 96).ref, uploadWeight(dev, "bf16", [5, inDim], 97).ref];
    const x = uploadF32(dev, randomF32(inDim, 9, 1, "mixed-x"));
    const ys = all.map((w) => outputF32(dev, w.shape[0]!));
    const sep = all.map((w) => outputF32(dev, w.shape[0]!));
    const names: string[] = [];
    run(dev, (ctx) => {
      encodeMatvecs(recordingNames(ctx, names), all.map((w, i) => ({ w, y: rows(ys[i]!, w.shape[0]!) })), rows(x, inDim), 1, { mixed: true });
      all.forEach((w, i) => encodeMatvec(ctx, w, rows(x, inDim), rows(sep[i]!, w.shape[0]!), 1, { form: w.dtype === "q4" ? "rows" : "split" }));
    });
    expect(names).toEqual(["matvec_multi_q4_r1_f32"]);
    all.forEach((w, i) => {
      expect(readF32(ys[i]!, w.shape[0]!)).toEqual(readF32(sep[i]!, w.shape[0]!));
      expectGuard(ys[i]!, w.shape[0]!);
    });
  });

  test("by default the decode row's bf16 and q4 groups share a dispatch only where the bf16 ones take the split form (a GPU)", () => {
    const inDim = 96;
    const all = [uploadWeight(dev, "q4", [4096, inDim], 98).ref, uploadWeight(dev, "bf16", [32, inDim], 99).ref, uploadWeight(dev, "bf16", [32, inDim], 100).ref];
    const x = uploadF32(dev, randomF32(inDim, 12, 1, "mixed-default-x"));
    const ys = all.map((w) => outputF32(dev, w.shape[0]!));
    const names: string[] = [];
    run(dev, (ctx) => encodeMatvecs(recordingNames(ctx, names), all.map((w, i) => ({ w, y: rows(ys[i]!, w.shape[0]!) })), rows(x, inDim), 1));
    expect(names).toEqual(dev.backend === "cpu" ? ["matvec_q4_staged_r1_f32", "matvec_multi_bf16_f32"] : ["matvec_multi_q4_r1_f32"]);
  });

  test("groups by dtype and input width: a lone projection stays a matvec, five of one kind take two dispatches", () => {
    const inDim = 64;
    const q = [5, 9, 4, 12, 7].map((o, i) => uploadWeight(dev, "q4", [o, inDim], 60 + i).ref);
    const b = uploadWeight(dev, "bf16", [6, inDim], 70).ref;
    const x = uploadF32(dev, randomF32(2 * inDim, 3, 1, "group-x"));
    const all = [...q, b];
    const ys = all.map((w) => outputF32(dev, 2 * w.shape[0]!));
    const names: string[] = [];
    run(dev, (ctx) => encodeMatvecs(recordingNames(ctx, names), all.map((w, i) => ({ w, y: rows(ys[i]!, w.shape[0]!) })), rows(x, inDim), 2));
    // A lone projection keeps encodeMatvec's form (split for narrow weights on a GPU, and there a
    // batch of up to 4 rows runs one row a threadgroup: the one-row kernel).
    const lone = dev.backend === "cpu" ? "matvec_q4_f32" : "matvec_q4_r1_f32";
    expect(names.map((n) => n.replace("_split", ""))).toEqual(["matvec_multi_q4_f32", lone, "matvec_bf16_f32"]);
  });
});
