// ops/attention_cudnn.cpp: causal attention through cuDNN's fused flash attention. cuDNN 9 runs
// scaled dot-product attention as one fused kernel when it is handed the attention's graph of
// operations (matrix products, pointwise operations, reductions) through its backend API and an
// engine of its own recognizes the pattern: forward, with the row statistics, and backward, with
// dq, dk, dv (NVIDIA's cuDNN Graph API documentation, "Fused Flash Attention"; the graphs below
// are the ones its frontend library composes for a causal mask, written here from that
// description against the backend API, since the frontend is not installed).
//
// A plan is built once per layout (B, heads, key/value heads, T, head size, strides) and device,
// and kept for the process's lifetime; a layout cuDNN has no engine for is remembered too, and our
// own kernels run it (said once on stderr). Every device allocation (the plan's workspace, the
// backward's row sums and f32 dq accumulator) comes from normtape's allocator, counted like any
// other. Without cuDNN (NORMTAPE_WITH_CUDNN unset) every entry point reports "not run".
#include "ops/attention_cudnn.h"

#if NORMTAPE_WITH_CUDNN

#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <tuple>

#include "core/cuda_allocator.h"
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "core/dry_run.h"
#include "core/tensor.h"

namespace normtape::detail {

namespace {

// A cuDNN call that fails while a graph or plan is being built: the layout is not supported.
struct Unsupported {
    std::string what;
};

std::string cudnn_message(cudnnStatus_t status) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof(detail));
    return std::string(cudnnGetErrorString(status)) + (detail[0] ? std::string(" (") + detail + ")" : "");
}

