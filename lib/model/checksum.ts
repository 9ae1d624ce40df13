// Checksums of tensors, expert records and PLE tables: xxhash64 (Bun's native hash), written
// as 16 lowercase hex digits so the manifest stays plain JSON.

export function checksum(bytes: Uint8Array): string {
  return Bun.hash.xxHash64(bytes).toString(16).padStart(16, "0");
}
