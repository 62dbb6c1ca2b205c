// nn/memory/memory_plan.h: the memory of one GPT training step, predicted before it runs: how the
// settings that trade memory for time (norm policy, activation recompute, fused head loss,
// checkpointed blocks, offload, micro-batches, data parallel with ZeRO-1) move the allocator's
// peak. Not here: what the graph saves after a forward (predicted_saved_bytes, nn/model/gpt.h), a
// closed form kept as an independent check.
//
// Dimensions as nn/model/gpt.h: B batch rows, T sequence length.
//
// Note [The step dry-run]
// predict_peak runs the step itself (gpt_step, Note [The training step] in nn/train/gpt_step.h)
// as a dry run (Note [The dry run], core/dry_run.h) on config.device: the model is built, the
// optimizers made (over a stand-in process group's DataParallel when world_size > 1), the batch
// idx, targets [B, T] i64 allocated, one step run (AdamW's CUDA device table is made by the first),
// the peak statistics reset, and a second step run. Its peak_allocated_bytes is the prediction:
// every op, the engine, checkpoint(), SaveOnCpu and the optimizers allocated and released as in
// the real step, with no byte of data. train_gpt's loop is that same step, so the prediction is
// its measured peak; nothing here knows what a GPT allocates.
// What the prediction assumes: nothing else lives on the device during the step (an evaluation's
// tensors, a checkpoint's copies); no Output forward falls back to saving its input
// (output_policy_fallbacks(), a choice made on values). Under offload on CUDA the saved tensors
// leave the device when their copies finish, which no dry run can time: the dry run keeps each
// device tensor until its copy would be waited for (core/save_on_cpu.h), so the prediction is a
// bound that the device's peak stays under.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "nn/model/gpt.h"
#include "nn/train/gpt_step.h"

namespace normtape {

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
// (numel * element size, core/allocator.h), measured by the dry run (Note [The step dry-run]).
struct StepMemory {
    int64_t parameters = 0;       // the model's parameters
    int64_t optimizer_state = 0;  // all of the optimizers' state: the two below, the f32 masters of
                                  // bf16 parameters, on CUDA AdamW's device table of its multi-tensor step
    int64_t adamw_moments = 0;    // AdamW's m and v (stat_dtype) of its parameters
    int64_t muon_momentum = 0;    // Muon's momentum buffers (stat_dtype) of the blocks' matrices
    int64_t data_parallel = 0;    // with world_size > 1: what DataParallel's constructor allocates (the
                                  // bucket buffers, and under ZeRO-1 the rank's shards)
    int64_t batch = 0;            // idx and targets, [B, T] i64 each
    int64_t gradients = 0;        // every parameter's gradient (config.dtype), alive after a backward
    int64_t peak = 0;             // memory_stats(config.device).peak_allocated_bytes over the step
    std::string peak_at;          // where the step reached it: phase, backward node and module
    // allocated_bytes right after each allocation of the step, in order, as the allocator's trace
    // (set_memory_trace) gives MemoryEvent::allocated_bytes.
    std::vector<int64_t> allocations;
};

// predict_peak with its parts (Note [The step dry-run]). Throws as predict_peak, naming step_memory.
StepMemory step_memory(const GPTConfig& config, const MemorySettings& s, int64_t B, int64_t T);

// memory_stats(config.device).peak_allocated_bytes over one training step (gpt_step) of the GPT
// with_settings(config, s) on a [B, T] batch, micro_batch rows at a time, with s.optimizer, in
// bytes: the resident bytes (parameters, the optimizers' state, the batch, DataParallel's buffers)
// plus the highest sum of the step's live tensors at any allocation, by the dry run of the step
// itself (Note [The step dry-run]). Exact to the byte on the cpu and on CUDA (tests/
// test_memory_plan.cpp, scripts/gpu_check.sh), except under offload on CUDA (a bound).
// Assumes: dropout in training mode as config.dropout says (masks are drawn, never stored); no
// Output forward fell back to saving its input (output_policy_fallbacks()); no other tensor on the
// device is alive during the step.
// A prediction for CUDA runs on the GPU it predicts (the dry run asks it for cuDNN's and cuBLASLt's
// plans): DeviceError where config.device is not visible.
// Throws as detail::check_step_settings, its messages naming predict_peak (or GPTConfig, for what
// check_config refuses): ShapeError for B, T or sizes out of range, Error for the settings;
// DeviceError as dry_run; OutOfMemoryError, naming predict_peak, when the host cannot hold the dry
// run's model and graph (about 64 KiB of host memory a layer, checked against
// memory_available_bytes(Device::CPU) before it starts).
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
