// nn/memory/memory_plan.h: the memory of one GPT training step, predicted from the config: how the
// settings that trade memory for time (norm policy, activation recompute, fused head loss,
// checkpointed blocks, offload, micro-batches) move the allocator's peak. Not here: what the graph
// saves after a forward without checkpoints (predicted_saved_bytes, nn/model/gpt.h), which this builds on.
//
// Dimensions as nn/model/gpt.h: B batch rows, T sequence length, C, NH, NKV, hs, L, V, H; E = B_micro * T
// positions of one micro-batch of B_micro rows.
//
// Note [The step replayed]
// A training step is train_gpt's loop (examples/train_gpt/train_gpt.cpp, train()): with the batch
// idx, targets [B, T] i64 already allocated and the optimizers' state made (AdamW's moments and
// masters, and with Muon its buffers and masters, by their constructors before any step; on CUDA
// AdamW's device table by the first step), the peak
// statistics are reset; then, for each micro-batch of B_micro rows (views of the batch; train_gpt
// has one, the whole batch, and tests/test_memory_plan.cpp runs the loop with more),
// loss = model.loss(idx, targets), scaled by 1 / n_micro when there is more than one
// (ops/elementwise.h scale), and loss.backward(); then clip_grad_norm_tensor_(params, 1.0),
// AdamW::step_if_finite(norm) (then Muon's, with s.optimizer Muon), zero_grad(). The peak is not
// a sum of a few terms: it falls
// where the bytes alive at one allocation are highest, which moves with every setting (the logits'
// gradient, lm_head's product, a block's forward again under a checkpoint, the residual gradient
// summed at a norm...). So predict_peak replays the step: the same sequence of allocations and
// releases that the modules, the ops (what each allocates in forward and in backward, in order),
// the engine (core/autograd.cpp: saved tensors released after their node runs, gradients summed into
// a fresh tensor, a leaf's first gradient copied) and checkpoint() (core/activation_checkpoint.cpp:
// the rerun keeps what it saves until each tensor is handed out) make, with byte counts instead of
// data, each storage released when its last handle is, as C++ scoping releases the real ones. The
// replay's peak is the allocator's peak_allocated_bytes. A change to the allocations of
// nn/model/gpt.cpp, of an op a GPT uses or of the engine must be made in nn/memory/memory_plan.cpp too; the tests
// (tests/test_memory_plan.cpp) compare the two over a grid of settings and fail when they part.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/model/gpt.h"

