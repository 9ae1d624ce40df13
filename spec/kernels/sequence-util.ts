// Helpers of the sequence-family kernel tests (deltanet, attention, ple) beyond harness.ts.
import { worstErrors } from "./harness.ts";

/** With CHERENKOV_KERNEL_ERRORS=1, prints the largest error seen per kernel label (call in afterAll). */
export function printWorstErrors(): void {
  if (process.env.CHERENKOV_KERNEL_ERRORS !== "1") return;
  for (const [k, v] of [...worstErrors()].sort())
    console.log(`[kernel-error] ${k}\tmax abs ${v.maxAbs.toExponential(2)}\tmax rel ${v.maxRel.toExponential(2)}`);
}
