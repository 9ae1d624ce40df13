// A hashing thread of HashWorkers (hash-workers.ts): hashes a range of this process's memory,
// given by address, in place (no copy): expert records in pool slots.
import { toArrayBuffer } from "bun:ffi";
import { checksum } from "../model/checksum.ts";

declare const self: Worker;

self.onmessage = (ev: MessageEvent<{ id: number; addr: number; len: number }>) => {
  const { id, addr, len } = ev.data;
  const bytes = new Uint8Array(toArrayBuffer(addr as never, 0, len));
  self.postMessage({ id, sum: checksum(bytes) });
};