#define CUDNN_BUILD(call)                                                                             \
    do {                                                                                              \
        cudnnStatus_t st_ = (call);                                                                   \
        if (st_ != CUDNN_STATUS_SUCCESS) throw Unsupported{std::string(#call) + ": " + cudnn_message(st_)}; \
    } while (0)

#define CUDNN_CHECK(call)                                                                                     \
    do {                                                                                                      \
        cudnnStatus_t st_ = (call);                                                                           \
        NT_CHECK_AS(OutOfMemoryError, st_ != CUDNN_STATUS_ALLOC_FAILED, "cuDNN error: ", cudnn_message(st_), \
                    " in ", #call);                                                                           \
        NT_CHECK(st_ == CUDNN_STATUS_SUCCESS, "cuDNN error: ", cudnn_message(st_), " in ", #call);            \
    } while (0)

// The device's cuDNN handle, on cuda::stream(device); created on first use (by cached_plan,
// where a failure, e.g. a cuDNN the driver cannot run, means our kernels run attention), kept (as
// the other handles of core/cuda_context.h).
cudnnHandle_t handle(int device) {
    static std::map<int, cudnnHandle_t> handles;
    auto it = handles.find(device);
    if (it != handles.end()) return it->second;
    cudaStream_t stream = cuda::stream(device);  // makes `device` current
    cudnnHandle_t h = nullptr;
    CUDNN_BUILD(cudnnCreate(&h));
    CUDNN_BUILD(cudnnSetStream(h, stream));
    return handles[device] = h;
}

// A backend descriptor, destroyed with its owner.
class Descriptor {
public:
    explicit Descriptor(cudnnBackendDescriptorType_t type) { CUDNN_BUILD(cudnnBackendCreateDescriptor(type, &d_)); }
    Descriptor(const Descriptor&) = delete;
    Descriptor& operator=(const Descriptor&) = delete;
    ~Descriptor() {
        if (d_) cudnnBackendDestroyDescriptor(d_);
    }
    cudnnBackendDescriptor_t get() const { return d_; }

    template <class V>
    Descriptor& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, const V& value) {
        CUDNN_BUILD(cudnnBackendSetAttribute(d_, name, type, 1, &value));
        return *this;
    }
    template <class V>
    Descriptor& set_array(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                          const std::vector<V>& values) {
        CUDNN_BUILD(cudnnBackendSetAttribute(d_, name, type, static_cast<int64_t>(values.size()), values.data()));
        return *this;
    }
    Descriptor& set(cudnnBackendAttributeName_t name, const Descriptor& other) {
        return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, other.d_);
    }
    Descriptor& finalize() {
        CUDNN_BUILD(cudnnBackendFinalize(d_));
        return *this;
    }

private:
    cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::vector<int64_t>;

// Row-major strides of `dims`.
Dims packed_strides(const Dims& dims) {
    Dims s(dims.size(), 1);
    for (size_t i = dims.size() - 1; i > 0; --i) s[i - 1] = s[i] * dims[i];
    return s;
}

// One attention graph being composed: its tensors and operations, owned until it is finalized.
class Graph {
public:
    struct Tensor {
        const Descriptor* desc;
        Dims dims;
    };

    // A tensor in device memory (uid > 0: its place in the variant pack), a by-value scalar
    // (host memory), or a virtual one (never in memory: uid 0 picks a fresh id).
    Tensor tensor(const Dims& dims, const Dims& strides, cudnnDataType_t type, int64_t uid, bool is_virtual = false,
                  bool by_value = false) {
        if (uid == 0) uid = next_virtual_uid_++;
        Descriptor& d = descriptors_.emplace_back(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, type)
            .set_array(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dims)
            .set_array(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, strides)
            .set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid)
            .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, int64_t(16))
            .set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, is_virtual)
            .set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, by_value)
            .finalize();
        return {&d, dims};
    }
    Tensor scalar(int64_t uid) { return tensor({1, 1, 1, 1}, {1, 1, 1, 1}, CUDNN_DATA_FLOAT, uid, false, true); }
    Tensor virtual_tensor(const Dims& dims, cudnnDataType_t type = CUDNN_DATA_FLOAT) {
        return tensor(dims, packed_strides(dims), type, 0, true);
    }

    // y = mode(x[, b[, t]]) elementwise (b, t broadcast), computed in `precision`; y virtual of
    // x's dims and `type` unless given.
    Tensor pointwise(cudnnPointwiseMode_t mode, const Tensor& x, const Tensor* b = nullptr, const Tensor* t = nullptr,
                     cudnnDataType_t type = CUDNN_DATA_FLOAT, const Tensor* y = nullptr,
                     cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1) {
        Tensor out = y ? *y : virtual_tensor(x.dims, type);
        Descriptor& pw = descriptors_.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode)
            .set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, precision);
        if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, axis);
        pw.finalize();
        Descriptor& op = descriptors_.emplace_back(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
        op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw).set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x.desc);
        if (b) op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b->desc);
        if (t) op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t->desc);
        op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *out.desc).finalize();
        operations_.push_back(op.get());
        return out;
    }
    // The index tensor of x's elements along `axis` (int32).
    Tensor index(const Tensor& x, int64_t axis) {
        return pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, CUDNN_DATA_INT32, nullptr, CUDNN_DATA_INT32,
                         axis);
    }

    // y = x reduced by `op` to y's dims (virtual f32 of `dims` unless y is given).
    Tensor reduction(cudnnReduceTensorOp_t reduce, const Tensor& x, const Dims& dims, const Tensor* y = nullptr) {
        Tensor out = y ? *y : virtual_tensor(dims);
        Descriptor& r = descriptors_.emplace_back(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        r.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, reduce)
            .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT)
            .finalize();
        Descriptor& op = descriptors_.emplace_back(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
        op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, *x.desc)
            .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, *out.desc)
            .set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, r)
            .finalize();
        operations_.push_back(op.get());
        return out;
    }

    // c = a b over the last two dimensions, batched over the first two (f32 arithmetic).
    Tensor matmul(const Tensor& a, const Tensor& b, const Tensor& c) {
        Descriptor& m = descriptors_.emplace_back(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        m.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT).finalize();
        Descriptor& op = descriptors_.emplace_back(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
        op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, *a.desc)
            .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, *b.desc)
            .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, *c.desc)
            .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, m)
            .finalize();
        operations_.push_back(op.get());
        return c;
    }

    // y: x's elements seen through y's dims and strides (a transpose, here).
    Tensor reshape(const Tensor& x, const Tensor& y) {
        Descriptor& op = descriptors_.emplace_back(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
        op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, *x.desc).set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, *y.desc).finalize();
        operations_.push_back(op.get());
        return y;
    }

    // The plan of the first engine cuDNN's heuristics (mode A) offer that finalizes for the graph.
    cudnnBackendDescriptor_t plan(cudnnHandle_t h, int64_t& workspace_bytes) {
        Descriptor& graph = descriptors_.emplace_back(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
        graph.set_array(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, operations_)
            .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, h)
            .finalize();
        Descriptor& heuristics = descriptors_.emplace_back(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
            .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, CUDNN_HEUR_MODE_A)
            .finalize();
        int64_t count = 0;
        CUDNN_BUILD(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
        if (count == 0) throw Unsupported{"cuDNN's heuristics offer no engine for the graph"};
        std::vector<cudnnBackendDescriptor_t> configs;
        for (int64_t i = 0; i < count; ++i)
            configs.push_back(descriptors_.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR).get());
        CUDNN_BUILD(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                             CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &count, configs.data()));
        std::string last;
        for (int64_t i = 0; i < count; ++i) {
            cudnnBackendDescriptor_t p = nullptr;
            CUDNN_BUILD(cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p));
            cudnnStatus_t st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &configs[i]);
            if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                              nullptr, &workspace_bytes);
            if (st == CUDNN_STATUS_SUCCESS) return p;
            last = cudnn_message(st);
            cudnnBackendDestroyDescriptor(p);
        }
        throw Unsupported{"no engine of cuDNN's " + std::to_string(count) + " finalizes a plan: " + last};
    }

