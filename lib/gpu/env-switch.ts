// Switches and counts read from the environment (tuning runs on a GPU turn a form on or off,
// or set a size, without a rebuild).

/** A 0/1 switch from the environment: 1 on, 0 off, empty or unset `fallback`; anything else refused by name. */
export function envOnOff(name: string, fallback = false): boolean {
  const env = process.env[name];
  if (env === "1") return true;
  if (env === "0") return false;
  if (env === undefined || env === "") return fallback;
  throw new RangeError(`${name}=${env}: expected 0 (off) or 1 (on)`);
}

/**
 * A whole number from the environment: unset or empty undefined (the caller's default);
 * anything not an integer that `ok` accepts refused by name, saying what was `expected`.
 */
export function envCount(name: string, expected: string, ok: (n: number) => boolean): number | undefined {
  const env = process.env[name];
  if (env === undefined || env === "") return undefined;
  const n = Number(env);
  if (!Number.isInteger(n) || !ok(n)) throw new RangeError(`${name}=${env}: expected ${expected}`);
  return n;
}
