// examples/train_gpt/step_runner.h: StepRunner, train_gpt's training step, run as such or, with
// --cuda-graph on, captured once as a CUDA graph and then replayed (Note [The step as a CUDA graph]).
// Not here: the loop around it (examples/train_gpt/train_gpt.cpp), the step itself (gpt_step,
// nn/train/gpt_step.h), the graph (core/cuda_graph.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "normtape.h"

// Note [The step as a CUDA graph]
// With --cuda-graph on, the run's first kGraphWarmup steps run as usual: the first makes the
// optimizers' tables and the libraries' plans (which wait for the GPU, so they cannot be captured)
// and measures the saved tensors, the second records the memory trace. The next step is captured
// as a CUDA graph (core/cuda_graph.h) over copies of its batch; it and every later step then copy
// their batch into those tensors, set the rates (read from device memory) and replay the graph, so
// the GPU runs the step's kernels back to back with no host work between them. The losses and the
// gradient norm are the captured step's tensors, read after each replay as after an eager step.
// The peak is measured on the captured step (its allocations are the eager step's, from the graph's
// pool); a replay allocates nothing. The phase times come from the eager steps only. Refused (exit
// 2, examples/train_gpt/train_args.cpp): dropout (a replay would draw the same masks), offload (its
// copies wait for another stream), the fused loss (it counts its targets on the host), several
// processes (collectives), --detect-anomaly (it reads values on the host), a memory budget or
// sweep, the cpu. The batches' ids are checked when the data is read (a text's bytes or its
// tokenizer's ids, a token file's ids against --vocab, random ids below it), since a capture checks
// no value.
class StepRunner {
public:
    static constexpr int64_t kGraphWarmup = 2;

    // The steps of a run from `first_step` on; with `cuda_graph`, on `device` (a CUDA GPU).
    StepRunner(normtape::Device device, bool cuda_graph, int64_t first_step)
        : device_(device), cuda_graph_(cuda_graph), first_step_(first_step) {}

    // Whether step `step` is captured or replayed rather than run: with a graph, every step after
    // the first kGraphWarmup. The hooks are not called for such a step.
    bool replayed(int64_t step) const { return cuda_graph_ && step >= first_step_ + kGraphWarmup; }

    // Runs training step `step` (gpt_step, nn/train/gpt_step.h) on the batch idx, targets ([B, T]
    // i64 on the model's device; taken, so that the step holds one copy of them), or replays it.
    // Returns the step's gradient norm (f64 on the device, not waited for) and sets `losses` to
    // each micro-batch's loss tensor. Throws what gpt_step throws, and what CUDAGraph::capture throws
    // for a step that cannot be captured.
    normtape::Tensor run(int64_t step, normtape::GPT& model, normtape::GPTOptimizers& optimizers,
                         normtape::DataParallel* dp, normtape::Tensor idx, normtape::Tensor targets,
                         int64_t micro_batch, bool skip_nonfinite, std::vector<normtape::Tensor>* losses,
                         const normtape::GPTStepHooks& hooks);

private:
    normtape::Device device_;
    bool cuda_graph_;
    int64_t first_step_;
    std::unique_ptr<normtape::CUDAGraph> graph_;
    normtape::Tensor batch_[2], norm_;      // the captured step's idx and targets, and its gradient norm
    std::vector<normtape::Tensor> losses_;  // the captured step's losses, written again by each replay
};
