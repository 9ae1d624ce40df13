/**
 * bun:ffi bindings to metal-shim (metal-shim/include/cherenkov.h): the only file
 * that calls dlopen. Raw symbols behind a typed `Shim`, plus thin helpers
 * (Device, Buffer, Pipeline, CommandBuffer, Event) that turn error codes into
 * exceptions carrying the native message.
 *
 * Which library is loaded, for the selected backend (CHERENKOV_BACKEND=cpu|metal|cuda;
 * default metal on macOS, cuda on Linux with an NVIDIA GPU, else cpu), and nothing else:
 *  - setShimPath(path) or CHERENKOV_SHIM_PATH, when set: exactly that file. It must be a
 *    regular file in the platform's library format; anything wrong with it is an error,
 *    never a fallback to another library.
 *  - otherwise the package's own build, metal-shim/build/ (lib/native-library.ts). When it
 *    is missing the error says what to run; the runtime never builds it.
 * CHERENKOV_DEBUG_FFI=1 logs every native call to stderr.
 */
import { dlopen, FFIType, ptr as addressOf, toArrayBuffer, type Pointer } from "bun:ffi";
import { closeSync, openSync, readFileSync, readSync, statSync } from "node:fs";
import { join, resolve } from "node:path";

import { hasNvidiaGpu, libraryProblem, localLibraryPath, type Backend } from "./native-library.ts";

export { hasNvidiaGpu };

export type { Backend };

const { ptr, u32, i32, f64, cstring, void: none } = FFIType;