private:
    std::deque<Descriptor> descriptors_;  // stable addresses: operations refer to tensors
    std::vector<cudnnBackendDescriptor_t> operations_;
    int64_t next_virtual_uid_ = 1000;
};

// The variant pack's ids of the tensors in memory.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kMaskValue, kOne, kdO, kdQ, kdK, kdV, kRowSum, kdQAccum };

// The strides of q ([B, NH, T, hs] dims), of k and v ([B, NKV, T, hs]) and of out and dout
// ([B, NH, T, hs] over out's [B, T, NH * hs]) in the layout.
Dims q_strides(const AttentionLayout& L) { return {L.q_batch, L.hs, L.q_row, 1}; }
Dims kv_strides(const AttentionLayout& L) { return {L.T * L.kv_row, L.hs, L.kv_row, 1}; }
Dims out_strides(const AttentionLayout& L) { return {L.T * L.NH * L.hs, L.hs, L.NH * L.hs, 1}; }
// The transposed view [B, NKV, hs, T] of k or v.
Dims transposed(const Dims& s) { return {s[0], s[1], s[3], s[2]}; }

// The causal mask on scores s [B, NH, T, T]: s where key <= query, else the lowest float
// (cuDNN's frontend composes it so; every row keeps its diagonal, so no row is all masked).
Graph::Tensor causal_mask(Graph& g, const Graph::Tensor& s) {
    const Graph::Tensor row = g.index(s, 2), col = g.index(s, 3);
    const Graph::Tensor keep = g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, CUDNN_DATA_BOOLEAN, nullptr,
                                           CUDNN_DATA_BOOLEAN);
    const Graph::Tensor lowest = g.scalar(kMaskValue);
    return g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, &lowest, &keep);
}

// Forward: S = scale Q K^T, masked; M = rowmax S, Z = rowsum exp(S - M); stats = M + log Z;
// O = (exp(S - M) / Z) V, the probabilities rounded to bf16 for the product.
cudnnBackendDescriptor_t build_forward(Graph& g, const AttentionLayout& L, cudnnHandle_t h, int64_t& workspace) {
    const int64_t B = L.B, NH = L.NH, NKV = L.NKV, T = L.T, hs = L.hs;
    const Graph::Tensor q = g.tensor({B, NH, T, hs}, q_strides(L), CUDNN_DATA_BFLOAT16, kQ);
    const Graph::Tensor kt = g.tensor({B, NKV, hs, T}, transposed(kv_strides(L)), CUDNN_DATA_BFLOAT16, kK);
    const Graph::Tensor v = g.tensor({B, NKV, T, hs}, kv_strides(L), CUDNN_DATA_BFLOAT16, kV);
    const Graph::Tensor o = g.tensor({B, NH, T, hs}, out_strides(L), CUDNN_DATA_BFLOAT16, kO);
    const Graph::Tensor stats = g.tensor({B, NH, T, 1}, {NH * T, T, 1, 1}, CUDNN_DATA_FLOAT, kStats);
    const Graph::Tensor scale = g.scalar(kScale);

    Graph::Tensor s = g.matmul(q, kt, g.virtual_tensor({B, NH, T, T}));
    s = g.pointwise(CUDNN_POINTWISE_MUL, s, &scale);
    s = causal_mask(g, s);
    const Graph::Tensor m = g.reduction(CUDNN_REDUCE_TENSOR_MAX, s, {B, NH, T, 1});
    const Graph::Tensor e = g.pointwise(CUDNN_POINTWISE_EXP, g.pointwise(CUDNN_POINTWISE_SUB, s, &m));
    const Graph::Tensor z = g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, {B, NH, T, 1});
    const Graph::Tensor log_z = g.pointwise(CUDNN_POINTWISE_LOG, z);
    g.pointwise(CUDNN_POINTWISE_ADD, m, &log_z, nullptr, CUDNN_DATA_FLOAT, &stats);
    const Graph::Tensor p = g.pointwise(CUDNN_POINTWISE_DIV, e, &z, nullptr, CUDNN_DATA_BFLOAT16);
    g.matmul(p, v, o);
    return g.plan(h, workspace);
}

