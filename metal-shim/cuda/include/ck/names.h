// Included by each generated file inside its kernels' namespace (no include guard): MSL's
// type names from ckm, declared here so that they hide nvcc's global float4, uint2...
using ckm::half;
using ckm::bfloat;
using ckm::ck_vec;
#define CK_NAMES(name) using ckm::name##2; using ckm::name##3; using ckm::name##4;
CK_NAMES(float)
CK_NAMES(half)
CK_NAMES(bfloat)
CK_NAMES(int)
CK_NAMES(uint)
CK_NAMES(short)
CK_NAMES(ushort)
CK_NAMES(char)
CK_NAMES(uchar)
CK_NAMES(long)
CK_NAMES(ulong)
CK_NAMES(bool)
#undef CK_NAMES