/** Every symbol of cherenkov.h, with its C signature. */
const SYMBOLS = {
  // const char *ck_last_error(void)
  ck_last_error: { args: [], returns: cstring },
  // int32_t ck_abi_version(void)
  ck_abi_version: { args: [], returns: i32 },

  // ck_device *ck_device_open(void)
  ck_device_open: { args: [], returns: ptr },
  // void ck_device_close(ck_device *dev)
  ck_device_close: { args: [ptr], returns: none },
  // const char *ck_device_backend(ck_device *dev)
  ck_device_backend: { args: [ptr], returns: cstring },
  // const char *ck_device_name(ck_device *dev)
  ck_device_name: { args: [ptr], returns: cstring },
  // double ck_device_max_working_set(ck_device *dev)
  ck_device_max_working_set: { args: [ptr], returns: f64 },
  // uint32_t ck_device_max_threadgroup_memory(ck_device *dev)
  ck_device_max_threadgroup_memory: { args: [ptr], returns: u32 },
  // uint32_t ck_device_max_threads_per_threadgroup(ck_device *dev)
  ck_device_max_threads_per_threadgroup: { args: [ptr], returns: u32 },
  // uint32_t ck_device_simd_width(ck_device *dev)
  ck_device_simd_width: { args: [ptr], returns: u32 },
  // uint32_t ck_device_page_size(ck_device *dev)
  ck_device_page_size: { args: [ptr], returns: u32 },
  // double ck_device_limit(ck_device *dev, int32_t limit)
  ck_device_limit: { args: [ptr, i32], returns: f64 },
  // void ck_device_set_wait_timeout(ck_device *dev, uint32_t timeout_ms)
  ck_device_set_wait_timeout: { args: [ptr, u32], returns: none },

  // ck_buffer *ck_buffer_new(ck_device *dev, double length)
  ck_buffer_new: { args: [ptr, f64], returns: ptr },
  // ck_buffer *ck_buffer_wrap(ck_device *dev, void *ptr, double length)
  ck_buffer_wrap: { args: [ptr, ptr, f64], returns: ptr },
  // void *ck_buffer_contents(ck_buffer *buf)
  ck_buffer_contents: { args: [ptr], returns: ptr },
  // double ck_buffer_length(ck_buffer *buf)
  ck_buffer_length: { args: [ptr], returns: f64 },
  // void ck_buffer_release(ck_buffer *buf)
  ck_buffer_release: { args: [ptr], returns: none },
  // ck_buffer *ck_buffer_new_storage(ck_device *dev, double length, int32_t storage)
  ck_buffer_new_storage: { args: [ptr, f64, i32], returns: ptr },
  // ck_buffer *ck_buffer_wrap_storage(ck_device *dev, void *ptr, double length, int32_t storage)
  ck_buffer_wrap_storage: { args: [ptr, ptr, f64, i32], returns: ptr },
  // int32_t ck_buffer_storage(ck_buffer *buf)
  ck_buffer_storage: { args: [ptr], returns: i32 },
  // int32_t ck_buffer_upload(ck_buffer *buf, double offset, double length)
  ck_buffer_upload: { args: [ptr, f64, f64], returns: i32 },
  // int32_t ck_buffer_download(ck_buffer *buf, double offset, double length)
  ck_buffer_download: { args: [ptr, f64, f64], returns: i32 },

  // ck_library *ck_library_load(ck_device *dev, const char *dir)
  ck_library_load: { args: [ptr, ptr], returns: ptr },
  // void ck_library_release(ck_library *lib)
  ck_library_release: { args: [ptr], returns: none },
  // uint32_t ck_library_kernel_count(ck_library *lib)
  ck_library_kernel_count: { args: [ptr], returns: u32 },
  // const char *ck_library_kernel_name(ck_library *lib, uint32_t index)
  ck_library_kernel_name: { args: [ptr, u32], returns: cstring },
  // ck_pipeline *ck_pipeline_get(ck_library *lib, const char *name)
  ck_pipeline_get: { args: [ptr, ptr], returns: ptr },
  // const char *ck_pipeline_name(ck_pipeline *pipe)
  ck_pipeline_name: { args: [ptr], returns: cstring },
  // uint32_t ck_pipeline_max_threads(ck_pipeline *pipe)
  ck_pipeline_max_threads: { args: [ptr], returns: u32 },

  // ck_cmdbuf *ck_cmdbuf_begin(ck_device *dev)
  ck_cmdbuf_begin: { args: [ptr], returns: ptr },
  // uint32_t ck_cmdbuf_id(ck_cmdbuf *cb)
  ck_cmdbuf_id: { args: [ptr], returns: u32 },
  // int32_t ck_encode_dispatch(ck_cmdbuf *cb, ck_pipeline *pipe, uint32_t grid_x, uint32_t grid_y,
  //     uint32_t grid_z, uint32_t tg_x, uint32_t tg_y, uint32_t tg_z, const ck_binding *bindings,
  //     uint32_t binding_count, const void *params, uint32_t params_len)
  ck_encode_dispatch: { args: [ptr, ptr, u32, u32, u32, u32, u32, u32, ptr, u32, ptr, u32], returns: i32 },
  // int32_t ck_encode_dispatch_threads(ck_cmdbuf *cb, ck_pipeline *pipe, uint32_t threads_x,
  //     uint32_t threads_y, uint32_t threads_z, uint32_t tg_x, uint32_t tg_y, uint32_t tg_z,
  //     const ck_binding *bindings, uint32_t binding_count, const void *params, uint32_t params_len)
  ck_encode_dispatch_threads: { args: [ptr, ptr, u32, u32, u32, u32, u32, u32, ptr, u32, ptr, u32], returns: i32 },
  // int32_t ck_encode_tape(ck_cmdbuf *cb, const uint32_t *words, uint32_t word_count)
  ck_encode_tape: { args: [ptr, ptr, u32], returns: i32 },
  // int32_t ck_encode_signal(ck_cmdbuf *cb, ck_event *ev, double value)
  ck_encode_signal: { args: [ptr, ptr, f64], returns: i32 },
  // int32_t ck_encode_wait(ck_cmdbuf *cb, ck_event *ev, double value)
  ck_encode_wait: { args: [ptr, ptr, f64], returns: i32 },
  // int32_t ck_encode_wait_host(ck_cmdbuf *cb, ck_event *ev, double value)
  ck_encode_wait_host: { args: [ptr, ptr, f64], returns: i32 },
  // int32_t ck_cmdbuf_hint(ck_cmdbuf *cb, uint32_t shape_key, int32_t prime)
  ck_cmdbuf_hint: { args: [ptr, u32, i32], returns: i32 },
  // int32_t ck_cmdbuf_commit(ck_cmdbuf *cb)
  ck_cmdbuf_commit: { args: [ptr], returns: i32 },
  // int32_t ck_cmdbuf_wait(ck_cmdbuf *cb, uint32_t timeout_ms)
  ck_cmdbuf_wait: { args: [ptr, u32], returns: i32 },
  // int32_t ck_cmdbuf_status(ck_cmdbuf *cb)
  ck_cmdbuf_status: { args: [ptr], returns: i32 },
  // const char *ck_cmdbuf_error(ck_cmdbuf *cb)
  ck_cmdbuf_error: { args: [ptr], returns: cstring },
  // void ck_cmdbuf_release(ck_cmdbuf *cb)
  ck_cmdbuf_release: { args: [ptr], returns: none },

  // ck_event *ck_event_new(ck_device *dev)
  ck_event_new: { args: [ptr], returns: ptr },
  // uint32_t ck_event_id(ck_event *ev)
  ck_event_id: { args: [ptr], returns: u32 },
  // double ck_event_value(ck_event *ev)
  ck_event_value: { args: [ptr], returns: f64 },
  // int32_t ck_event_set(ck_event *ev, double value)
  ck_event_set: { args: [ptr, f64], returns: i32 },
  // int32_t ck_event_wait(ck_event *ev, double value, uint32_t timeout_ms)
  ck_event_wait: { args: [ptr, f64, u32], returns: i32 },
  // void ck_event_release(ck_event *ev)
  ck_event_release: { args: [ptr], returns: none },

  // Fixed-arity file helpers (metal-shim/include/cherenkov_io.h); negative results are -errno.
  // int32_t ck_open_direct(const char *path, int32_t flags)
  ck_open_direct: { args: [ptr, i32], returns: i32 },
  // int32_t ck_fd_set_nocache(int32_t fd, int32_t on)
  ck_fd_set_nocache: { args: [i32, i32], returns: i32 },
  // int32_t ck_fd_is_direct(int32_t fd)
  ck_fd_is_direct: { args: [i32], returns: i32 },
  // int32_t ck_fd_io_alignment(int32_t fd)
  ck_fd_io_alignment: { args: [i32], returns: i32 },
  // int32_t ck_map_readonly(int32_t fd, double length, void **out)
  ck_map_readonly: { args: [i32, f64, ptr], returns: i32 },
  // int32_t ck_unmap(void *addr, double length)
  ck_unmap: { args: [ptr, f64], returns: i32 },
  // const char *ck_io_error_text(int32_t err)
  ck_io_error_text: { args: [i32], returns: cstring },
} as const;

