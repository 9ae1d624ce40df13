// Environment switches and counts (lib/gpu/env-switch.ts): what a tuning run may set, and a
// bad value refused with the variable named and what it expects.
import { expect, test } from "bun:test";
import { envCount, envOnOff } from "../../lib/gpu/env-switch.ts";
import { withEnvVar } from "../env-var.ts";

const NAME = "CHERENKOV_TEST_ENV_SWITCH";

test("envCount: unset or empty is the caller's default; a whole number `ok` accepts is taken", () => {
  const multipleOf32 = (n: number) => n >= 32 && n % 32 === 0;
  for (const unset of [undefined, ""]) withEnvVar(NAME, unset, () => expect(envCount(NAME, "a multiple of 32", multipleOf32)).toBeUndefined());
  withEnvVar(NAME, "96", () => expect(envCount(NAME, "a multiple of 32", multipleOf32)).toBe(96));
  for (const bad of ["48", "0", "32.5", "x", "-32"]) {
    withEnvVar(NAME, bad, () => expect(() => envCount(NAME, "a multiple of 32", multipleOf32)).toThrow(`${NAME}=${bad}: expected a multiple of 32`));
  }
});

test("envOnOff: 1 and 0, the fallback when unset, anything else refused by name", () => {
  withEnvVar(NAME, "1", () => expect(envOnOff(NAME)).toBe(true));
  withEnvVar(NAME, "0", () => expect(envOnOff(NAME, true)).toBe(false));
  withEnvVar(NAME, undefined, () => expect(envOnOff(NAME, true)).toBe(true));
  withEnvVar(NAME, "yes", () => expect(() => envOnOff(NAME)).toThrow(`${NAME}=yes`));
});
