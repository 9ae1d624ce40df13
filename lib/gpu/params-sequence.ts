// Param structs of the sequence kernel families (kernels/{conv,deltanet,rope,kv,qsa,attention,ple}.metal).
// Plain data: params.ts lays them out and checks them. Rules are in params.ts's header.
import type { ParamFamily } from "./params.ts";

export const sequenceParams = {} as const satisfies ParamFamily;