const ABI_VERSION = 4;
export const CK_OK = 0;
export const CK_ERROR = -1;
export const CK_TIMEOUT = 1;
export const CmdbufStatus = { encoding: 0, committed: 1, completed: 2, failed: 3 } as const;
const STATUS_NAMES = ["encoding", "committed", "completed", "failed"] as const;
export type CmdbufState = (typeof STATUS_NAMES)[number];
/**
 * Where a buffer lives (cherenkov.h's CK_STORAGE_*): "shared" is one memory host and GPU both
 * address; "device" is GPU memory with a host mirror (`bytes` and friends), synchronised by
 * upload()/download(). Only the cuda backend has device buffers; elsewhere "device" is shared.
 */
export type Storage = "shared" | "device";
const STORAGE_CODES: Record<Storage, number> = { shared: 0, device: 1 };

type Symbols = ReturnType<typeof dlopen<typeof SYMBOLS>>["symbols"];

/** A loaded metal-shim library. */
export interface Shim {
  readonly backend: Backend;
  readonly path: string;
  readonly symbols: Symbols;
  /** ck_last_error() of this thread. */
  lastError(): string;
}

/** A native call failed; the message is the shim's own. */
export class ShimError extends Error {
  override name = "ShimError";
}

const KERNELS_DIR = join(import.meta.dir, "..", "kernels");

let pathOverride: string | null = null;
const loaded = new Map<Backend, Shim>();

/** Use this library file instead of resolving one (null: back to resolution). */
export function setShimPath(path: string | null): void {
  pathOverride = path;
  loaded.clear();
}

/** The backend CHERENKOV_BACKEND asks for, or the platform's GPU (metal on macOS, cuda with an NVIDIA GPU), else cpu. */
export function defaultBackend(): Backend {
  const env = process.env.CHERENKOV_BACKEND;
  if (env === "cpu" || env === "metal" || env === "cuda") return env;
  if (env && env !== "reference" && env !== "auto") throw new ShimError(`CHERENKOV_BACKEND=${env}: expected cpu, metal, cuda, reference or auto`);
  if (process.platform === "darwin") return "metal";
  return hasNvidiaGpu() ? "cuda" : "cpu";
}


/** The first bytes of a shared library of this platform: ELF, or Mach-O (thin 64-bit or universal). */
function isLibraryFormat(head: Uint8Array): boolean {
  if (process.platform === "darwin") {
    const magic = new DataView(head.buffer, head.byteOffset, head.byteLength).getUint32(0, false);
    return magic === 0xcffaedfe || magic === 0xcafebabe; // MH_MAGIC_64 as stored little-endian; FAT_MAGIC
  }
  return head[0] === 0x7f && head[1] === 0x45 && head[2] === 0x4c && head[3] === 0x46;
}

