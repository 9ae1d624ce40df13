// On/off switches read from the environment (tuning runs on a GPU turn a form on or off
// without a rebuild).

/** A 0/1 switch from the environment: 1 on, 0 off, empty or unset `fallback`; anything else refused by name. */
export function envOnOff(name: string, fallback = false): boolean {
  const env = process.env[name];
  if (env === "1") return true;
  if (env === "0") return false;
  if (env === undefined || env === "") return fallback;
  throw new RangeError(`${name}=${env}: expected 0 (off) or 1 (on)`);
}
