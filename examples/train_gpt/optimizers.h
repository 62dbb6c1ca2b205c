// examples/train_gpt/optimizers.h: train_gpt's optimizers (--optimizer): AdamW for every
// parameter, or Muon for the blocks' matrices beside AdamW for the rest, with nanochat's rates.
//
// Note [The optimizers]
// adamw: AdamW, betas (0.9, --beta2), eps 1e-8, weight decay 0.1 on the parameters of 2 or more
// dimensions and 0 on the others (GPT-2, nanoGPT); its lr is the schedule's.
// muon: param_groups_for_muon's split (nn/optim/muon.h), at nanochat's rates (karpathy/nanochat,
// GPT.setup_optimizers): Muon (momentum 0.95, Nesterov, 5 Newton-Schulz steps) at 0.02 (--muon-lr)
// for the blocks' matrices; AdamW, betas (0.8, 0.95), eps 1e-10, at 0.2 s for the embeddings and
// 0.004 s for lm_head, s = (C / 768)^-0.5 (nanochat's scaling of AdamW's rates with the width),
// and at lm_head's rate for the vectors (norm weights, biases: nanochat's model has none); no
// weight decay (nanochat's default). --lr is then the schedule's scale, not a rate: every rate is
// multiplied by lr(step) / --lr, so that both optimizers follow the run's warm-up and cosine decay
// (nanochat's own schedule, flat then a linear warm-down, and its momentum warm-up from 0.85 over
// 300 steps are not taken). --beta2 is the adamw run's only.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "normtape.h"
#include "train_args.h"

// The step's optimizers (nn/train/gpt_step.h) and the schedule's rates.
struct Optimizers : normtape::GPTOptimizers {
    double peak_lr = 0;      // --lr
    double adamw_scale = 1;  // with muon: AdamW's lr at the schedule's peak, (C / 768)^-0.5
    double muon_lr = 0;      // with muon: Muon's lr at the schedule's peak (--muon-lr)

    // Sets every rate from the schedule's `lr` at this step (Note [The optimizers]).
    void set_lr(double lr);
    int64_t step_count() const { return adamw->step_count(); }
    void set_step_count(int64_t t);
};

// The parameter groups of `a.optimizer` over `model`'s parameters (gpt_param_groups).
normtape::GPTParamGroups optimizer_groups(const Args& a, const normtape::GPT& model);

// The optimizers of `a.optimizer` for `model` (after Module::to), with the rates of step 0 unset:
// over optimizer_groups(a, model), or over `groups` (a data-parallel run's shards, nn/parallel/data_parallel.h).
Optimizers make_optimizers(const Args& a, const normtape::GPT& model);
Optimizers make_optimizers(const Args& a, const normtape::GPT& model, normtape::GPTParamGroups groups);
