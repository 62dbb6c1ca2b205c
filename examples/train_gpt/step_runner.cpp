// examples/train_gpt/step_runner.cpp: train_gpt's step, run or replayed (Note [The step as a CUDA graph],
// examples/train_gpt/step_runner.h).
#include "step_runner.h"

using namespace normtape;

Tensor StepRunner::run(int64_t step, GPT& model, GPTOptimizers& optimizers, DataParallel* dp, Tensor idx,
                       Tensor targets, int64_t micro_batch, bool skip_nonfinite, std::vector<Tensor>* losses,
                       const GPTStepHooks& hooks) {
    if (!replayed(step)) return gpt_step(model, optimizers, dp, idx, targets, micro_batch, skip_nonfinite, losses, hooks);
    if (!graph_) {
        batch_[0] = idx.clone();  // storage of the graph's own, which no later batch shares
        batch_[1] = targets.clone();
        idx = targets = Tensor();
        graph_ = std::make_unique<CUDAGraph>();
        graph_->capture(device_, [&] {
            norm_ = gpt_step(model, optimizers, nullptr, batch_[0], batch_[1], micro_batch, skip_nonfinite, &losses_);
        });
    } else {
        batch_[0].copy_(idx);
        batch_[1].copy_(targets);
        idx = targets = Tensor();  // one copy of the batch during the step, as in an eager one
    }
    graph_->replay();
    *losses = losses_;
    return norm_;
}
