// A small, fast, seeded generator (splitmix32 stream) so synthetic models are reproducible
// bit for bit on every machine. Not for cryptography.

/** 32-bit FNV-1a of a string, used to give every tensor its own stream. */
export function hashString(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) {
    h ^= s.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

export class Rng {
  private state: number;
  constructor(seed: number, stream = "") {
    this.state = (Math.imul(seed >>> 0, 0x9e3779b1) ^ hashString(stream)) >>> 0;
  }
  /** Next u32. */
  nextU32(): number {
    let z = (this.state = (this.state + 0x9e3779b9) | 0);
    z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
    z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
    return (z ^ (z >>> 16)) >>> 0;
  }
  /** Uniform in [0, 1). */
  next(): number {
    return this.nextU32() / 4294967296;
  }
  /** Uniform in [-1, 1). */
  symmetric(): number {
    return this.next() * 2 - 1;
  }
  /** Approximately standard normal (sum of four uniforms, rescaled): cheap and bounded. */
  normal(): number {
    return (this.next() + this.next() + this.next() + this.next() - 2) * 1.7320508;
  }
  /** Integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.next() * n);
  }
}
