// ops/embedding.cpp: gather forward, scatter-add backward.
#include "ops/embedding.h"

#include <algorithm>
#include <vector>

#include "core/autograd.h"
#include "core/dispatch.h"
#include "ops/checks.h"

namespace normtape {

namespace {

struct EmbeddingBackward : Node {
    SavedTensor ids;
    int64_t V;
    EmbeddingBackward(const Tensor& ids_, int64_t v) : ids(ids_), V(v) {}
    const char* name() const override { return "EmbeddingBackward"; }
    std::vector<SavedTensor*> saved_tensors() override { return {&ids}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor idx = ids.unpack(name()), g = grad_output.contiguous();
        int64_t C = g.size(-1);
        Tensor dweight = empty({V, C}, TensorOptions().dtype(g.dtype()));
        dispatch_floating(g.dtype(), name(), [&](auto tag) {
            using T = decltype(tag);
            using A = acc_t<T>;
            const int64_t* pi = idx.data_ptr<int64_t>();
            const T* pg = g.data_ptr<T>();
            std::vector<A> acc(V * C, A(0));
            for (int64_t i = 0, end = idx.numel(); i < end; ++i)
                for (int64_t c = 0; c < C; ++c) acc[pi[i] * C + c] += A(pg[i * C + c]);
            T* pw = dweight.data_ptr<T>();
            for (int64_t k = 0; k < V * C; ++k) pw[k] = static_cast<T>(acc[k]);
        });
        return {Tensor(), dweight};
    }
};

}  // namespace

Tensor embedding(const Tensor& ids_in, const Tensor& weight_in) {
    detail::check_index_input("embedding", "ids", ids_in);
    detail::check_floating_input("embedding", "weight", weight_in);
    NT_CHECK(weight_in.dim() == 2, "embedding: expected weight of shape [V, C], got ", shape_str(weight_in.shape()));
    Tensor ids = ids_in.contiguous(), weight = weight_in.contiguous();
    int64_t V = weight.size(0), C = weight.size(1);
    detail::check_indices("embedding", "ids", ids, V);
    const int64_t* pi = ids.data_ptr<int64_t>();
    Shape out_shape = ids.shape();
    out_shape.push_back(C);
    Tensor out = empty(out_shape, TensorOptions().dtype(weight.dtype()));
    dispatch_floating(weight.dtype(), "embedding", [&](auto tag) {
        using T = decltype(tag);
        const T* pw = weight.data_ptr<T>();
        T* po = out.data_ptr<T>();
        for (int64_t i = 0, end = ids.numel(); i < end; ++i) std::copy(pw + pi[i] * C, pw + (pi[i] + 1) * C, po + i * C);
    });
    if (should_record(ids, weight)) record(std::make_shared<EmbeddingBackward>(ids, V), out, ids, weight);
    return out;
}

}  // namespace normtape
