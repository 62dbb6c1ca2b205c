// examples/train_gpt/run_config.h: what train_gpt's flags mean as the library's objects: the
// device and dtype, the model's GPTConfig, the learning-rate schedule, and the memory settings
// (nn/memory/memory_plan.h) that the planner and the sweep speak in. Not here: the flags
// themselves (train_flags.h, train_args.h), the training loop (train_gpt.cpp).
//
// Note [Micro-batches]
// With --micro-batch N (B_micro = N, n = B / N) a step draws the whole batch as without it
// (batcher.next(): the data stream, and so a resumed run, does not depend on N); gpt_step (Note
// [The training step], nn/train/gpt_step.h) then runs n forwards and backwards of N rows each, the
// parameters' grads adding up (+=, Note [Gradient accumulation] in core/autograd.h) to the gradient
// of the whole batch's mean loss, and the clipping and the optimizers' step once. The step's loss
// is the mean of the micro-batches' losses (summed in double, rounded to f32). What changes
// against the whole batch: the order in which the gradients are summed (results agree to
// rounding); with --dropout, which elements are dropped (each micro-batch's forward draws its own
// masks from the stream, in turn); in bf16 the factor 1 / n, unless a power of two, is rounded to
// bf16 where backward seeds it. What one forward saves is a micro-batch's (predicted_saved_bytes
// at B_micro). With n == 1 the step is the one without the flag, op for op.
#pragma once

#include "normtape.h"
#include "train_args.h"

normtape::Device device_of(const Args& a);
normtape::DType dtype_of(const Args& a);
// The model of the flags, its norms under `policy`.
normtape::GPTConfig make_config(const Args& a, normtape::SavePolicy policy);
// Whether activation recompute's saving is measured: with it on, and not with checkpointed
// blocks, which keep only their inputs either way.
bool recompute_saving_measured(const Args& a);
// Linear warm-up over --warmup steps, then cosine decay to --min-lr at the last step.
normtape::WarmupCosineLR lr_schedule(const Args& a);
// The memory settings the flags of `a` ask for under `policy`, and the flags that ask for `s`
// (its policy becomes --policy).
normtape::MemorySettings settings_of(const Args& a, normtape::SavePolicy policy);
void set_settings(Args& a, const normtape::MemorySettings& s);
