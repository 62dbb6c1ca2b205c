// ops/ops.h: the index of ops. Each op is one unit: ops/<op>.h (API and contract), ops/<op>.cpp
// (checks, CPU kernel, autograd node) and ops/<op>.cu (CUDA kernels); layer_norm and rms_norm
// share ops/norm/norm.cpp and ops/norm_*.cu, and ops/norm/norm_policy.h holds their save policy.
#pragma once

#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/cast.h"
#include "ops/cross_entropy.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/norm/layer_norm.h"
#include "ops/linear_cross_entropy.h"
#include "ops/matmul.h"
#include "ops/norm/norm_policy.h"
#include "ops/reduce.h"
#include "ops/rotary.h"
#include "ops/softmax.h"
#include "ops/norm/rms_norm.h"