/** An explicitly configured library, checked before dlopen runs any of its code. */
function explicitLibrary(setting: string, value: string): string {
  const path = resolve(value); // never a bare name: dlopen would search the system's paths
  let size: number;
  try {
    const st = statSync(path);
    if (!st.isFile()) throw new ShimError(`${setting}=${value}: not a regular file`);
    size = st.size;
  } catch (e) {
    if (e instanceof ShimError) throw e;
    throw new ShimError(`${setting}=${value}: no such file`);
  }
  const head = new Uint8Array(4);
  const fd = openSync(path, "r");
  try {
    readSync(fd, head, 0, 4, 0);
  } finally {
    closeSync(fd);
  }
  if (size < 4 || !isLibraryFormat(head))
    throw new ShimError(`${setting}=${value}: not a ${process.platform === "darwin" ? "Mach-O" : "ELF"} shared library`);
  // dlopen runs a library's constructors: refuse one that does not even name the ABI's
  // entry points (its dynamic string table would) before any of its code runs.
  const text = readFileSync(path).toString("latin1");
  for (const symbol of ["ck_abi_version", "ck_device_open"])
    if (!text.includes(symbol + "\0")) throw new ShimError(`${setting}=${value}: does not export ${symbol}; not a metal-shim library`);
  return path;
}

/** The one library this backend may load here, or an error saying why there is none. */
function resolveLibrary(backend: Backend): string {
  if (pathOverride) return explicitLibrary("setShimPath", pathOverride);
  const fromEnv = process.env.CHERENKOV_SHIM_PATH;
  if (fromEnv) return explicitLibrary("CHERENKOV_SHIM_PATH", fromEnv);
  const problem = libraryProblem(backend);
  if (problem) throw new ShimError(`cherenkov: ${problem}`);
  return localLibraryPath(backend);
}

function traced(symbols: Symbols): Symbols {
  const show = (v: unknown) => (typeof v === "object" && v !== null ? `<${v.constructor.name}>` : String(v));
  const out: Record<string, unknown> = {};
  for (const [name, fn] of Object.entries(symbols) as [string, (...a: unknown[]) => unknown][]) {
    out[name] = (...args: unknown[]) => {
      const result = fn(...args);
      console.error(`[ffi] ${name}(${args.map(show).join(", ")}) -> ${show(result)}`);
      return result;
    };
  }
  return out as Symbols;
}

/** The shim library of a backend, loaded once (lazily). */
export function loadShim(backend: Backend = defaultBackend()): Shim {
  const cached = loaded.get(backend);
  if (cached) return cached;
  const path = resolveLibrary(backend);
  let lib: ReturnType<typeof dlopen<typeof SYMBOLS>>;
  try {
    lib = dlopen(path, SYMBOLS);
  } catch (e) {
    throw new ShimError(`cannot load ${path}: ${e instanceof Error ? e.message.split("\n")[0] : String(e)}`);
  }
  const version = lib.symbols.ck_abi_version();
  if (version !== ABI_VERSION) throw new ShimError(`${path}: ABI version ${version}, expected ${ABI_VERSION}`);
  const symbols = process.env.CHERENKOV_DEBUG_FFI === "1" ? traced(lib.symbols) : lib.symbols;
  const shim: Shim = { backend, path, symbols, lastError: () => String(lib.symbols.ck_last_error()) };
  loaded.set(backend, shim);
  return shim;
}

// ---- helpers over the raw symbols ---------------------------------------------------

function cString(text: string): Uint8Array {
  return new TextEncoder().encode(text + "\0");
}

function check(shim: Shim, status: number): void {
  if (status !== CK_OK) throw new ShimError(shim.lastError());
}

/** A handle returned by the shim, or the shim's error. */
function orThrow(shim: Shim, p: Pointer | bigint | null): Pointer {
  if (!p) throw new ShimError(shim.lastError());
  return (typeof p === "bigint" ? Number(p) : p) as Pointer;
}

export interface DeviceLimits {
  maxWorkingSet: number;
  maxThreadgroupMemory: number;
  maxThreadsPerThreadgroup: number;
  simdWidth: number;
  pageSize: number;
  /** Bytes of the largest single buffer (Metal: maxBufferLength, well below the working set on Apple silicon). */
  maxBufferLength: number;
  /** GPU cores (cuda: SMs; cpu: worker threads); 0 when the backend cannot tell (Metal). */
  gpuCores: number;
  /** How long the OS lets one GPU-side event wait block before it ends the command buffer; 0 = none known. */
  gpuWaitLimitMs: number;
}