namespace normtape {

// The optimizer of the step: AdamW for every parameter, or Muon for the blocks' matrices and
// AdamW for the rest (param_groups_for_muon, nn/optim/muon.h; train_gpt --optimizer).
enum class StepOptimizer { AdamW, Muon };

// How a step trades memory for time; none of these changes the model's parameters or what it
// computes (the gradients are the same, up to the rounding of summing micro-batches). The
// optimizer is not a trade but decides the resident state and the optimizer's scratch.
struct MemorySettings {
    SavePolicy policy = SavePolicy::Input;  // GPTConfig::policy
    bool recompute_activation = true;       // GPTConfig::recompute_activation
    bool fused_head_loss = false;           // GPTConfig::fused_head_loss
    int64_t checkpoint_every = 0;           // 0: no block checkpointed; k >= 1: blocks 0, k, 2k, ...
    bool offload = false;                   // GPTConfig::offload
    int64_t micro_batch = 0;                // rows per micro-batch (gradient accumulation); 0: the whole batch
    StepOptimizer optimizer = StepOptimizer::AdamW;
    // Data parallel (nn/parallel/data_parallel.h) over world_size ranks, of which this is `rank`: the bucket
    // buffers (DataParallel::bucket_bytes) are resident; with shard_optimizer_state (ZeRO-1) the
    // rank's shards and the optimizers' state of them only. B is then each rank's batch.
    int world_size = 1;
    int rank = 0;
    bool shard_optimizer_state = false;
    int64_t bucket_cap_bytes = int64_t(25) << 20;  // DataParallelOptions::bucket_cap_bytes
};

// `config` with the settings' fields set: policy, recompute_activation, fused_head_loss, offload,
// checkpoint_blocks (checkpoint_every > 0) and checkpoint_every (1 when 0). micro_batch is the
// training loop's, not the model's. Throws Error for checkpoint_every < 0 or micro_batch < 0.
GPTConfig with_settings(GPTConfig config, const MemorySettings& s);

// The bytes of one training step on `config.device`, each in bytes as the allocator counts them
// (numel * element size, core/allocator.h).
struct StepMemory {
    int64_t parameters = 0;       // num_parameters(config) elements of config.dtype
    int64_t optimizer_state = 0;  // all of the optimizers' state: the two below, the f32 masters of
                                  // bf16 parameters, on CUDA AdamW's device table of its multi-tensor step
    int64_t adamw_moments = 0;    // AdamW's m and v (stat_dtype) of its parameters
    int64_t muon_momentum = 0;    // Muon's momentum buffers (stat_dtype) of the blocks' matrices
    int64_t data_parallel = 0;    // with world_size > 1: the bucket buffers, and under ZeRO-1 the rank's shards
                                  // (the two above and the masters are then of the shards)
    int64_t batch = 0;            // idx and targets, [B, T] i64 each
    int64_t gradients = 0;        // every parameter's gradient (config.dtype), alive after a backward
    int64_t peak = 0;             // memory_stats(config.device).peak_allocated_bytes over the step
    std::string peak_at;          // where the replay reached it: the micro-batch, phase and module
    // allocated_bytes right after each allocation of the step, in order (of the first two
    // micro-batches, a third repeating the second, then of the optimizer), as the allocator's trace
    // (set_memory_trace) gives MemoryEvent::allocated_bytes.
    std::vector<int64_t> allocations;
};

// predict_peak's replay with its parts (Note [The step replayed]); B rows of T positions, cut into
// micro-batches of s.micro_batch rows. Throws as predict_peak, naming step_memory.
StepMemory step_memory(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T);

// memory_stats(config.device).peak_allocated_bytes over one training step of the GPT
// with_settings(config, s) on a [B, T] batch (Note [The step replayed]), in bytes: the resident
// bytes (parameters + the optimizers' state + the batch; nothing else may be allocated on the
// device) plus
// the highest sum of the step's live tensors at any allocation:
//   - forward: the saved tensors as they accumulate (predicted_saved_bytes and its variants), plus
//     each op's output and transients (lm_head's [E, V] logits; on the cpu in bf16 every product's
//     f32 copies of its operands and output, ops/matmul.cpp);
//   - backward: the saved tensors not yet released, the gradients waiting for their node, the node's
//     outputs and transients (the logits' gradient written over them; a checkpointed block's forward
//     run again), the parameters' gradients made so far; in a later micro-batch every gradient
//     already exists (summed in place), in the first each is a copy made when it first arrives;
//   - optimizer: the gradients and the norm (and on CUDA the norm's partial sums, then with Muon
//     each class's scratch in turn, muon_scratch_bytes).
// With s.micro_batch = b < B the batch is n = B / b micro-batches: the peak is the higher of the
// first micro-batch's and a later one's (every parameter's gradient alive through its forward and
// backward), each replayed on [b, T]; the loss of each is scaled by 1/n (one more 0-dim tensor).
// On the cpu the replay is exact to the byte over the tested grid (tests/test_memory_plan.cpp).
// On CUDA (read from the code, not tested here) it adds the kernels' own temporaries: attention's
// backward scratch (our kernels' row sums D [B, NH, T], f32 or f64; or, where cuDNN runs it, its row
// sums, f32 dq accumulator and workspace, asked of its plan: ops/attention.h), cross-entropy's per-row losses [E], the
// column sums' partial rows (bias gradients, positions), the norms' per-block partial dweight and
// dbias (bounded: their row count depends on the GPU), the embedding backward's sort buffers
// (CUB's scratch estimated), the gradient norm's partial sums, and AdamW's device table; cuBLAS and
// cuBLASLt take their workspace outside the allocator (core/cuda_context.h) and products make no
// copies. Under offload on CUDA the saved tensors leave the device when their copies finish,
// which the replay cannot time: it replays the step without offload, a bound the device's peak
// stays under (every activation the device holds then, it holds without offload too), plus the
// device copies of the saved ids and targets (2 E i64, held through the backward: the batch stays
// resident besides); the pinned copies count on the cpu's counters.
// Assumes: dropout in training mode as config.dropout says (masks are drawn, never stored); no
// Output forward fell back to saving its input (output_policy_fallbacks()); no other tensor on the
// device (an evaluation's, a checkpoint's copies) is alive during the step.
// What a prediction for a GPU needs: nothing from the device, except where cuDNN runs the bf16
// attention (a build with cuDNN, attention_backend() Cudnn): its backward's scratch is what the
// cuDNN plan asks for, and the plan is built on the device. So predict a bf16 CUDA config on a
// machine where config.device is visible; f32, or any dtype in a build without cuDNN, predicts
// anywhere.
// Throws as detail::check_step_settings, its messages naming predict_peak (or GPTConfig, for what
// check_config refuses): ShapeError for B, T or sizes out of range, Error for the settings;
// DeviceError for a bf16 CUDA config whose cuDNN plan needs config.device where it is not visible;
// OutOfMemoryError, naming predict_peak, when the host cannot hold the replay (about 16 KiB of host
// memory a layer, checked against memory_available_bytes(Device::CPU) before it starts).
int64_t predict_peak(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T);

namespace detail {
// The checks predict_peak, step_memory, predict_step_ms and plan_memory make first, naming `op`:
// Error for checkpoint_every < 0, micro_batch < 0 or not 0 or a divisor of B, world_size < 1, rank
// outside [0, world_size), shard_optimizer_state with one rank, bucket_cap_bytes < 1;
// check_step_shape(op, with_settings(config, s), B, T) (ShapeError for B < 1, T outside
// [1, block_size], a step too large for int64; as check_config); and ShapeError when world_size *
// num_parameters * 8 bytes, a bound of the gradient buckets, passes 2^60.
void check_step_settings(const char* op, const GPTConfig& config, const MemorySettings& s, int64_t B,
                         int64_t T);
}  // namespace detail

// saved_bytes() right after GPT::loss on a [B, T] batch with checkpoint_blocks set and any
// checkpoint_every k >= 1 (k >= L checkpoints block 0 alone; offload off), in bytes:
// predicted_saved_bytes less, for each of the ceil(L / k) checkpointed blocks, what the block
// saves (detail::layer_saved_bytes, nn/model/gpt.h), plus its input (B*T*C elements of config.dtype),
// which its checkpoint keeps, except where that input is already saved: block 0's input is
// emb_norm's output, which emb_norm saves under Output and Normalized (under Normalized as x_hat,
// from which it is made again). For k = 1 it equals predicted_checkpoint_saved_bytes. Without
// checkpoint_blocks it is predicted_saved_bytes. Assumes no Output forward fell back. Throws as
// detail::check_step_shape, naming predicted_checkpoint_every_saved_bytes.
int64_t predicted_checkpoint_every_saved_bytes(const GPTConfig& config, int64_t B, int64_t T);

}  // namespace normtape