// Backward: D = rowsum(dO * O) (kept in memory: kRowSum); P = exp(S - stats) with S as in
// forward; dV = P^T dO; dS = scale P (dO V^T - D); dK = dS^T Q; dQ = dS K, added up in f32
// (kdQAccum, zero before it runs) and rounded to bf16. With grouped heads dK and dV are formed per query
// head and summed over each group.
cudnnBackendDescriptor_t build_backward(Graph& g, const AttentionLayout& L, cudnnHandle_t h, int64_t& workspace) {
    const int64_t B = L.B, NH = L.NH, NKV = L.NKV, T = L.T, hs = L.hs;
    const auto bf = CUDNN_DATA_BFLOAT16;
    const Graph::Tensor q = g.tensor({B, NH, T, hs}, q_strides(L), bf, kQ);
    const Graph::Tensor kt = g.tensor({B, NKV, hs, T}, transposed(kv_strides(L)), bf, kK);
    const Graph::Tensor vt = g.tensor({B, NKV, hs, T}, transposed(kv_strides(L)), bf, kV);
    const Graph::Tensor o = g.tensor({B, NH, T, hs}, out_strides(L), bf, kO);
    const Graph::Tensor d_o = g.tensor({B, NH, T, hs}, out_strides(L), bf, kdO);
    const Graph::Tensor stats = g.tensor({B, NH, T, 1}, {NH * T, T, 1, 1}, CUDNN_DATA_FLOAT, kStats);
    const Graph::Tensor dq = g.tensor({B, NH, T, hs}, q_strides(L), bf, kdQ);
    const Graph::Tensor dk = g.tensor({B, NKV, T, hs}, kv_strides(L), bf, kdK);
    const Graph::Tensor dv = g.tensor({B, NKV, T, hs}, kv_strides(L), bf, kdV);
    const Graph::Tensor row_sum = g.tensor({B, NH, T, 1}, {NH * T, T, 1, 1}, CUDNN_DATA_FLOAT, kRowSum);
    const Graph::Tensor dq_accum = g.tensor({B, NH, T, hs}, packed_strides({B, NH, T, hs}), CUDNN_DATA_FLOAT, kdQAccum);
    const Graph::Tensor scale = g.scalar(kScale), one = g.scalar(kOne);
    const Dims scores{B, NH, T, T}, transposed_scores{NH * T * T, T * T, 1, T};

    const Graph::Tensor d_oo = g.pointwise(CUDNN_POINTWISE_MUL, d_o, &o);
    const Graph::Tensor d = g.reduction(CUDNN_REDUCE_TENSOR_ADD, d_oo, {B, NH, T, 1});
    g.pointwise(CUDNN_POINTWISE_MUL, d, &one, nullptr, CUDNN_DATA_FLOAT, &row_sum);

    Graph::Tensor s = g.matmul(q, kt, g.virtual_tensor(scores));
    s = g.pointwise(CUDNN_POINTWISE_MUL, s, &scale);
    s = causal_mask(g, s);
    const Graph::Tensor p = g.pointwise(CUDNN_POINTWISE_EXP, g.pointwise(CUDNN_POINTWISE_SUB, s, &stats));

    // dV (and dK below): [B, NH, T, hs] per query head, then summed over each group.
    auto per_group = [&](const Graph::Tensor& a_t, const Graph::Tensor& b, const Graph::Tensor& out) {
        if (NH == NKV) return g.matmul(a_t, b, out);
        const Graph::Tensor full = g.matmul(a_t, b, g.virtual_tensor({B, NH, T, hs}, bf));
        return g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, {B, NKV, T, hs}, &out);
    };
    const Graph::Tensor p_t = g.reshape(p, g.tensor(scores, transposed_scores, bf, 0, true));
    per_group(p_t, d_o, dv);

    const Graph::Tensor dp = g.matmul(d_o, vt, g.virtual_tensor(scores));
    Graph::Tensor ds = g.pointwise(CUDNN_POINTWISE_SUB, dp, &row_sum);
    ds = g.pointwise(CUDNN_POINTWISE_MUL, ds, &p);
    ds = g.pointwise(CUDNN_POINTWISE_MUL, ds, &scale);
    const Graph::Tensor ds_t = g.reshape(ds, g.tensor(scores, transposed_scores, bf, 0, true));
    per_group(ds_t, q, dk);

    const Graph::Tensor k = g.reshape(kt, g.tensor({B, NKV, T, hs}, kv_strides(L), bf, 0, true));
    g.matmul(ds, k, dq_accum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, nullptr, bf, &dq);
    return g.plan(h, workspace);
}