/** cherenkov.h's CK_LIMIT_* numbers (ck_device_limit). */
const LIMIT = { maxBufferLength: 0, maxWorkingSet: 1, pageSize: 2, executionWidth: 3, gpuCores: 4, maxThreadsPerThreadgroup: 5, maxThreadgroupMemory: 6, gpuWaitLimitMs: 7 } as const;

/** 1 to 3 dimensions; missing ones are 1. */
export type Dims = number | readonly [number, number?, number?];
export type Binding = Buffer | { buffer: Buffer; offset: number };
/** bindings[i] binds [[buffer(i)]]; leave index 0 empty when passing params. */
export type Bindings = readonly (Binding | null | undefined)[];

export class Device {
  readonly shim: Shim;
  readonly handle: Pointer;
  readonly backend: string;
  readonly name: string;
  readonly limits: DeviceLimits;
  /** Commands (dispatches, signals, waits) encoded into this device's command buffers so far: benchmarks count commands per token with it. */
  commandsEncoded = 0;
  /** Command buffers committed on this device so far (each a host round trip for a step): tests count them per step. */
  commandBuffersCommitted = 0;
  /**
   * Commands in the committed command buffers so far: unlike commandsEncoded, not those of
   * buffers encoded ahead and released unused (a speculative cycle prepares one per accept count).
   */
  commandsCommitted = 0;
  /** Signals and waits in the committed command buffers so far (host/GPU handshakes are a pair each). */
  eventsCommitted = 0;
  #library: Library | null = null;
  #closed = false;

  private constructor(shim: Shim, handle: Pointer) {
    const s = shim.symbols;
    this.shim = shim;
    this.handle = handle;
    this.backend = String(s.ck_device_backend(handle));
    this.name = String(s.ck_device_name(handle));
    this.limits = {
      maxWorkingSet: s.ck_device_max_working_set(handle),
      maxThreadgroupMemory: s.ck_device_max_threadgroup_memory(handle),
      maxThreadsPerThreadgroup: s.ck_device_max_threads_per_threadgroup(handle),
      simdWidth: s.ck_device_simd_width(handle),
      pageSize: s.ck_device_page_size(handle),
      maxBufferLength: s.ck_device_limit(handle, LIMIT.maxBufferLength),
      gpuCores: s.ck_device_limit(handle, LIMIT.gpuCores),
      gpuWaitLimitMs: s.ck_device_limit(handle, LIMIT.gpuWaitLimitMs),
    };
  }

  static open(options: { backend?: Backend } = {}): Device {
    const shim = loadShim(options.backend);
    return new Device(shim, orThrow(shim, shim.symbols.ck_device_open()));
  }

  /** How long a GPU-side event wait may block before its command buffer fails. */
  setWaitTimeout(ms: number): void {
    this.shim.symbols.ck_device_set_wait_timeout(this.handle, ms);
  }

  /**
   * How CommandBuffer.wait() waits: "gpu" (the GPU blocks on the event: one command buffer) or
   * "host" (ck_encode_wait_host: the rest is submitted once the event is reached, so the GPU
   * never waits; for waits that may outlast the OS's limit, limits.gpuWaitLimitMs).
   */
  waitMode: "gpu" | "host" = "gpu";

  /** A zero-filled buffer (length rounded up to the page size); shared unless `storage` says "device". */
  buffer(length: number, storage: Storage = "shared"): Buffer {
    const s = this.shim.symbols;
    const h = storage === "shared" ? s.ck_buffer_new(this.handle, length) : s.ck_buffer_new_storage(this.handle, length, STORAGE_CODES[storage]);
    return new Buffer(this.shim, orThrow(this.shim, h), null);
  }

  /**
   * Wraps page-aligned memory (e.g. a Bun.mmap view) without copying; keeps `memory` alive.
   * With "device" (read-only data such as weights), cuda copies it to GPU memory once and keeps
   * `memory` as the host mirror; elsewhere it is the same zero-copy wrap.
   */
  wrap(memory: NodeJS.TypedArray, storage: Storage = "shared"): Buffer {
    const p = addressOf(memory);
    const s = this.shim.symbols;
    const h = storage === "shared" ? s.ck_buffer_wrap(this.handle, p, memory.byteLength) : s.ck_buffer_wrap_storage(this.handle, p, memory.byteLength, STORAGE_CODES[storage]);
    return new Buffer(this.shim, orThrow(this.shim, h), memory);
  }

