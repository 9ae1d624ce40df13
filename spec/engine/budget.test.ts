// Expert-pool sizing (lib/gpu/budget.ts): the working-set budget, explicit overrides, the
// minimum one step needs, and the errors that give the numbers.
import { expect, test } from "bun:test";
import { BudgetError, minPoolSlots, parsePoolSize, planPool, type PoolBudgetInput, checkMappedFits } from "../../lib/gpu/budget.ts";

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
// An 80B-A3B-like shape: 49 expert layers of 512 experts, 1.5 MiB records, top-10.
const base: PoolBudgetInput = {
  deviceMaxWorkingSet: 48 * GiB,
  fixedBytes: 6 * GiB,
  hostReserveBytes: 10 * GiB,
  recordStride: 1.5 * MiB,
  expertLayers: 49,
  perLayer: 512,
  topK: 10,
};
const records = 49 * 512;

test("the default pool is the working-set limit minus fixed buffers minus the host reserve, in whole records", () => {
  const plan = planPool(base);
  const expected = Math.floor(((48 - 6 - 10) * GiB) / (1.5 * MiB));
  expect(expected).toBeLessThan(records); // the budget, not the model size, decides here
  expect(plan.slots).toBe(expected);
  expect(plan.bytes).toBe(expected * 1.5 * MiB);
  expect(plan.records).toBe(records);
  expect(plan.overBudget).toBe(false);
  expect(plan.reason).toMatch(/^budget: working-set limit 48\.00 GiB - fixed buffers 6\.00 GiB - host reserve 10\.00 GiB = 32\.00 GiB: 21845 records of 25088/);
});

test("a budget above the model's size holds every record and no more", () => {
  const plan = planPool({ ...base, deviceMaxWorkingSet: 1024 * GiB });
  expect(plan.slots).toBe(records);
  expect(plan.budgetSlots).toBeGreaterThan(records);
  expect(plan.reason).toMatch(/every one of the 25088 expert records fits/);
});

test("explicit slots, bytes and fractions override the budget; a fraction is of all expert records", () => {
  expect(planPool({ ...base, poolSlots: 1000 }).slots).toBe(1000);
  expect(planPool({ ...base, poolBytes: 3 * GiB + 5 }).slots).toBe(Math.floor((3 * GiB + 5) / (1.5 * MiB)));
  const half = planPool({ ...base, poolFraction: 0.5 });
  expect(half.slots).toBe(Math.floor(records / 2));
  expect(half.reason).toMatch(/explicit: 50% of 25088 expert records \(12544 records\)/);
  // Larger than the model: capped. Larger than the budget: allowed, flagged.
  const all = planPool({ ...base, poolSlots: records * 2 });
  expect(all.slots).toBe(records);
  expect(all.reason).toMatch(/capped at all 25088 records/);
  const tight = planPool({ ...base, deviceMaxWorkingSet: 20 * GiB, poolFraction: 1 });
  expect(tight.overBudget).toBe(true);
  expect(tight.reason).toMatch(/over the working-set budget/);
});

test("the minimum is one layer's routed experts for the largest step, capped at the layer's experts", () => {
  expect(minPoolSlots(10, 512)).toBe(10);
  expect(minPoolSlots(10, 512, 4)).toBe(40);
  expect(minPoolSlots(10, 512, 4096)).toBe(512);
  expect(planPool({ ...base, maxRows: 4, poolSlots: 40 }).minSlots).toBe(40);
});

test("a budget that cannot hold one step's experts fails with the numbers", () => {
  const small = { ...base, deviceMaxWorkingSet: 16 * GiB + 8 * MiB }; // 8 MiB left: 5 records
  let err: unknown;
  try {
    planPool({ ...small, maxRows: 2 });
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(BudgetError);
  const b = err as BudgetError;
  expect([b.neededSlots, b.availableSlots, b.recordStride]).toEqual([20, 5, 1.5 * MiB]);
  expect(b.message).toContain("working-set limit 16.01 GiB - fixed buffers 6.00 GiB - host reserve 10.00 GiB = 8.0 MiB");
  expect(b.message).toContain("room for 5 records");
  expect(b.message).toContain("need 20 records (top-k 10 x 2 rows, at most 512 per layer) = 30.0 MiB at 1.5 MiB per record");
  // A negative remainder is a budget of zero records, not a crash.
  expect(() => planPool({ ...base, deviceMaxWorkingSet: 4 * GiB })).toThrow(/= -12\.00 GiB, room for 0 records/);
});

test("an explicit pool below the minimum fails with the numbers too", () => {
  expect(() => planPool({ ...base, poolSlots: 9 })).toThrow(/expert pool of 9 slots is too small: .*need 10 records/);
  expect(() => planPool({ ...base, poolFraction: 0.0001 })).toThrow(/0\.01% of 25088 expert records \(2 records\) is too small/);
  expect(() => planPool({ ...base, poolBytes: 10 * MiB })).toThrow(/10\.0 MiB \(6 records of 1\.5 MiB\) is too small/);
});

test("bad inputs name the field", () => {
  expect(() => planPool({ ...base, recordStride: 0 })).toThrow(/recordStride 0 must be a positive integer/);
  expect(() => planPool({ ...base, topK: 600 })).toThrow(/topK 600 exceeds the 512 experts per layer/);
  expect(() => planPool({ ...base, poolSlots: 10, poolFraction: 0.5 })).toThrow(/at most one of/);
  expect(() => planPool({ ...base, poolFraction: 1.5 })).toThrow(/poolFraction 1\.5 must be in \(0, 1\]/);
  expect(() => planPool({ ...base, fixedBytes: NaN })).toThrow(/fixedBytes NaN/);
});

test("--pool sizes parse as fractions or bytes", () => {
  expect(parsePoolSize("50%")).toEqual({ poolFraction: 0.5 });
  expect(parsePoolSize("12.5 %")).toEqual({ poolFraction: 0.125 });
  expect(parsePoolSize("8GiB")).toEqual({ poolBytes: 8 * GiB });
  expect(parsePoolSize("512mib")).toEqual({ poolBytes: 512 * MiB });
  expect(parsePoolSize("1.5GB")).toEqual({ poolBytes: 1.5e9 });
  expect(parsePoolSize("4096")).toEqual({ poolBytes: 4096 });
  expect(() => parsePoolSize("150%")).toThrow(/percentage must be in \(0, 100\]/);
  expect(() => parsePoolSize("lots")).toThrow(/expected a percentage/);
});

test("the mapped backing fits only when experts.bin fits what the working set leaves (issue 9 item 7)", () => {
  const GiB = 1024 ** 3;
  expect(() => checkMappedFits({ deviceMaxWorkingSet: 48 * GiB, fixedBytes: 4 * GiB, hostReserveBytes: 8 * GiB, fileBytes: 36 * GiB })).not.toThrow();
  let err: unknown;
  try {
    checkMappedFits({ deviceMaxWorkingSet: 48 * GiB, fixedBytes: 4 * GiB, hostReserveBytes: 8 * GiB, fileBytes: 120 * GiB });
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(BudgetError);
  expect((err as Error).message).toBe(
    "--backing mapped: experts.bin is 120.00 GiB, more than the working set leaves for it (working-set limit 48.00 GiB - fixed buffers 4.00 GiB - " +
      "host reserve 8.00 GiB = 36.00 GiB). The mapped file is made resident as a whole, so it is safe only when it fits; use --backing wired " +
      "(the default), with --io cached to let the page cache keep hot records.",
  );
});
