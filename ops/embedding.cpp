// ops/embedding.cpp: gather forward, scatter-add backward: checks, dispatch, CPU kernels (on
// parallel threads, core/parallel.h), node. The CUDA kernels are in ops/embedding.cu.
#include "ops/embedding.h"

#include <algorithm>
#include <memory>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

namespace normtape {

namespace {

// dweight[v, c] = the sum of g[i, c] over the ids i == v, in acc_t, in the order of i; rows of
// dweight that no id names are 0. On the cpu chunks of columns c run on parallel threads, each
// over every id, so every sum is made in the same order at any thread count.
struct EmbeddingBackward : Node {
    SavedTensor ids;
    int64_t V;
    EmbeddingBackward(const Tensor& ids_, int64_t v) : ids(ids_), V(v) {}
    const char* name() const override { return "EmbeddingBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"indices", &ids}}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor idx = ids.unpack(name()), g = grad_output.contiguous();
        int64_t C = g.size(-1);
        Tensor dweight = empty({V, C}, TensorOptions().dtype(g.dtype()).device(g.device()));
        dispatch_floating(g.dtype(), name(), [&](auto tag) {
            using T = decltype(tag);
            if (g.device().is_cuda()) {
                NT_CUDA(detail::embedding_backward_cuda<T>(detail::device_ptr<T>(dweight),
                                                           detail::device_ptr<int64_t>(idx), detail::device_ptr<T>(g),
                                                           idx.numel(), V, C, g.device().index));
                return;
            }
            using A = acc_t<T>;
            const int64_t* pi = idx.data_ptr<int64_t>();
            const T* pg = g.data_ptr<T>();
            const int64_t n = idx.numel();
            std::unique_ptr<A[]> acc(new A[V * C]);
            T* pw = dweight.data_ptr<T>();
            // At least 16 columns per chunk: a chunk reads whole cache lines of g.
            const int64_t grain = std::max<int64_t>(16, detail::kGrain / std::max<int64_t>(n + V, 1));
            detail::parallel_for(0, C, grain, [&](int64_t c0, int64_t c1) {
                for (int64_t v = 0; v < V; ++v) std::fill(&acc[v * C + c0], &acc[v * C + c1], A(0));
                for (int64_t i = 0; i < n; ++i)
                    for (int64_t c = c0; c < c1; ++c) acc[pi[i] * C + c] += A(pg[i * C + c]);
                for (int64_t v = 0; v < V; ++v)
                    for (int64_t c = c0; c < c1; ++c) pw[v * C + c] = static_cast<T>(acc[v * C + c]);
            });
        });
        return {Tensor(), dweight};
    }
};

}  // namespace

Tensor embedding(const Tensor& ids_in, const Tensor& weight_in) {
    detail::check_index_input("embedding", "ids", ids_in);
    detail::check_floating_input("embedding", "weight", weight_in);
    NT_CHECK_AS(ShapeError, weight_in.dim() == 2, "embedding: expected weight of shape [V, C], got ",
                shape_str(weight_in.shape()));
    NT_CHECK_AS(DeviceError, ids_in.device() == weight_in.device(), "embedding: expected ids on ",
                device_name(weight_in.device()), " (as weight), got ", device_name(ids_in.device()));
    detail::check_fits_int32("embedding", ids_in, "the number of ids", ids_in.numel());  // CUB's sort on CUDA
    Tensor ids = ids_in.contiguous(), weight = weight_in.contiguous();
    int64_t V = weight.size(0), C = weight.size(1);
    detail::check_indices("embedding", "ids", ids, V);
    Shape out_shape = ids.shape();
    out_shape.push_back(C);
    Tensor out = empty(out_shape, TensorOptions().dtype(weight.dtype()).device(weight.device()));
    dispatch_floating(weight.dtype(), "embedding", [&](auto tag) {
        using T = decltype(tag);
        if (weight.device().is_cuda()) {
            NT_CUDA(detail::embedding_forward_cuda<T>(detail::device_ptr<T>(out), detail::device_ptr<int64_t>(ids),
                                                      detail::device_ptr<T>(weight), ids.numel(), C,
                                                      weight.device().index));
            return;
        }
        const int64_t* pi = ids.data_ptr<int64_t>();
        const T* pw = weight.data_ptr<T>();
        T* po = out.data_ptr<T>();
        detail::parallel_for(0, ids.numel(), std::max<int64_t>(1, detail::kGrain / std::max<int64_t>(C, 1)),
                             [&](int64_t i0, int64_t i1) {
                                 for (int64_t i = i0; i < i1; ++i)
                                     std::copy(pw + pi[i] * C, pw + (pi[i] + 1) * C, po + i * C);
                             });
    });
    if (should_record(ids, weight)) record(std::make_shared<EmbeddingBackward>(ids, V), out, ids, weight);
    detail::check_forward_anomaly("embedding", "out", out, {{"weight", weight}});
    return out;
}

}  // namespace normtape