  /** The kernel library (Metal: compiled from `dir`; cpu: built into the shim). */
  library(dir: string = KERNELS_DIR): Library {
    if (dir === KERNELS_DIR && this.#library) return this.#library;
    const lib = new Library(this.shim, orThrow(this.shim, this.shim.symbols.ck_library_load(this.handle, cString(dir))));
    if (dir === KERNELS_DIR) this.#library = lib;
    return lib;
  }

  /** A pipeline of the default library, by kernel name (cached). */
  pipeline(name: string): Pipeline {
    return this.library().pipeline(name);
  }

  commandBuffer(): CommandBuffer {
    return new CommandBuffer(this, orThrow(this.shim, this.shim.symbols.ck_cmdbuf_begin(this.handle)));
  }

  event(): Event {
    return new Event(this.shim, orThrow(this.shim, this.shim.symbols.ck_event_new(this.handle)));
  }

  /** Waits for committed command buffers, then frees the device. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#library?.release();
    this.shim.symbols.ck_device_close(this.handle);
  }

  [Symbol.dispose](): void {
    this.close();
  }
}

export class Library {
  readonly #pipelines = new Map<string, Pipeline>();
  constructor(
    readonly shim: Shim,
    readonly handle: Pointer,
  ) {}

  kernelNames(): string[] {
    const s = this.shim.symbols;
    const n = s.ck_library_kernel_count(this.handle);
    return Array.from({ length: n }, (_, i) => String(s.ck_library_kernel_name(this.handle, i)));
  }

  pipeline(name: string): Pipeline {
    let p = this.#pipelines.get(name);
    if (!p) {
      const h = orThrow(this.shim, this.shim.symbols.ck_pipeline_get(this.handle, cString(name)));
      p = new Pipeline(name, h, this.shim.symbols.ck_pipeline_max_threads(h));
      this.#pipelines.set(name, p);
    }
    return p;
  }

  /** Names of the pipelines built so far (each is built on first use). */
  builtPipelines(): string[] {
    return [...this.#pipelines.keys()];
  }

  release(): void {
    this.#pipelines.clear();
    this.shim.symbols.ck_library_release(this.handle);
  }
}

export class Pipeline {
  /** The handle as two 32-bit halves (a recorded tape stores them). */
  readonly handleLo: number;
  readonly handleHi: number;
  constructor(
    readonly name: string,
    readonly handle: Pointer,
    readonly maxThreads: number,
  ) {
    [this.handleLo, this.handleHi] = handleHalves(handle);
  }
}

/** A handle as the two 32-bit halves a ck_binding or a tape stores. */
function handleHalves(handle: Pointer): [number, number] {
  return [Number(handle) % 0x100000000, Math.floor(Number(handle) / 0x100000000)];
}

/** A shared buffer with zero-copy typed views (created once, then reused). */
export class Buffer {
  readonly length: number;
  readonly contents: Pointer;
  /** The handle as the two 32-bit halves a ck_binding stores (precomputed for dispatch). */
  readonly handleLo: number;
  readonly handleHi: number;
  #bytes: Uint8Array | null = null;
  #f32: Float32Array | null = null;
  #u32: Uint32Array | null = null;
  #i32: Int32Array | null = null;
  #released = false;

  constructor(
    readonly shim: Shim,
    readonly handle: Pointer,
    /** The wrapped host memory, kept reachable while the buffer lives. */
    readonly wrapped: ArrayBufferView | null,
  ) {
    this.length = shim.symbols.ck_buffer_length(handle);
    [this.handleLo, this.handleHi] = handleHalves(handle);
    this.contents = orThrow(shim, shim.symbols.ck_buffer_contents(handle));
    this.storage = shim.symbols.ck_buffer_storage(handle) === STORAGE_CODES.device ? "device" : "shared";
  }

  /** Where the buffer lives; "device" only on cuda (see Storage). */
  readonly storage: Storage;

  /** Device buffers: copies [offset, offset+length) of the host mirror to GPU memory (returns when there); shared: checks the range only. */
  upload(offset = 0, length = this.length - offset): void {
    check(this.shim, this.shim.symbols.ck_buffer_upload(this.handle, offset, length));
  }

  /** Device buffers: copies [offset, offset+length) of GPU memory to the host mirror (after the writers completed). */
  download(offset = 0, length = this.length - offset): void {
    check(this.shim, this.shim.symbols.ck_buffer_download(this.handle, offset, length));
  }

  /** A view of [offset, offset+length) of the contents, for buffers too large for one view (`bytes`). */
  range(offset: number, length: number): Uint8Array {
    if (!(offset >= 0 && length >= 0 && offset + length <= this.length)) throw new RangeError(`range [${offset}, +${length}) is not inside the buffer's ${this.length} bytes`);
    return new Uint8Array(toArrayBuffer(this.contents, offset, length));
  }

  get bytes(): Uint8Array {
    this.#bytes ??= new Uint8Array(toArrayBuffer(this.contents, 0, this.length));
    return this.#bytes;
  }
  get f32(): Float32Array {
    this.#f32 ??= new Float32Array(this.bytes.buffer, this.bytes.byteOffset, this.length >>> 2);
    return this.#f32;
  }
  get u32(): Uint32Array {
    this.#u32 ??= new Uint32Array(this.bytes.buffer, this.bytes.byteOffset, this.length >>> 2);
    return this.#u32;
  }
  get i32(): Int32Array {
    this.#i32 ??= new Int32Array(this.bytes.buffer, this.bytes.byteOffset, this.length >>> 2);
    return this.#i32;
  }

  /** Whether release() was called (a recorded step checks its buffers before replaying). */
  get released(): boolean {
    return this.#released;
  }

  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.shim.symbols.ck_buffer_release(this.handle);
  }

  [Symbol.dispose](): void {
    this.release();
  }
}

export const MAX_BINDINGS = 31;

/** Extent `axis` of a grid or threadgroup size. */
export const dim = (d: Dims, axis: 0 | 1 | 2): number => (typeof d === "number" ? (axis === 0 ? d : 1) : (d[axis] ?? 1));

/**
 * Packs `bindings` (from index `first`; the indices below it unbound) as ck_binding structs
 * (buffer handle, u64 offset: four u32 each) into `out` from word `at`; returns the count.
 * No allocation: it runs for every command of every step.
 */
export function packBindings(out: Uint32Array, at: number, bindings: Bindings, first: number): number {
  const count = first + bindings.length;
  if (count > MAX_BINDINGS) throw new ShimError(`${count} bindings: at most ${MAX_BINDINGS}`);
  for (let i = 0; i < count; i++) {
    const binding = i < first ? null : bindings[i - first];
    const w = at + 4 * i;
    if (!binding) {
      out[w] = out[w + 1] = out[w + 2] = out[w + 3] = 0;
      continue;
    }
    const buffer = binding instanceof Buffer ? binding : binding.buffer;
    const offset = binding instanceof Buffer ? 0 : binding.offset;
    out[w] = buffer.handleLo;
    out[w + 1] = buffer.handleHi;
    out[w + 2] = offset % 0x100000000;
    out[w + 3] = Math.floor(offset / 0x100000000);
  }
  return count;
}

/** Records commands; commit() queues them; waitUntilCompleted() throws the native error. */
export class CommandBuffer {
  readonly id: number;
  readonly #shim: Shim;
  // ck_binding[31]: {buffer pointer, u64 offset} as four u32 each.
  readonly #bindings = new Uint32Array(MAX_BINDINGS * 4);
  #released = false;
  /** Commands encoded into this buffer, and of them signals and waits. */
  #commands = 0;
  #events = 0;

