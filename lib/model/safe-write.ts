// Writing files that a running model may be reading: every file is written under a fresh
// temporary name (created exclusively, so a symlink planted in the directory is never
// followed and no existing file is truncated) and renamed over the final name when complete.
// A model that has the old file open keeps reading the old inode; a reader never sees a
// half-written file under the final name. Crash consistency: a file's bytes reach the disk
// (fsync) before it is renamed, and the directory is synced after the renames, so a power loss
// never leaves a renamed file empty; temporary files a killed writer left behind are removed by
// the next writer of the directory.
import { closeSync, constants, existsSync, fsyncSync, lstatSync, mkdirSync, openSync, readdirSync, renameSync, rmSync, writeSync } from "node:fs";
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
  entries = entries.filter((f) => !removeStaleTemp(dir, f));
  if (entries.length && !force)
    throw new OutputDirError(`output directory ${dir} is not empty (${entries.length} entries); pass --force (force: true) to replace the model files in it`);
}

let counter = 0;
/** A temporary name next to `name` in `dir` (hidden, unique to this process and call). */
export function tempName(dir: string, name: string): string {
  return join(dir, `.${name}.${process.pid}.${++counter}.${Math.random().toString(36).slice(2, 8)}.tmp`);
}

/** The temporary names tempName makes: `.NAME.PID.N.RANDOM.tmp`. */
const TEMP = /^\..+\.(\d+)\.\d+\.[0-9a-z]+\.tmp$/;

/**
 * Removes `file` from `dir` when it is a temporary file of a writer that no longer runs (its
 * process id is gone: killed mid-write); true when removed. Temps of live writers stay.
 */
export function removeStaleTemp(dir: string, file: string): boolean {
  const m = TEMP.exec(file);
  if (!m) return false;
  const pid = Number(m[1]);
  if (pid === process.pid || processAlive(pid)) return false;
  rmSync(join(dir, file), { force: true });
  return true;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"; // alive, someone else's
  }
}

/** Flushes a directory's entries (renames, removals) to the disk; a no-op where directories cannot be opened. */
export function syncDir(dir: string): void {
  let fd: number;
  try {
    fd = openSync(dir, constants.O_RDONLY | (constants.O_DIRECTORY ?? 0));
  } catch {
    return;
  }
  try {
    fsyncSync(fd);
  } catch {
    // some filesystems refuse fsync on a directory: the renames are as durable as they allow
  } finally {
    closeSync(fd);
  }
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

/**
 * Writes `data` to `dir/name` through a temporary file (synced) and a rename; the directory is
 * synced after unless `syncDirectory` is false (a caller renaming several files syncs once).
 */
export function writeFileAtomic(dir: string, name: string, data: string | Uint8Array, syncDirectory = true): void {
  const { fd, path } = openTemp(dir, name);
  try {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    let done = 0;
    while (done < bytes.length) done += writeSync(fd, bytes, done, bytes.length - done);
    fsyncSync(fd);
  } catch (e) {
    closeSync(fd);
    rmSync(path, { force: true });
    throw e;
  }
  closeSync(fd);
  publish(path, dir, name);
  if (syncDirectory) syncDir(dir);
}
