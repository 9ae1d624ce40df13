// The host's copies of the kernels' size limits (lib/gpu/limits.ts, lib/gpu/experts.ts) against
// the #defines they mirror: the host picks kernel forms and refuses configs by them, so a
// kernel constant changed alone would route a model to a form that cannot hold it.
import { expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { MOE_MAX_EXPERTS, MOE_MAX_TOPK, ROUTER_FAST_SLOTS, ROUTER_WIDE_SLOTS } from "../../lib/gpu/experts.ts";
import { HC_MAX_STREAMS, HC_SMALL_STREAMS } from "../../lib/gpu/limits.ts";

const KERNELS = join(import.meta.dir, "..", "..", "kernels");

/** The integer a `#define NAME value` line of kernels/file gives NAME. */
function defined(file: string, name: string): number {
  const m = new RegExp(`^#define ${name} (\\d+)\\b`, "m").exec(readFileSync(join(KERNELS, file), "utf8"));
  if (!m) throw new Error(`kernels/${file}: no #define ${name} <integer>`);
  return Number(m[1]);
}

test.each([
  ["moe.metal", "MOE_MAX_EXPERTS", MOE_MAX_EXPERTS],
  ["moe.metal", "MOE_MAX_TOPK", MOE_MAX_TOPK],
  ["moe.metal", "ROUTER_FAST_SLOTS", ROUTER_FAST_SLOTS],
  ["moe.metal", "ROUTER_WIDE_SLOTS", ROUTER_WIDE_SLOTS],
  ["hc.h", "HC_MAX_STREAMS", HC_MAX_STREAMS],
  ["hc-site.h", "HC_SMALL_STREAMS", HC_SMALL_STREAMS],
] as const)("kernels/%s #define %s is the host's %i", (file, name, host) => {
  expect(defined(file, name)).toBe(host);
});