  constructor(
    readonly device: Device,
    readonly handle: Pointer,
  ) {
    this.#shim = device.shim;
    this.id = this.#shim.symbols.ck_cmdbuf_id(handle);
  }

  /**
   * dispatchThreadgroups: `grid` counts threadgroups of `threadgroup` threads. `bindings[i]`
   * goes to [[buffer(first + i)]] (the indices below `first` are unbound: params take 0).
   */
  dispatch(pipeline: Pipeline | string, grid: Dims, threadgroup: Dims, bindings: Bindings, params?: Uint8Array, first = 0): this {
    return this.#dispatch(false, pipeline, grid, threadgroup, bindings, params, first);
  }

  /** dispatchThreads: `threads` counts threads; edge threadgroups may be partial. */
  dispatchThreads(pipeline: Pipeline | string, threads: Dims, threadgroup: Dims, bindings: Bindings, params?: Uint8Array, first = 0): this {
    return this.#dispatch(true, pipeline, threads, threadgroup, bindings, params, first);
  }

  // Runs for every command of every step: no allocation (no spread arrays, no dims tuples).
  #dispatch(byThreads: boolean, pipeline: Pipeline | string, grid: Dims, tg: Dims, bindings: Bindings, params: Uint8Array | undefined, first: number): this {
    const pipe = typeof pipeline === "string" ? this.device.pipeline(pipeline) : pipeline;
    const count = packBindings(this.#bindings, 0, bindings, first);
    const s = this.#shim.symbols;
    const encode = byThreads ? s.ck_encode_dispatch_threads : s.ck_encode_dispatch;
    const status = encode(
      this.handle,
      pipe.handle,
      dim(grid, 0),
      dim(grid, 1),
      dim(grid, 2),
      dim(tg, 0),
      dim(tg, 1),
      dim(tg, 2),
      this.#bindings,
      count,
      params ?? null,
      params ? params.byteLength : 0,
    );
    check(this.#shim, status);
    this.device.commandsEncoded++;
    this.#commands++;
    return this;
  }

  /**
   * Encodes `commands` recorded dispatches packed as `words` (metal-shim/include/cherenkov_tape.h;
   * lib/gpu/tape.ts records them) with one call: as if each were dispatched again.
   */
  encodeTape(words: Uint32Array, commands: number): this {
    if (words.length === 0) return this;
    check(this.#shim, this.#shim.symbols.ck_encode_tape(this.handle, words, words.length));
    this.device.commandsEncoded += commands;
    this.#commands += commands;
    return this;
  }

  /** After everything before it: set `event` to `value`. */
  signal(event: Event, value: number): this {
    check(this.#shim, this.#shim.symbols.ck_encode_signal(this.handle, event.handle, value));
    this.device.commandsEncoded++;
    this.#commands++;
    this.#events++;
    return this;
  }

  /** Before anything after it: block until `event` >= `value`. */
  wait(event: Event, value: number): this {
    const s = this.#shim.symbols;
    check(this.#shim, (this.device.waitMode === "host" ? s.ck_encode_wait_host : s.ck_encode_wait)(this.handle, event.handle, value));
    this.device.commandsEncoded++;
    this.#commands++;
    this.#events++;
    return this;
  }

  /**
   * Tells a backend that replays command buffers (CUDA graphs) which recording this one was
   * encoded from (`shapeKey`, nonzero: buffers of one key share a replayed structure), and with
   * `prime` to build that structure ahead in the background (call it after the last command).
   * The CPU and Metal backends ignore it.
   */
  hint(shapeKey: number, prime: boolean): this {
    check(this.#shim, this.#shim.symbols.ck_cmdbuf_hint(this.handle, shapeKey >>> 0, prime ? 1 : 0));
    return this;
  }

  commit(): this {
    check(this.#shim, this.#shim.symbols.ck_cmdbuf_commit(this.handle));
    this.device.commandBuffersCommitted++;
    this.device.commandsCommitted += this.#commands;
    this.device.eventsCommitted += this.#events;
    return this;
  }

  get status(): CmdbufState {
    return STATUS_NAMES[this.#shim.symbols.ck_cmdbuf_status(this.handle)] ?? "failed";
  }

  /** Why the command buffer failed ("" unless it did). */
  get error(): string {
    return String(this.#shim.symbols.ck_cmdbuf_error(this.handle));
  }

  /** Blocks until completion; throws the native error on failure, or after timeoutMs. */
  waitUntilCompleted(timeoutMs = 60_000): void {
    if (!this.waitFor(timeoutMs)) throw new ShimError(`command buffer ${this.id} did not complete within ${timeoutMs} ms`);
  }

  /**
   * Blocks until completion or for timeoutMs at most: whether it completed; throws the native
   * error on failure. For a wait in slices (an engine step), where running out a slice is the
   * common case, not an error.
   */
  waitFor(timeoutMs: number): boolean {
    const status = this.#shim.symbols.ck_cmdbuf_wait(this.handle, timeoutMs);
    if (status === CK_OK) return true;
    if (status === CK_TIMEOUT) return false;
    throw new ShimError(this.#shim.lastError());
  }

  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.#shim.symbols.ck_cmdbuf_release(this.handle);
  }

  [Symbol.dispose](): void {
    this.release();
  }
}

/** A shared event: the host reads, sets and waits for its value (integers below 2^53). */
export class Event {
  readonly id: number;
  #released = false;

  constructor(
    readonly shim: Shim,
    readonly handle: Pointer,
  ) {
    this.id = shim.symbols.ck_event_id(handle);
  }

  get value(): number {
    return this.shim.symbols.ck_event_value(this.handle);
  }

  /** Sets the value; releases GPU waits for values up to it. A value below the current one is ignored (events only move forward). */
  set(value: number): void {
    check(this.shim, this.shim.symbols.ck_event_set(this.handle, value));
  }

  /** Blocks until value >= `value`; false after timeoutMs. */
  waitFor(value: number, timeoutMs: number): boolean {
    const status = this.shim.symbols.ck_event_wait(this.handle, value, timeoutMs);
    if (status === CK_ERROR) throw new ShimError(this.shim.lastError());
    return status === CK_OK;
  }

  release(): void {
    if (this.#released) return;
    this.#released = true;
    this.shim.symbols.ck_event_release(this.handle);
  }

  [Symbol.dispose](): void {
    this.release();
  }
}
