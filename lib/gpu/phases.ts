// Per-phase timings of the GPU step, as the host sees them (the shim has no GPU timestamps):
// each step records when it was encoded and committed, and per MoE site when the host saw
// the GPU's signal, how long deciding and publishing the slot table took and how long it
// waited for reads; the numbers are added to the PhaseTimer only after the step's normal
// completion wait, so a timing never waits on anything itself.
//
// Phases (PhaseTimer keys):
//   encode      recording the command buffer
//   gpu-wait    the host blocked until a site's signal (the GPU computing up to that router)
//   handshake   signal seen -> event set, IO waits excluded (the host's part of a round trip)
//   io-wait     awaiting a site's reads (misses, or prefetches not landed yet; ~0 when all hit)
//   tail        last release -> completion (the last experts, final read, logits)
//   gpu         step wall time minus the host's handshake and IO time: the GPU working or queued
//   step        commit -> completion
//   prepare     encoding the next step ahead while the GPU runs this one (Engine's prepared
//               steps and cycles); prepare-overran: those that ended after the GPU was done,
//               so the GPU sat idle for part of them (count = steps, ms = their whole prepare)
import { LatencyHistogram, type HandshakeSummary, type PhaseTimer } from "./telemetry.ts";

/** What the host observed at one MoE site. */
export interface SiteTiming {
  /** Expert layer of the site (trunk layer, or num_layers for the MTP head). */
  layer: number;
  waitMs: number;
  handshakeMs: number;
  ioMs: number;
}

/** Collects one step's timings; `finish` adds them to the timers. */
export class StepTimeline {
  private readonly t0 = performance.now();
  private committed = 0;
  private released = 0;
  readonly sites: SiteTiming[] = [];
  encodeMs = 0;
  private prepare: { ms: number; overran: boolean } | null = null;

  markCommitted(): void {
    this.committed = performance.now();
    this.encodeMs = this.committed - this.t0;
  }

  /** The host's work after the commit (the next step encoded ahead); `overran`: the GPU was done before it ended. */
  markPrepared(ms: number, overran: boolean): void {
    this.prepare = { ms, overran };
  }

  site(timing: SiteTiming): void {
    this.sites.push(timing);
    this.released = performance.now();
  }

  /** Adds the step to `phases` and the per-layer handshake histograms (after the completion wait). */
  finish(phases: PhaseTimer, handshakes: HandshakeStats): { stepMs: number } {
    const end = performance.now();
    const stepMs = end - this.committed;
    phases.add("encode", this.encodeMs);
    let host = 0;
    for (const s of this.sites) {
      phases.add("gpu-wait", s.waitMs);
      phases.add("handshake", s.handshakeMs);
      phases.add("io-wait", s.ioMs);
      handshakes.add(s.layer, s.handshakeMs);
      host += s.handshakeMs + s.ioMs;
    }
    if (this.sites.length) phases.add("tail", end - this.released);
    phases.add("gpu", Math.max(0, stepMs - host));
    phases.add("step", stepMs);
    if (this.prepare) {
      phases.add("prepare", this.prepare.ms);
      if (this.prepare.overran) phases.add("prepare-overran", this.prepare.ms);
    }
    return { stepMs };
  }
}

/** Handshake latency (signal seen -> GPU released, IO excluded) per expert layer. */
export class HandshakeStats {
  private readonly perLayer: LatencyHistogram[];
  private readonly all = new LatencyHistogram();

  constructor(readonly layers: number) {
    this.perLayer = Array.from({ length: layers }, () => new LatencyHistogram());
  }

  add(layer: number, ms: number): void {
    this.perLayer[layer]?.addMs(ms);
    this.all.addMs(ms);
  }

  summary(): HandshakeSummary {
    return { all: this.all.summary(), perLayer: this.perLayer.map((h) => h.summary()) };
  }

  reset(): void {
    this.all.reset();
    for (const h of this.perLayer) h.reset();
  }
}
