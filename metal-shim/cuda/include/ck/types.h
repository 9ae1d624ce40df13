// Scalar and vector types of MSL for the CUDA backend prelude (nvcc): the shared ones
// (metal-shim/common/prelude/types.h), which stay in namespace ckm (see ck/names.h).
#pragma once
#include "prelude/types.h"