struct Plan {
    cudnnBackendDescriptor_t plan = nullptr;  // null: cuDNN has no engine for the layout
    int64_t workspace = 0;
};

// The cached plan of `layout` on `device`, forward or backward; built on first use.
const Plan& cached_plan(const AttentionLayout& L, bool backward, int device) {
    using Key = std::tuple<int, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;
    static std::map<Key, Plan> plans;
    const Key key{device, backward, L.B, L.T, L.NH, L.NKV, L.hs, L.q_batch, L.q_row, L.kv_row};
    auto it = plans.find(key);
    if (it != plans.end()) return it->second;
    Plan plan;
    try {
        Graph g;
        cudnnHandle_t h = handle(device);
        plan.plan = backward ? build_backward(g, L, h, plan.workspace) : build_forward(g, L, h, plan.workspace);
    } catch (const Unsupported& e) {
        std::fprintf(stderr,
                     "normtape: cuDNN cannot run the %s attention of B=%lld T=%lld n_head=%lld n_kv_head=%lld hs=%lld "
                     "(%s); normtape's own kernels run it\n",
                     backward ? "backward" : "forward", static_cast<long long>(L.B), static_cast<long long>(L.T),
                     static_cast<long long>(L.NH), static_cast<long long>(L.NKV), static_cast<long long>(L.hs),
                     e.what.c_str());
        // Within a dry run's capture a failure may be the capture's: not cached, so that the real
        // run builds the plan again rather than take our kernels for good.
        if (is_dry_run()) {
            static const Plan none;
            return none;
        }
    }
    return plans[key] = plan;
}

// cuDNN's engines read 16-byte aligned rows: every pointer and row stride a multiple of 8 bf16.
bool aligned(const AttentionLayout& L, std::initializer_list<const void*> pointers) {
    for (const void* p : pointers)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
    return L.first_row == 0 && L.hs % 8 == 0 && L.q_row % 8 == 0 && L.kv_row % 8 == 0 && L.q_batch % 8 == 0;
}

// A device buffer of at least `bytes` from normtape's allocator: f32 elements, so it takes
// scratch_bytes(bytes).
int64_t scratch_bytes(int64_t bytes) { return (bytes + 3) / 4 * 4; }
normtape::Tensor scratch(int64_t bytes, int device) {
    return empty({scratch_bytes(bytes) / 4}, TensorOptions().dtype(DType::F32).device(Device::cuda(device)));
}

// The backward's own buffers: the row sums dout . out [B, NH, T] and dq's accumulator
// [B, NH, T, hs], f32.
int64_t row_sum_bytes(const AttentionLayout& L) { return L.B * L.NH * L.T * 4; }
int64_t dq_accum_bytes(const AttentionLayout& L) { return row_sum_bytes(L) * L.hs; }

// Runs `plan` on the tensors `uids` names at `pointers`; a cuDNN failure here is an Error (the plan
// was built, so nothing falls back).
void execute(const Plan& plan, const std::vector<int64_t>& uids, const std::vector<void*>& pointers, int device) {
    normtape::Tensor workspace = plan.workspace > 0 ? scratch(plan.workspace, device) : normtape::Tensor();
    void* ws = workspace.defined() ? device_ptr<float>(workspace) : nullptr;
    // cuDNN's own scratch: its kernels write it with stores that initcheck does not see on Hopper
    // before they read it back.
    if (ws) cuda_mark_written(device, ws, plan.workspace);
    try {
        Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
        pack.set_array(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, uids)
            .set_array(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, pointers)
            .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, ws)
            .finalize();
        CUDNN_CHECK(cudnnBackendExecute(handle(device), plan.plan, pack.get()));
    } catch (const Unsupported& e) {
        NT_CHECK(false, "cuDNN attention: ", e.what);
    }
}

}  // namespace

