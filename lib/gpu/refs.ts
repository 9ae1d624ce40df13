// Where every weight of a loaded model lives on the device: TensorRefs into the wrapped
// dense.bin (and ple.bin), grouped the way the step walks them (per layer, the head, the
// MTP layer). Built once at load; the encode functions only read it.
import type { ModelConfig } from "../model/config.ts";
import type { ModelFiles } from "../model/format.ts";
import type { Buffer } from "../shim.ts";
import type { TensorRef } from "./dispatch.ts";
import type { HcSiteRefs } from "./hyperconnection.ts";
import type { PleTablesRef } from "./ple.ts";
import type { SharedExpertRefs } from "./experts.ts";

export interface AttentionRefs {
  q: TensorRef;
  gate: TensorRef;
  k: TensorRef;
  v: TensorRef;
  qNorm: TensorRef;
  kNorm: TensorRef;
  o: TensorRef;
  /** The QSA indexer; null for dense attention (and always for the MTP layer). */
  qsa: { iq: TensorRef; ik: TensorRef; ikNorm: TensorRef; iw: TensorRef } | null;
}

export interface DeltaNetRefs {
  qkv: TensorRef;
  z: TensorRef;
  b: TensorRef;
  a: TensorRef;
  conv: TensorRef;
  aLog: TensorRef;
  dtBias: TensorRef;
  norm: TensorRef;
  out: TensorRef;
}

export interface PleRefs {
  k: TensorRef;
  kBias: TensorRef;
  v: TensorRef;
  vBias: TensorRef;
  kNorm: TensorRef;
  qNorm: TensorRef;
  convNorm: TensorRef;
  conv: TensorRef;
  tables: PleTablesRef;
}

export interface MoeRefs {
  router: TensorRef;
  shared: SharedExpertRefs | null;
}

export interface LayerRefs {
  index: number;
  type: "deltanet" | "attention";
  ple: PleRefs | null;
  /** Hyper-connection sites (null with one stream: the plain residual). */
  hcMixer: HcSiteRefs | null;
  mixerNorm: TensorRef;
  deltanet: DeltaNetRefs | null;
  attention: AttentionRefs | null;
  hcMoe: HcSiteRefs | null;
  moeNorm: TensorRef;
  moe: MoeRefs;
}

export interface MtpRefs {
  embedNorm: TensorRef;
  hiddenNorm: TensorRef;
  fc: TensorRef;
  mixerNorm: TensorRef;
  attention: AttentionRefs;
  moeNorm: TensorRef;
  moe: MoeRefs;
  norm: TensorRef;
}

export interface ModelRefs {
  embed: TensorRef;
  layers: LayerRefs[];
  hcHead: HcSiteRefs | null;
  finalNorm: TensorRef;
  lmHead: TensorRef;
  mtp: MtpRefs | null;
  /** Every matrix weight of the layer. */
  all: TensorRef[];
}

/** TensorRefs of every dense tensor of `files` in `dense` (the wrapped dense.bin) and `ple` (the wrapped ple.bin). */
export function modelRefs(files: ModelFiles, dense: Buffer, ple: Buffer | null): ModelRefs {
  const c: ModelConfig = files.config;
  const all: TensorRef[] = [];
  const t = (name: string): TensorRef => {
    const info = files.tensorInfo(name);
    const ref = { buffer: dense, offset: info.offset, dtype: info.dtype, shape: info.shape };
    all.push(ref);
    return ref;
  };
  const site = (p: string): HcSiteRefs | null => (c.hc.streams === 1 ? null : { fn: t(`${p}.fn`), base: t(`${p}.base`), scale: t(`${p}.scale`) });
  const attention = (p: string, qsa: boolean): AttentionRefs => ({
    q: t(`${p}attn.q`),
    gate: t(`${p}attn.gate`),
    k: t(`${p}attn.k`),
    v: t(`${p}attn.v`),
    qNorm: t(`${p}attn.q_norm`),
    kNorm: t(`${p}attn.k_norm`),
    o: t(`${p}attn.o`),
    qsa: qsa && c.attention.qsa ? { iq: t(`${p}attn.iq`), ik: t(`${p}attn.ik`), ikNorm: t(`${p}attn.ik_norm`), iw: t(`${p}attn.iw`) } : null,
  });
  const moe = (p: string): MoeRefs => ({
    router: t(`${p}moe.router`),
    shared:
      c.moe.shared_intermediate > 0
        ? { gate: t(`${p}moe.shared_gate`), up: t(`${p}moe.shared_up`), down: t(`${p}moe.shared_down`), expertGate: t(`${p}moe.shared_expert_gate`) }
        : null,
  });
  const pleTables = (l: number): PleTablesRef => {
    const m = files.manifest.ple;
    const p = c.ple!;
    if (!m || !ple) throw new Error(`layer ${l} has PLE but the model has no ple.bin`);
    const offsets: number[] = [];
    p.orders.forEach((_, o) => {
      for (let j = 0; j < p.heads; j++) {
        const e = m.tables.find((x) => x.layer === l && x.order_index === o && x.head === j);
        if (!e) throw new Error(`ple.bin: no table for layer ${l} order ${o} head ${j}`);
        offsets.push(e.offset);
      }
    });
    return { buffer: ple, dtype: m.dtype, offsets };
  };
  const layers = c.layer_types.map((type, l): LayerRefs => {
    const p = `layers.${l}.`;
    const hasPle = !!c.ple && c.ple.layers.includes(l);
    return {
      index: l,
      type,
      ple: hasPle
        ? {
            k: t(`${p}ple.k`),
            kBias: t(`${p}ple.k_bias`),
            v: t(`${p}ple.v`),
            vBias: t(`${p}ple.v_bias`),
            kNorm: t(`${p}ple.k_norm`),
            qNorm: t(`${p}ple.q_norm`),
            convNorm: t(`${p}ple.conv_norm`),
            conv: t(`${p}ple.conv`),
            tables: pleTables(l),
          }
        : null,
      hcMixer: site(`${p}hc_mixer`),
      mixerNorm: t(`${p}mixer_norm`),
      deltanet:
        type === "deltanet"
          ? {
              qkv: t(`${p}dn.qkv`),
              z: t(`${p}dn.z`),
              b: t(`${p}dn.b`),
              a: t(`${p}dn.a`),
              conv: t(`${p}dn.conv`),
              aLog: t(`${p}dn.A_log`),
              dtBias: t(`${p}dn.dt_bias`),
              norm: t(`${p}dn.norm`),
              out: t(`${p}dn.out`),
            }
          : null,
      attention: type === "attention" ? attention(p, true) : null,
      hcMoe: site(`${p}hc_moe`),
      moeNorm: t(`${p}moe_norm`),
      moe: moe(p),
    };
  });
  const embed = t("embed");
  const refs: ModelRefs = {
    embed,
    layers,
    hcHead: c.hc.streams === 1 ? null : { fn: t("hc_head.fn"), base: t("hc_head.base"), scale: t("hc_head.scale") },
    finalNorm: t("final_norm"),
    lmHead: c.tie_embeddings ? embed : t("lm_head"),
    mtp: c.mtp
      ? {
          embedNorm: t("mtp.embed_norm"),
          hiddenNorm: t("mtp.hidden_norm"),
          fc: t("mtp.fc"),
          mixerNorm: t("mtp.mixer_norm"),
          attention: attention("mtp.", false),
          moeNorm: t("mtp.moe_norm"),
          moe: moe("mtp."),
          norm: t("mtp.norm"),
        }
      : null,
    all,
  };
  return refs;
}

