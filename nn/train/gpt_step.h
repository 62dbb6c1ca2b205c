// nn/train/gpt_step.h: one training step of the GPT, as train_gpt runs it and as the memory
// planner dry-runs it (nn/memory/memory_plan.h): the same code, so that what the planner predicts
// is what train_gpt allocates.
//
// Note [The training step]
// gpt_step(model, optimizers, dp, idx, targets, micro_batch) with idx, targets [B, T] i64 on the
// model's device, n = B / micro_batch micro-batches:
//   for k in 0 .. n - 1: loss_k = model.loss(rows k of idx, rows k of targets), the rows cloned
//     into storage of their own when n > 1 (a view would keep the whole batch saved); with dp, its
//     buckets reduced during the last backward only (set_sync); backward() from loss_k, scaled by
//     1 / n when n > 1 (ops/elementwise.h scale), so that the gradient is the whole batch's mean
//     loss's; loss_k detached and kept;
//   dp->finish_gradients(); norm = clip_grad_norm_(1.0) over every parameter's gradient (dp's
//   over every rank's); each optimizer's step, step_if_finite(norm) when skip_nonfinite (the step
//   skipped on the device when the norm is not finite); dp->after_step(); zero_grad().
// The learning rates are the caller's (set before the step); they do not change what is allocated.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "nn/model/gpt.h"
#include "nn/optim/adamw.h"
#include "nn/optim/muon.h"
#include "nn/parallel/data_parallel.h"

namespace normtape {

// The optimizer of a step: AdamW for every parameter, or Muon for the blocks' matrices and AdamW
// for the rest (param_groups_for_muon, nn/optim/muon.h; train_gpt --optimizer).
enum class StepOptimizer { AdamW, Muon };

// The parameter groups of a GPT step's optimizers, over model.parameters():
//   AdamW: matrices (dim >= 2) with weight decay 0.1, vectors with none;
//   Muon: Muon's group is the blocks' matrices; AdamW's groups are the embeddings (lr_scale 0.2),
//   the head and the vectors (lr_scale 0.004 each), without weight decay (nanochat's
//   GPT.setup_optimizers rates).
// Throws as param_groups_for_muon.
struct GPTParamGroups {
    std::vector<ParamGroup> adamw, muon;
};
GPTParamGroups gpt_param_groups(const GPT& model, StepOptimizer optimizer);

// What a step steps: AdamW always, Muon with StepOptimizer::Muon (else null).
struct GPTOptimizers {
    std::unique_ptr<AdamW> adamw;
    std::unique_ptr<Muon> muon;
    // The optimizers over `groups` (Muon's only when it has a group), with these options.
    // Throws as the optimizers' constructors.
    static GPTOptimizers make(GPTParamGroups groups, const AdamWOptions& adamw_options = {},
                              const MuonOptions& muon_options = {});
    void zero_grad();
    // The bytes of their state: AdamW's moments m and v, Muon's momentum buffers, the f32 masters
    // of bf16 parameters (both's).
    int64_t adamw_moment_bytes() const;
    int64_t muon_momentum_bytes() const;
    int64_t master_bytes() const;
};

// Called by gpt_step between its parts (train_gpt times them and reports one forward's graph).
struct GPTStepHooks {
    std::function<void(int64_t k, const Tensor& loss)> after_forward;  // micro-batch k's loss, before its backward
    std::function<void(int64_t k)> after_backward;
};

// One training step (Note [The training step]) on idx, targets [B, T] i64 on the model's device,
// micro_batch rows at a time (0: the whole batch; else a divisor of B). Returns the gradient norm
// before clipping (0-dim f64 on the device, not read: no wait); appends each micro-batch's loss,
// detached (0-dim, the model's dtype), to *losses when given. Gradients accumulate over the
// micro-batches into the parameters' grad() and are dropped by zero_grad at the end. Throws
// ShapeError for idx and targets of different shapes or a micro_batch that does not divide B;
// whatever the model, the engine, DataParallel or the optimizers throw.
Tensor gpt_step(GPT& model, GPTOptimizers& optimizers, DataParallel* dp, const Tensor& idx, const Tensor& targets,
                int64_t micro_batch, bool skip_nonfinite = true, std::vector<Tensor>* losses = nullptr,
                const GPTStepHooks& hooks = {});

}  // namespace normtape
