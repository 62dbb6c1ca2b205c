// nn/parallel/data_parallel.h: data-parallel training over a process group (core/distributed.h): every
// rank holds the whole model and runs its own slice of the batch; gradients are averaged across
// ranks in buckets while the backward runs; with shard_optimizer_state (ZeRO-1, Rajbhandari et al.
// 2020, arXiv:1910.02054) each rank keeps the optimizer state of 1 / world_size of the parameters
// only. Not here: the collectives themselves, the optimizers (nn/optim/adamw.h, nn/optim/muon.h).
//
// Note [Gradient buckets]
// The parameters are cut into buckets, walking them in reverse (about the order in which backward
// completes their gradients), as PyTorch's DistributedDataParallel does:
// - AdamW's parameters (updated element by element) fill a bucket until it holds bucket_cap_bytes
//   or more; its n elements are split into world_size parts of ceil(n / world_size) (the last rank's
//   part padded with zeros);
// - Muon's matrices (orthogonalized whole) go world_size of one shape to a bucket, rank r's part
//   being the r-th matrix (a bucket left short at the end leaves the last ranks without a part).
// Each bucket has a buffer of world_size parts in the parameters' dtype, made once. A hook on every
// parameter (Tensor::register_post_accumulate_grad_hook) copies its finished gradient into the
// buffer; when a bucket is full its collective starts, buckets in order (every rank starts them in
// the same order), and runs while the backward goes on: all_reduce, or with ZeRO-1 reduce_scatter
// (each rank gets the sum of its own part). finish_gradients() starts what is left (a gradient that
// never came counts as zeros), waits, and divides by world_size: the mean of the ranks' gradients,
// which with equal batch slices is the gradient of the whole batch's mean loss.
// With ZeRO-1 rank r's part of an AdamW bucket is held as one shard tensor per parameter it
// touches (so that each keeps its group's weight decay and lr scale), and its part of a Muon bucket
// as a copy of its matrix; the optimizers are built over those shards (adamw_groups(),
// muon_groups()), their gradients are views of the bucket's part, and after the step
// after_step() all-gathers the parts and writes them into every rank's parameters. AdamW then
// computes the same bits as without sharding; Muon too (the same matrix, the same kernels).
//
// What is overlapped: the buckets' all_reduce / reduce_scatter with the backward. What is not: the
// last bucket's, the gradient norm, and with ZeRO-1 the all_gather of the parameters after the
// step.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/distributed.h"
#include "nn/optim/adamw.h"
#include "nn/optim/muon.h"

namespace normtape {

struct DataParallelOptions {
    // AdamW's buckets close at this size or above (Note [Gradient buckets]); PyTorch's default, 25 MiB.
    int64_t bucket_cap_bytes = int64_t(25) << 20;
    // ZeRO-1: each rank keeps the optimizer state of its parts alone.
    bool shard_optimizer_state = false;
    // check_replicas() after every after_step(); on by default in debug builds (no NDEBUG).
#ifdef NDEBUG
    bool check_replicas = false;
#else
    bool check_replicas = true;
#endif
};

// One parameter as the bucket plan sees it: its elements, and whether it is Muon's, with its shape
// as Muon takes it ([rows, cols]).
struct BucketParam {
    int64_t numel = 0;
    bool matrix = false;
    int64_t rows = 0, cols = 0;
};
// One bucket of the plan: its parameters (indices into the list planned), slot i at offset
// offsets[i] of the buffer; `part` elements a rank.
struct BucketPlan {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    bool matrices = false;
    int64_t part = 0;
};
// The buckets of Note [Gradient buckets] for `params` in the model's order, parameters of
// `element_bytes` each. Throws Error for world_size < 1 or bucket_cap_bytes < 1.
std::vector<BucketPlan> plan_buckets(const std::vector<BucketParam>& params, int64_t element_bytes, int world_size,
                                     int64_t bucket_cap_bytes);
// Rank `rank`'s shards under ZeRO-1 with these buckets, in bucket order: each a run of one
// parameter inside the rank's part of a bucket (Muon's: the whole matrix).
struct ShardPlan {
    size_t bucket = 0, param = 0;
    int64_t param_offset = 0;  // in the parameter's elements
    int64_t part_offset = 0;   // in the rank's part of the bucket
    int64_t numel = 0;
};
std::vector<ShardPlan> plan_shards(const std::vector<BucketPlan>& buckets, const std::vector<BucketParam>& params,
                                   int rank);

class DataParallel {
public:
    // `parameters`: the model's, in its order (Module::parameters()); the optimizers' groups over
    // them: AdamW's (`adamw_groups`) and Muon's (`muon_groups`, may be empty), each parameter in
    // exactly one; all of one dtype and on one device (the cpu, or this process's GPU). Broadcasts every parameter from rank 0 (so
    // every replica starts the same), makes the bucket buffers (about the parameters' bytes again)
    // and with ZeRO-1 the shards, and registers a hook on every parameter (removed by the
    // destructor). Throws Error for an empty list, a parameter in two groups or that is not a leaf
    // requiring grad; DTypeError / DeviceError for parameters of several dtypes / devices; as the
    // ProcessGroup's collectives.
    DataParallel(ProcessGroup& group, const std::vector<Tensor>& parameters, std::vector<ParamGroup> adamw_groups,
                 std::vector<ParamGroup> muon_groups, DataParallelOptions options = {});
    ~DataParallel();
    DataParallel(const DataParallel&) = delete;
    DataParallel& operator=(const DataParallel&) = delete;

