// nn/parallel/data_parallel.cpp: data parallelism over a process group, with the optimizer state sharded
// or not (Note [Gradient buckets] in nn/parallel/data_parallel.h).
#include "nn/parallel/data_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <unordered_map>

#include "core/autograd.h"
#include "core/check.h"
#include "core/dry_run.h"
#include "ops/elementwise.h"

// As nn/formats/safetensors_internal.h: header-only, on AVX2 where AVX-512 is on (GCC's warnings).
#define XXH_INLINE_ALL
#if defined(__AVX512F__) && !defined(XXH_VECTOR)
#define XXH_VECTOR XXH_AVX2
#endif
#include <xxhash.h>

namespace normtape {

std::vector<BucketPlan> plan_buckets(const std::vector<BucketParam>& params, int64_t element_bytes, int world_size,
                                     int64_t bucket_cap_bytes) {
    NT_CHECK(world_size >= 1, "plan_buckets: expected world_size >= 1, got ", world_size);
    NT_CHECK(bucket_cap_bytes >= 1, "plan_buckets: expected bucket_cap_bytes >= 1, got ", bucket_cap_bytes);
    std::vector<BucketPlan> out;
    BucketPlan open;  // AdamW's, filling
    int64_t open_numel = 0;
    auto close = [&] {
        if (open.params.empty()) return;
        open.part = (open_numel + world_size - 1) / world_size;
        out.push_back(std::move(open));
        open = BucketPlan();
        open_numel = 0;
    };
    std::vector<BucketPlan> short_of_world;  // Muon's, one per shape, until world_size matrices
    for (size_t k = params.size(); k-- > 0;) {
        const BucketParam& p = params[k];
        if (!p.matrix) {
            open.params.push_back(k);
            open.offsets.push_back(open_numel);
            open_numel += p.numel;
            if (open_numel * element_bytes >= bucket_cap_bytes) close();
            continue;
        }
        auto same_shape = [&](const BucketPlan& b) {
            const BucketParam& q = params[b.params[0]];
            return q.rows == p.rows && q.cols == p.cols;
        };
        auto it = std::find_if(short_of_world.begin(), short_of_world.end(), same_shape);
        if (it == short_of_world.end()) {
            short_of_world.push_back(BucketPlan{{}, {}, true, p.numel});
            it = short_of_world.end() - 1;
        }
        it->offsets.push_back(static_cast<int64_t>(it->params.size()) * p.numel);
        it->params.push_back(k);
        if (static_cast<int>(it->params.size()) == world_size) {
            out.push_back(std::move(*it));
            short_of_world.erase(it);
        }
    }
    close();
    for (BucketPlan& b : short_of_world) out.push_back(std::move(b));
    return out;
}

std::vector<ShardPlan> plan_shards(const std::vector<BucketPlan>& buckets, const std::vector<BucketParam>& params,
                                   int rank) {
    std::vector<ShardPlan> out;
    for (size_t b = 0; b < buckets.size(); ++b) {
        const BucketPlan& plan = buckets[b];
        const int64_t lo = rank * plan.part, hi = lo + plan.part;
        for (size_t i = 0; i < plan.params.size(); ++i) {
            const int64_t off = plan.offsets[i], numel = params[plan.params[i]].numel;
            const int64_t begin = std::max(lo, off), end = std::min(hi, off + numel);
            if (begin < end) out.push_back({b, plan.params[i], begin - off, begin - lo, end - begin});
        }
    }
    return out;
}

// A run of one parameter inside this rank's part of a bucket: under ZeRO-1 a tensor of its own
// (a copy of the parameter's elements) that the optimizer updates.
struct DataParallel::Piece {
    Tensor shard;
    size_t param = 0;
    int64_t param_offset = 0;  // in the parameter's elements
    int64_t part_offset = 0;   // in the rank's part
};

struct DataParallel::Bucket {
    BucketPlan plan;
    Tensor buffer;  // [world_size * part], the parameters' dtype
    std::vector<bool> arrived;
    int64_t waiting = 0;
    Work work;
    std::vector<Piece> pieces;  // ZeRO-1: this rank's
    Tensor part(int rank) const { return buffer.narrow(0, rank * plan.part, plan.part); }
};

namespace {
Tensor flat(const Tensor& t) { return t.view({t.numel()}); }
}  // namespace

DataParallel::DataParallel(ProcessGroup& group, const std::vector<Tensor>& parameters,
                           std::vector<ParamGroup> adamw_groups, std::vector<ParamGroup> muon_groups,
                           DataParallelOptions options)
    : group_(group), options_(options), params_(parameters) {
    NT_CHECK(!params_.empty(), "DataParallel: expected parameters, got none");
    NT_CHECK(options.bucket_cap_bytes >= 1, "DataParallel: expected bucket_cap_bytes >= 1, got ",
             options.bucket_cap_bytes);
    std::unordered_map<const TensorImpl*, size_t> index;
    for (size_t k = 0; k < params_.size(); ++k) {
        const Tensor& p = params_[k];
        NT_CHECK(p.defined() && p.is_leaf() && p.requires_grad() && p.is_contiguous(), "DataParallel: expected parameter #",
                 k, " to be a contiguous leaf that requires grad");
        NT_CHECK_AS(DTypeError, p.dtype() == params_[0].dtype(), "DataParallel: expected parameters of one dtype, got ",
                    dtype_name(params_[0].dtype()), " and ", dtype_name(p.dtype()), " (parameter #", k, ")");
        NT_CHECK_AS(DeviceError, p.device() == params_[0].device(), "DataParallel: expected parameters on one device, got ",
                    device_name(params_[0].device()), " and ", device_name(p.device()), " (parameter #", k, ")");
        NT_CHECK(index.emplace(&p.impl(), k).second, "DataParallel: parameter #", k, " is listed twice");
    }
    group_of_.assign(params_.size(), {false, SIZE_MAX});
    auto assign = [&](const std::vector<ParamGroup>& groups, bool muon) {
        for (size_t g = 0; g < groups.size(); ++g)
            for (const Tensor& p : groups[g].params) {
                auto it = p.defined() ? index.find(&p.impl()) : index.end();
                NT_CHECK(it != index.end(), "DataParallel: a parameter of ", muon ? "Muon" : "AdamW", "'s group ", g,
                         " is not among the model's parameters");
                NT_CHECK(group_of_[it->second].second == SIZE_MAX, "DataParallel: parameter #", it->second,
                         " is in two groups");
                group_of_[it->second] = {muon, g};
            }
    };
    assign(adamw_groups, false);
    assign(muon_groups, true);
    for (size_t k = 0; k < params_.size(); ++k)
        NT_CHECK(group_of_[k].second != SIZE_MAX, "DataParallel: parameter #", k, " (shape ",
                 shape_str(params_[k].shape()), ") is in no optimizer group");

    std::vector<BucketParam> plan_params;
    for (size_t k = 0; k < params_.size(); ++k) {
        const Tensor& p = params_[k];
        const bool matrix = group_of_[k].first;
        // A matrix's columns as a product: numel / size(0) divides by zero for an empty one.
        int64_t cols = 1;
        for (int64_t d = 1; d < p.dim(); ++d) cols *= p.size(d);
        plan_params.push_back({p.numel(), matrix, matrix ? p.size(0) : 0, matrix ? cols : 0});
    }
    const int W = group_.world_size(), rank = group_.rank();
    const DType dtype = params_[0].dtype();
    const Device device = params_[0].device();
    where_.resize(params_.size());
    NoGradGuard no_grad;
    const std::vector<BucketPlan> plans =
        plan_buckets(plan_params, static_cast<int64_t>(element_size(dtype)), W, options.bucket_cap_bytes);
    for (const BucketPlan& plan : plans) {
        Bucket b;
        b.plan = plan;
        b.buffer = zeros({W * b.plan.part}, TensorOptions().dtype(dtype).device(device));
        b.arrived.assign(b.plan.params.size(), false);
        b.waiting = static_cast<int64_t>(b.plan.params.size());
        for (size_t i = 0; i < b.plan.params.size(); ++i) where_[b.plan.params[i]] = {buckets_.size(), i};
        buckets_.push_back(std::move(b));
    }
    // Every replica starts from rank 0's parameters.
    if (W > 1)
        for (Bucket& b : buckets_) {
            for (size_t i = 0; i < b.plan.params.size(); ++i) {
                const Tensor& p = params_[b.plan.params[i]];
                b.buffer.narrow(0, b.plan.offsets[i], p.numel()).copy_(flat(p));
            }
            group_.broadcast(b.buffer, 0);
            for (size_t i = 0; i < b.plan.params.size(); ++i) {
                Tensor p = params_[b.plan.params[i]];
                flat(p).copy_(b.buffer.narrow(0, b.plan.offsets[i], p.numel()));
            }
        }

    if (!options.shard_optimizer_state) {
        adamw_shards_ = std::move(adamw_groups);
        muon_shards_ = std::move(muon_groups);
    } else {  // ZeRO-1: this rank's part of each bucket, a piece per parameter it touches
        adamw_shards_ = adamw_groups;
        muon_shards_ = muon_groups;
        for (ParamGroup& g : adamw_shards_) g.params.clear();
        for (ParamGroup& g : muon_shards_) g.params.clear();
        for (const ShardPlan& sp : plan_shards(plans, plan_params, rank)) {
            const Tensor& p = params_[sp.param];
            Piece piece;
            piece.param = sp.param;
            piece.param_offset = sp.param_offset;
            piece.part_offset = sp.part_offset;
            // Muon's piece is its whole matrix, in the parameter's shape.
            piece.shard = buckets_[sp.bucket].plan.matrices ? p.detach().clone()
                                                            : flat(p).narrow(0, sp.param_offset, sp.numel).clone();
            piece.shard.requires_grad_();
            const auto [muon, g] = group_of_[sp.param];
            (muon ? muon_shards_ : adamw_shards_)[g].params.push_back(piece.shard);
            buckets_[sp.bucket].pieces.push_back(std::move(piece));
        }
    }
    for (size_t k = 0; k < params_.size(); ++k)
        hooks_.push_back(params_[k].register_post_accumulate_grad_hook([this, k](const Tensor&) { on_gradient(k); }));
}

DataParallel::~DataParallel() {
    for (size_t k = 0; k < params_.size(); ++k) params_[k].remove_post_accumulate_grad_hook(hooks_[k]);
}

void DataParallel::on_gradient(size_t k) {
    if (!sync_) return;
    auto [bi, slot] = where_[k];
    Bucket& b = buckets_[bi];
    NT_CHECK(!b.arrived[slot], "DataParallel: parameter #", k, " got a second gradient before finish_gradients(): "
             "for micro-batches, set_sync(false) before each backward but the last");
    const Tensor& p = params_[k];
    b.buffer.narrow(0, b.plan.offsets[slot], p.numel()).copy_(flat(p.grad()));
    b.arrived[slot] = true;
    --b.waiting;
    // Buckets start in order, on every rank alike.
    while (next_start_ < buckets_.size() && buckets_[next_start_].waiting == 0) start(buckets_[next_start_++]);
}

void DataParallel::start(Bucket& b) {
    if (!options_.shard_optimizer_state) {
        b.work = group_.all_reduce_async(b.buffer);
        return;
    }
    Tensor part = b.part(group_.rank());
    b.work = group_.reduce_scatter_async(b.buffer, part);
}

void DataParallel::finish_gradients() {
    NoGradGuard no_grad;
    for (; next_start_ < buckets_.size(); ++next_start_) {
        Bucket& b = buckets_[next_start_];
        for (size_t i = 0; i < b.plan.params.size(); ++i) {
            if (b.arrived[i]) continue;
            const Tensor& p = params_[b.plan.params[i]];
            Tensor slot = b.buffer.narrow(0, b.plan.offsets[i], p.numel());
            if (p.grad().defined()) slot.copy_(flat(p.grad()));
            else slot.zero_();  // no gradient reached it: zeros, as on a rank where one did
        }
        start(b);
    }
    const int W = group_.world_size();
    for (Bucket& b : buckets_) {
        b.work.wait();
        std::fill(b.arrived.begin(), b.arrived.end(), false);
        b.waiting = static_cast<int64_t>(b.plan.params.size());
        if (!options_.shard_optimizer_state) {
            if (W > 1) b.buffer.mul_(1.0 / W);
            for (size_t i = 0; i < b.plan.params.size(); ++i) {
                Tensor p = params_[b.plan.params[i]];
                if (!p.grad().defined()) p.impl().grad = zeros(p.shape(), TensorOptions().dtype(p.dtype()).device(p.device())).impl_ptr();
                flat(p.grad()).copy_(b.buffer.narrow(0, b.plan.offsets[i], p.numel()));
            }
            continue;
        }
        Tensor part = b.part(group_.rank());
        if (W > 1) part.mul_(1.0 / W);
        for (Piece& piece : b.pieces)
            piece.shard.impl().grad =
                part.narrow(0, piece.part_offset, piece.shard.numel()).view(piece.shard.shape()).impl_ptr();
    }
    if (options_.shard_optimizer_state)
        for (Tensor& p : params_) p.zero_grad();  // each rank's part is in its shards
    next_start_ = 0;
    sync_ = true;
}

Tensor DataParallel::clip_grad_norm_(double max_norm) {
    if (!options_.shard_optimizer_state) return clip_grad_norm_tensor_(params_, max_norm);
    NT_CHECK(max_norm > 0, "DataParallel::clip_grad_norm_: expected max_norm > 0, got ", max_norm);
    std::vector<Tensor> shards;
    for (const Bucket& b : buckets_)
        for (const Piece& piece : b.pieces) shards.push_back(piece.shard);
    const Device device = params_[0].device();
    // This rank's sum of squares (the norm of its shards, squared), summed over the ranks.
    Tensor sum_sq = zeros({1}, TensorOptions().dtype(DType::F64).device(device));
    if (!shards.empty()) {
        Tensor local = clip_grad_norm_tensor_(shards, std::numeric_limits<double>::max());
        sum_sq = mul(local, local).reshape({1});
    }
    group_.all_reduce(sum_sq);
    const double norm = std::sqrt(sum_sq.item<double>());
    if (norm > max_norm) {
        const double coef = std::isfinite(norm) ? max_norm / (norm + 1e-6) : 0.0;
        for (Tensor& s : shards) s.grad().mul_(coef);
    }
    return full({}, norm, TensorOptions().dtype(DType::F64).device(device));
}

void DataParallel::after_step() {
    if (options_.shard_optimizer_state) {
        NoGradGuard no_grad;
        const int rank = group_.rank();
        for (Bucket& b : buckets_) {
            Tensor part = b.part(rank);
            for (const Piece& piece : b.pieces)
                part.narrow(0, piece.part_offset, piece.shard.numel()).copy_(flat(piece.shard));
            b.work = group_.all_gather_async(part, b.buffer);
        }
        for (Bucket& b : buckets_) {
            b.work.wait();
            for (size_t i = 0; i < b.plan.params.size(); ++i) {
                Tensor p = params_[b.plan.params[i]];
                flat(p).copy_(b.buffer.narrow(0, b.plan.offsets[i], p.numel()));
            }
        }
    }
    if (options_.check_replicas) check_replicas();
}

void DataParallel::check_replicas() const {
    const int W = group_.world_size();
    if (W == 1) return;
    const int64_t n = static_cast<int64_t>(params_.size());
    Tensor hashes = empty({n}, TensorOptions().dtype(DType::I64));
    for (int64_t k = 0; k < n; ++k) {
        Tensor host = params_[k].to(Device::CPU).contiguous();
        if (is_dry_run()) continue;  // Note [The dry run]: the copies made, no bytes to hash
        hashes.data_ptr<int64_t>()[k] =
            static_cast<int64_t>(XXH3_64bits(host.storage()->data(), static_cast<size_t>(host.nbytes())));
    }
    const Device device = params_[0].device();
    Tensor mine = hashes.to(device);
    Tensor all = empty({W * n}, TensorOptions().dtype(DType::I64).device(device));
    group_.all_gather(mine, all);
    const std::vector<int64_t> every = all.to_vector<int64_t>();
    for (int r = 1; r < W; ++r)
        for (int64_t k = 0; k < n; ++k)
            NT_CHECK(every[r * n + k] == every[k], "DataParallel::check_replicas: parameter #", k, " (shape ",
                     shape_str(params_[k].shape()), ") differs between rank ", r, " and rank 0");
}

int64_t DataParallel::buckets() const { return static_cast<int64_t>(buckets_.size()); }

int64_t DataParallel::bucket_bytes() const {
    int64_t bytes = 0;
    for (const Bucket& b : buckets_) bytes += b.buffer.nbytes();
    return bytes;
}

namespace {
// The state tensors of one parameter that a checkpoint holds, by kind: AdamW's m, v and master;
// Muon's momentum buffer and master.
std::vector<Tensor> state_tensors(const AdamW::ParamState& s) { return {s.m, s.v, s.master}; }
std::vector<Tensor> state_tensors(const Muon::ParamState& s) { return {s.momentum_buffer, s.master}; }
}  // namespace

void DataParallel::gather_state(const AdamW* shard_adamw, const Muon* shard_muon, AdamW* full_adamw,
                                Muon* full_muon) const {
    if (!options_.shard_optimizer_state) return;
    NoGradGuard no_grad;
    const int W = group_.world_size();
    const DType dtype = params_[0].dtype();
    const Device device = params_[0].device();
    // Every check before the first collective, so that a rank cannot fail between two of them.
    for (const Bucket& b : buckets_) {
        const bool muon = b.plan.matrices;
        NT_CHECK(muon ? shard_muon != nullptr : shard_adamw != nullptr, "DataParallel::gather_state: expected ",
                 muon ? "Muon" : "AdamW", "'s sharded optimizer, got null");
        for (const Piece& piece : b.pieces) muon ? (void)shard_muon->state(piece.shard) : (void)shard_adamw->state(piece.shard);
        for (size_t p : b.plan.params)
            if (muon ? full_muon != nullptr : full_adamw != nullptr)
                muon ? (void)full_muon->state(params_[p]) : (void)full_adamw->state(params_[p]);
    }
    for (const Bucket& b : buckets_) {
        const bool muon = b.plan.matrices;
        const size_t kinds = muon ? 2 : 3;
        for (size_t kind = 0; kind < kinds; ++kind) {
            const bool master = kind == kinds - 1;
            if (master && dtype != DType::BF16) continue;  // only bf16 parameters have masters
            const DType state_dtype = master ? DType::F32 : stat_dtype(dtype);
            Tensor local = zeros({b.plan.part}, TensorOptions().dtype(state_dtype).device(device));
            for (const Piece& piece : b.pieces) {
                const Tensor s = muon ? state_tensors(shard_muon->state(piece.shard))[kind]
                                      : state_tensors(shard_adamw->state(piece.shard))[kind];
                local.narrow(0, piece.part_offset, piece.shard.numel()).copy_(flat(s));
            }
            Tensor all = empty({W * b.plan.part}, TensorOptions().dtype(state_dtype).device(device));
            group_.all_gather(local, all);
            if (muon ? full_muon == nullptr : full_adamw == nullptr) continue;
            for (size_t i = 0; i < b.plan.params.size(); ++i) {
                const Tensor& p = params_[b.plan.params[i]];
                Tensor s = muon ? state_tensors(full_muon->state(p))[kind] : state_tensors(full_adamw->state(p))[kind];
                flat(s).copy_(all.narrow(0, b.plan.offsets[i], p.numel()));
            }
        }
    }
    if (full_adamw && shard_adamw) full_adamw->set_step_count(shard_adamw->step_count());
    if (full_muon && shard_muon) full_muon->set_step_count(shard_muon->step_count());
}

void DataParallel::scatter_state(const AdamW* full_adamw, const Muon* full_muon, AdamW* shard_adamw,
                                 Muon* shard_muon) const {
    if (!options_.shard_optimizer_state) return;
    NoGradGuard no_grad;
    const bool bf16 = params_[0].dtype() == DType::BF16;
    for (const Bucket& b : buckets_) {
        const bool muon = b.plan.matrices;
        NT_CHECK(muon ? (full_muon && shard_muon) : (full_adamw && shard_adamw), "DataParallel::scatter_state: expected ",
                 muon ? "Muon" : "AdamW", "'s full and sharded optimizers, got null");
        for (const Piece& piece : b.pieces) {
            const Tensor& p = params_[piece.param];
            const std::vector<Tensor> from =
                muon ? state_tensors(full_muon->state(p)) : state_tensors(full_adamw->state(p));
            const std::vector<Tensor> to =
                muon ? state_tensors(shard_muon->state(piece.shard)) : state_tensors(shard_adamw->state(piece.shard));
            for (size_t kind = 0; kind < to.size(); ++kind) {
                if (kind == to.size() - 1 && !bf16) continue;
                Tensor dst = to[kind];
                flat(dst).copy_(flat(from[kind]).narrow(0, piece.param_offset, piece.shard.numel()));
            }
        }
    }
    if (shard_adamw && full_adamw) shard_adamw->set_step_count(full_adamw->step_count());
    if (shard_muon && full_muon) shard_muon->set_step_count(full_muon->step_count());
}

}  // namespace normtape
