// Tests that turn an environment switch on for one body and put it back after.

/** Runs `body` with environment variable `name` set to `value` (unset: undefined), restoring it after. */
export function withEnvVar<T>(name: string, value: string | undefined, body: () => T): T {
  const before = process.env[name];
  if (value === undefined) delete process.env[name];
  else process.env[name] = value;
  try {
    return body();
  } finally {
    if (before === undefined) delete process.env[name];
    else process.env[name] = before;
  }
}

/** withEnvVar for an async body: the variable is put back once `body`'s promise settles. */
export async function withEnvVarAsync<T>(name: string, value: string | undefined, body: () => Promise<T>): Promise<T> {
  const before = process.env[name];
  if (value === undefined) delete process.env[name];
  else process.env[name] = value;
  try {
    return await body();
  } finally {
    if (before === undefined) delete process.env[name];
    else process.env[name] = before;
  }
}
