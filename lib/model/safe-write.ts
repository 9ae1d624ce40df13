// Writing files that a running model may be reading: every file is written under a fresh
// temporary name (created exclusively, so a symlink planted in the directory is never
// followed and no existing file is truncated) and renamed over the final name when complete.
// A model that has the old file open keeps reading the old inode; a reader never sees a
// half-written file under the final name.
import { closeSync, existsSync, lstatSync, mkdirSync, openSync, readdirSync, renameSync, rmSync, writeSync } from "node:fs";
import { join } from "node:path";

/** The output directory cannot be written (not a directory, or not empty without force). */
export class OutputDirError extends Error {
  override name = "OutputDirError";
}

/**
 * Creates `dir` (and parents) or checks an existing one: it must be a directory, and empty
 * unless `force` (then only the files the writer names are replaced, each by rename).
 */
export function prepareOutputDir(dir: string, force: boolean): void {
  if (!existsSync(dir)) {
    mkdirSync(dir, { recursive: true });
    return;
  }
  let entries: string[];
  try {
    entries = readdirSync(dir);
  } catch (e) {
    throw new OutputDirError(`output ${dir} is not a directory (${(e as NodeJS.ErrnoException).code ?? String(e)})`);
  }
  if (entries.length && !force)
    throw new OutputDirError(`output directory ${dir} is not empty (${entries.length} entries); pass --force (force: true) to replace the model files in it`);
}

let counter = 0;
/** A temporary name next to `name` in `dir` (hidden, unique to this process and call). */
export function tempName(dir: string, name: string): string {
  return join(dir, `.${name}.${process.pid}.${++counter}.${Math.random().toString(36).slice(2, 8)}.tmp`);
}

/** Opens a new temporary file for `name` in `dir` for writing: O_CREAT | O_EXCL, never through a symlink. */
export function openTemp(dir: string, name: string): { fd: number; path: string } {
  const path = tempName(dir, name);
  return { fd: openSync(path, "wx", 0o644), path };
}

/** Renames a finished temporary file over `name` in `dir` (replacing a symlink itself, never its target). */
export function publish(tempPath: string, dir: string, name: string): void {
  renameSync(tempPath, join(dir, name));
}

/** Removes `name` from `dir` if present (a symlink is removed, not what it points to). */
export function removeEntry(dir: string, name: string): void {
  const p = join(dir, name);
  try {
    lstatSync(p);
  } catch {
    return;
  }
  rmSync(p, { force: true });
}

/** Writes `data` to `dir/name` through a temporary file and a rename. */
export function writeFileAtomic(dir: string, name: string, data: string | Uint8Array): void {
  const { fd, path } = openTemp(dir, name);
  try {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    let done = 0;
    while (done < bytes.length) done += writeSync(fd, bytes, done, bytes.length - done);
  } catch (e) {
    closeSync(fd);
    rmSync(path, { force: true });
    throw e;
  }
  closeSync(fd);
  publish(path, dir, name);
}
