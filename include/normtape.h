// normtape.h: the umbrella header. Everything public, in namespace normtape:
//   core/  Tensor, TensorOptions, factories, memory_stats, autograd (backward, NoGradGuard, saved_bytes)
//   ops/   add, mul, scale, gelu, sum, mean, matmul, linear, causal_self_attention, embedding,
//          cross_entropy, layer_norm, rms_norm, SavePolicy
//   nn/    Module, Linear, Embedding, LayerNorm, RMSNorm, GPT, AdamW, clip_grad_norm_, checkpoints
#pragma once

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/tensor.h"
#include "nn/adamw.h"
#include "nn/checkpoint.h"
#include "nn/gpt.h"
#include "nn/module.h"
#include "nn/norm.h"
#include "ops/ops.h"
