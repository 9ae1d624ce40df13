// Scalar and vector types of MSL for the CPU backend prelude: the shared ones
// (metal-shim/common/prelude/types.h), in the global namespace where kernels and the
// generated bindings name them.
#pragma once
#include "prelude/types.h"

using namespace ckm;
