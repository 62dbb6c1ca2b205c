// normtape.h: the umbrella header. Everything public, in namespace normtape:
//   core/  Tensor, TensorOptions, factories, memory_stats and the memory trace, autograd (backward,
//          NoGradGuard, saved_bytes, saved_tensors_report, SavedTensorHooks, SaveOnCpu, checkpoint,
//          NamedScope), anomaly detection, the cpu thread count (set_num_threads), CUDAGraph
//   ops/   add, mul, scale, gelu, relu_squared, swiglu, softmax, dropout, sum, mean, matmul, linear, linear_gelu,
//          causal_self_attention, rotary_embedding, embedding, cross_entropy, layer_norm, rms_norm,
//          layer_norm_fn, rms_norm_fn (the norm with the residual add), SavePolicy
//   nn/    Module (named_modules, apply, ModuleScope), Linear, Embedding, Dropout, LayerNorm, RMSNorm,
//          set_save_policy, GPT, AdamW, clip_grad_norm_, safetensors, checkpoints, learning-rate
//          schedules (ConstantLR, WarmupCosineLR, StepLR), Batcher
//   NORMTAPE_VERSION (and _MAJOR, _MINOR, _PATCH), version()
// Include this header, not the ones below: it is what a consumer of the installed package writes.
//
// Note [Exported symbols]: the library compiles with hidden visibility; what is declared between
// the pragmas below (and nothing else) has default visibility, so it is what libnormtape.so
// exports. The library's own sources get this header force-included (CMakeLists.txt), so each
// definition sees its public declaration here first. A new public header goes in this list.
// The pragma does not reach a function template at namespace scope whose instantiations the
// library compiles (from_vector): such a template carries [[gnu::visibility("default")]] itself.
#pragma once

#pragma GCC visibility push(default)

#include "core/activation_checkpoint.h"
#include "core/allocator.h"
#include "core/anomaly.h"
#include "core/autograd.h"
#include "core/check.h"
#include "core/cuda_graph.h"
#include "core/distributed.h"
#include "core/dry_run.h"
#include "core/named_scope.h"
#include "core/parallel.h"
#include "core/save_on_cpu.h"
#include "core/saved_hooks.h"
#include "core/saved_report.h"
#include "core/tensor.h"
#include "core/version.h"
#include "nn/data/data.h"
#include "nn/data/token_file.h"
#include "nn/data/tokenizer.h"
#include "nn/formats/checkpoint.h"
#include "nn/formats/hf.h"
#include "nn/formats/safetensors.h"
#include "nn/memory/memory_budget.h"
#include "nn/memory/memory_plan.h"
#include "nn/model/generate.h"
#include "nn/model/gpt.h"
#include "nn/model/module.h"
#include "nn/model/norm.h"
#include "nn/optim/adamw.h"
#include "nn/optim/lr_scheduler.h"
#include "nn/optim/muon.h"
#include "nn/parallel/data_parallel.h"
#include "nn/train/gpt_step.h"
#include "ops/ops.h"

#pragma GCC visibility pop
