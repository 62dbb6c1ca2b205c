// ops/cross_entropy.cpp: log-sum-exp forward, softmax-minus-onehot backward: checks, dispatch,
// CPU kernels, node. The CUDA kernels are in ops/cross_entropy.cu.
#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

namespace normtape {

namespace {

struct CrossEntropyBackward : Node {
    SavedTensor logits, lse, targets;
    CrossEntropyBackward(const Tensor& l, const Tensor& s, const Tensor& t) : logits(l), lse(s), targets(t) {}
    const char* name() const override { return "CrossEntropyBackward"; }
    std::vector<SavedTensor*> saved_tensors() override { return {&logits, &lse, &targets}; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        Tensor l = logits.unpack(name()), s = lse.unpack(name()), t = targets.unpack(name());
        Tensor dlogits = empty(l.shape(), TensorOptions().dtype(l.dtype()).device(l.device()));
        dispatch_floating(l.dtype(), name(), [&](auto tag) {
            using T = decltype(tag);
            int64_t V = l.size(-1), M = l.numel() / V;
            if (l.device().is_cuda()) {
                NT_CUDA(detail::cross_entropy_backward_cuda<T>(
                    detail::device_ptr<T>(dlogits), detail::device_ptr<T>(l), detail::device_ptr<acc_t<T>>(s),
                    detail::device_ptr<int64_t>(t), static_cast<double>(grad_output.item<T>()), M, V, l.device().index));
                return;
            }
            using A = acc_t<T>;
            A g = A(grad_output.item<T>()) / static_cast<A>(M);
            const T* pl = l.data_ptr<T>();
            const A* ps = s.data_ptr<A>();
            const int64_t* pt = t.data_ptr<int64_t>();
            T* pd = dlogits.data_ptr<T>();
            for (int64_t i = 0; i < M; ++i)
                for (int64_t v = 0; v < V; ++v)
                    pd[i * V + v] = static_cast<T>((std::exp(A(pl[i * V + v]) - ps[i]) - (v == pt[i] ? A(1) : A(0))) * g);
        });
        return {dlogits, Tensor()};
    }
};

}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in) {
    const char* op = "cross_entropy";
    detail::check_floating_input(op, "logits", logits_in);
    detail::check_index_input(op, "targets", targets_in);
    NT_CHECK_AS(ShapeError, logits_in.dim() >= 1, op, ": expected logits of shape [..., V], got a scalar (shape [])");
    Shape rows_shape(logits_in.shape().begin(), logits_in.shape().end() - 1);
    NT_CHECK_AS(ShapeError, targets_in.shape() == rows_shape, op, ": expected targets of shape ", shape_str(rows_shape),
                " for logits of shape ", shape_str(logits_in.shape()), ", got ", shape_str(targets_in.shape()));
    NT_CHECK_AS(DeviceError, targets_in.device() == logits_in.device(), op, ": expected targets on ",
                device_name(logits_in.device()), " (as logits), got ", device_name(targets_in.device()));
    Tensor logits = logits_in.contiguous(), targets = targets_in.contiguous();
    int64_t V = logits.size(-1), M = logits.numel() / V;
    detail::check_indices(op, "targets", targets, V);
    Tensor lse = empty({M}, TensorOptions().dtype(stat_dtype(logits.dtype())).device(logits.device()));
    Tensor loss = empty({}, TensorOptions().dtype(logits.dtype()).device(logits.device()));
    dispatch_floating(logits.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        using A = acc_t<T>;
        if (logits.device().is_cuda()) {
            NT_CUDA(detail::cross_entropy_forward_cuda<T>(detail::device_ptr<T>(loss), detail::device_ptr<A>(lse),
                                                          detail::device_ptr<T>(logits),
                                                          detail::device_ptr<int64_t>(targets), M, V,
                                                          logits.device().index));
            return;
        }
        const int64_t* pt = targets.data_ptr<int64_t>();
        const T* pl = logits.data_ptr<T>();
        A* ps = lse.data_ptr<A>();
        double total = 0.0;
        for (int64_t i = 0; i < M; ++i) {
            const T* row = pl + i * V;
            double maxv = row[0];
            for (int64_t v = 1; v < V; ++v) maxv = std::max(maxv, double(row[v]));
            double sum = 0.0;
            for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - maxv);
            ps[i] = static_cast<A>(maxv + std::log(sum));
            total += maxv + std::log(sum) - double(row[pt[i]]);
        }
        *loss.data_ptr<T>() = static_cast<T>(total / static_cast<double>(M));
    });
    if (should_record(logits)) record(std::make_shared<CrossEntropyBackward>(logits, lse, targets), loss, logits, targets);
    detail::check_forward_anomaly(op, "loss", loss, {{"logits", logits}});
    return loss;
}

}  // namespace normtape