    // What this rank's optimizers are built over: the groups given (plain), or with ZeRO-1 this
    // rank's shards, group by group (same weight_decay and lr_scale).
    const std::vector<ParamGroup>& adamw_groups() const { return adamw_shards_; }
    const std::vector<ParamGroup>& muon_groups() const { return muon_shards_; }

    // With `sync` false the hooks copy nothing and start nothing (gradient accumulation: the
    // micro-batches before the last); finish_gradients() then does the whole reduction. True again
    // after finish_gradients().
    void set_sync(bool sync) { sync_ = sync; }
    // After the backward (the last micro-batch's): every bucket reduced and divided by
    // world_size; plain: every parameter's grad() is the ranks' mean (zeros for one that no rank
    // gave a gradient); ZeRO-1: every shard's grad() is its part of the mean and the parameters'
    // grads are dropped. Throws as the collectives. A backward that gives a parameter a second
    // gradient before this (two backwards with sync on) throws Error from inside that backward.
    void finish_gradients();
    // clip_grad_norm_tensor_ over the whole gradient (with ZeRO-1: every rank's shards, their sum
    // of squares all-reduced; the norm is then read on the host). Returns the norm before clipping,
    // a 0-dim f64 tensor on the parameters' device.
    Tensor clip_grad_norm_(double max_norm);
    // After the optimizers' step: with ZeRO-1 every rank's parts all-gathered into every
    // parameter; then, with options.check_replicas, check_replicas().
    void after_step();
    // Throws Error naming the first parameter whose bits differ between this rank and rank 0
    // (an xxHash of every parameter, all-gathered); every rank must call it.
    void check_replicas() const;

    // Checkpoints under ZeRO-1 (a file holds the whole state, as one process's). gather_state fills
    // `full_adamw` / `full_muon` (optimizers over the model's parameters with the constructor's groups,
    // or null on ranks that do not write) with every rank's shard state and step count; every rank
    // calls it. scatter_state copies this rank's parts from full optimizers (every rank loads the
    // file) into its shards' state. Plain data parallel: nothing to do (every rank has the whole state).
    void gather_state(const AdamW* shard_adamw, const Muon* shard_muon, AdamW* full_adamw, Muon* full_muon) const;
    void scatter_state(const AdamW* full_adamw, const Muon* full_muon, AdamW* shard_adamw, Muon* shard_muon) const;

    // The bytes of the bucket buffers (resident, in the parameters' dtype).
    int64_t bucket_bytes() const;
    int64_t buckets() const;
    ProcessGroup& group() const { return group_; }
    bool sharded() const { return options_.shard_optimizer_state; }

private:
    struct Piece;
    struct Bucket;
    void on_gradient(size_t param);
    void start(Bucket& b);

    ProcessGroup& group_;
    DataParallelOptions options_;
    std::vector<Tensor> params_;  // the model's order
    std::vector<std::pair<bool, size_t>> group_of_;  // per parameter: Muon's?, its group
    std::vector<ParamGroup> adamw_shards_, muon_shards_;
    std::vector<Bucket> buckets_;
    std::vector<std::pair<size_t, size_t>> where_;  // per parameter: bucket, slot
    std::vector<int64_t> hooks_;
    size_t next_start_ = 0;  // the next bucket to start, in order
    bool sync_ = true;
};

}  // namespace normtape
