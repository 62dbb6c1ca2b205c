// core/cuda_dispatch.h: NT_CUDA(call) runs a CUDA launcher in a build with the CUDA backend;
// in a build without it the call is not compiled and reaching it throws (no tensor can be on a
// GPU there, so it is never reached in practice).
#pragma once

#include "core/check.h"

#if NORMTAPE_WITH_CUDA
#define NT_CUDA(...) __VA_ARGS__
#else
#define NT_CUDA(...) NT_CHECK_AS(DeviceError, false, "expected a cpu tensor: this build of normtape has no CUDA backend")
#endif