bool cudnn_attention_built() { return true; }

bool cudnn_attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                             const AttentionLayout& L, int device) {
    if (!aligned(L, {out, q, k, v})) return false;
    const Plan& plan = cached_plan(L, false, device);
    if (!plan.plan) return false;
    float scale = 1.0f / std::sqrt(static_cast<float>(L.hs)), lowest = std::numeric_limits<float>::lowest();
    execute(plan, {kQ, kK, kV, kO, kStats, kScale, kMaskValue},
            {const_cast<bf16*>(q), const_cast<bf16*>(k), const_cast<bf16*>(v), out, lse, &scale, &lowest}, device);
    // out [B, Tq, NH, hs] and lse [B, NH, Tq] are written in full.
    cuda_mark_written(device, out, L.B * L.Tq() * L.NH * L.hs * int64_t(sizeof(bf16)));
    cuda_mark_written(device, lse, L.B * L.NH * L.Tq() * int64_t(sizeof(float)));
    return true;
}

bool cudnn_attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q, const bf16* k,
                              const bf16* v, const bf16* out, const float* lse, const AttentionLayout& L,
                              int device) {
    if (!aligned(L, {dq, dk, dv, dout, q, k, v, out})) return false;
    const Plan& plan = cached_plan(L, true, device);
    if (!plan.plan) return false;
    normtape::Tensor row_sum = scratch(row_sum_bytes(L), device);
    normtape::Tensor dq_accum = scratch(dq_accum_bytes(L), device);
    // cuDNN 9.6 and later zero the accumulator themselves (the frontend zeroes it only before).
    if (cudnnGetVersion() < 90600 && !is_dry_run())  // a memset's address is checked when captured
        CUDA_CHECK(cudaMemsetAsync(device_ptr<float>(dq_accum), 0, dq_accum.numel() * sizeof(float),
                                   cuda::stream(device)));
    // Both are cuDNN's to write before it reads them, with stores (and reductions into the
    // accumulator) that initcheck does not see on Hopper.
    cuda_mark_written(device, device_ptr<float>(row_sum), row_sum_bytes(L));
    cuda_mark_written(device, device_ptr<float>(dq_accum), dq_accum_bytes(L));
    float scale = 1.0f / std::sqrt(static_cast<float>(L.hs)), lowest = std::numeric_limits<float>::lowest(), one = 1;
    auto in = [](const void* p) { return const_cast<void*>(p); };
    execute(plan, {kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV, kRowSum, kdQAccum, kScale, kMaskValue, kOne},
            {in(q), in(k), in(v), in(out), in(dout), in(lse), dq, dk, dv, device_ptr<float>(row_sum),
             device_ptr<float>(dq_accum), &scale, &lowest, &one},
            device);
    // Every row of dq (NH heads, q_row apart within a batch), dk and dv (NKV heads, kv_row apart) is
    // written in full; rows may interleave in one buffer, so each row is marked, not the span.
    for (int64_t b = 0; b < L.B; ++b)
        cuda_mark_written(device, dq + L.q_at(b, L.first_row, 0), L.NH * L.hs * int64_t(sizeof(bf16)), L.Tq(),
                          L.q_row * int64_t(sizeof(bf16)));
    for (bf16* d : {dk, dv})
        cuda_mark_written(device, d, L.NKV * L.hs * int64_t(sizeof(bf16)), L.B * L.T, L.kv_row * int64_t(sizeof(bf16)));
    return true;
}

}  // namespace normtape::detail

#else  // no cuDNN: our own kernels run every layout

namespace normtape::detail {

bool cudnn_attention_built() { return false; }
bool cudnn_attention_forward(bf16*, float*, const bf16*, const bf16*, const bf16*, const AttentionLayout&, int) {
    return false;
}
bool cudnn_attention_backward(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const bf16*, const bf16*,
                              const float*, const AttentionLayout&, int) {
    return false;
}

}  // namespace normtape::detail

#endif
