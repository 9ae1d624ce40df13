// Tests that turn an environment switch on for one body and put it back after.

/** Sets environment variable `name` to `value` (undefined: unset); returns what puts it back. */
function setEnvVar(name: string, value: string | undefined): () => void {
  const before = process.env[name];
  const put = (v: string | undefined) => {
    if (v === undefined) delete process.env[name];
    else process.env[name] = v;
  };
  put(value);
  return () => put(before);
}

/** Runs `body` with environment variable `name` set to `value` (unset: undefined), restoring it after. */
export function withEnvVar<T>(name: string, value: string | undefined, body: () => T): T {
  const restore = setEnvVar(name, value);
  try {
    return body();
  } finally {
    restore();
  }
}

/** withEnvVar for an async body: the variable is put back once `body`'s promise settles. */
export async function withEnvVarAsync<T>(name: string, value: string | undefined, body: () => Promise<T>): Promise<T> {
  const restore = setEnvVar(name, value);
  try {
    return await body();
  } finally {
    restore();
  }
}
