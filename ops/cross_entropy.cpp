// ops/cross_entropy.cpp: log-sum-exp forward, softmax-minus-onehot backward, with the optional
// tanh logit softcap fused into both: checks, dispatch, CPU kernels (chunks of rows on parallel
// threads, core/parallel.h), node. The CUDA kernels are in ops/cross_entropy.cu.
#include "ops/cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"
#include "ops/elementwise.h"

namespace normtape {

namespace {

// Rows per chunk of the cpu kernels: about kGrain / 4 elements (each one an exp).
int64_t rows_grain(int64_t V) { return std::max<int64_t>(1, detail::kGrain / 4 / std::max<int64_t>(V, 1)); }

// Note [Cross-entropy writes its gradient over its logits]
// dlogits has the logits' shape, dtype and device, and the backward reads each logit once, just
// before writing that element of the gradient. So when nothing but this node can reach the saved
// logits' bytes (no other tensor shares their storage: the caller dropped the logits, as
// GPT::loss does, no other node saved them, they are no leaf and no parameter; and no handle
// copied from saved_tensors() is alive), the backward writes dlogits into that storage and
// returns it: one [M, V] buffer is live in backward instead of two (the logits and their
// gradient; 1 GiB in bf16 at B*T = 16384, V = 32768). Otherwise it allocates dlogits, and the
// logits a caller can still see are never written.
// Under retain_graph (Node::saved_tensors_retained()) the node may run again on its logits, so
// it never writes over them.
// With a softcap the same holds: the gradient of an element needs only that element's logit
// (z = softcap * tanh(logit / softcap) and 1 - tanh^2 are recomputed from it) and the row's lse,
// so each logit is still read once, just before its gradient is written over it.
struct CrossEntropyBackward : Node {
    SavedTensor logits, lse, targets;  // the raw logits [M, V]; lse of z [M] acc_t; targets [M] i64
    double softcap;                    // 0: no cap
    CrossEntropyBackward(const Tensor& l, const Tensor& s, const Tensor& t, double c)
        : logits(l), lse(s), targets(t), softcap(c) {}
    const char* name() const override { return "CrossEntropyBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"logits", &logits}, {"lse", &lse}, {"targets", &targets}}; }

    // Whether the saved logits' bytes can be reached through nothing but this node (see the Note):
    // one handle to the saved tensor (the SavedTensor's own) and one to its storage.
    bool logits_held_only_here() const {
        const Tensor& l = logits.data();
        return l.defined() && l.impl_ptr().use_count() == 1 && l.storage().use_count() == 1 &&
               !l.storage()->is_parameter();
    }

    std::vector<Tensor> apply(const Tensor& grad_output) override {
        const bool in_place = logits_held_only_here() && !saved_tensors_retained();
        Tensor l = logits.unpack(name()), s = lse.unpack(name()), t = targets.unpack(name());
        Tensor dlogits = in_place ? l : empty(l.shape(), TensorOptions().dtype(l.dtype()).device(l.device()));
        dispatch_floating(l.dtype(), name(), [&](auto tag) {
            using T = decltype(tag);
            int64_t V = l.size(-1), M = l.numel() / V;
            if (l.device().is_cuda()) {
                NT_CUDA(detail::cross_entropy_backward_cuda<T>(
                    detail::device_ptr<T>(dlogits), detail::device_ptr<T>(l), detail::device_ptr<acc_t<T>>(s),
                    detail::device_ptr<int64_t>(t), detail::device_ptr<T>(grad_output), M, V, softcap,
                    l.device().index));
                return;
            }
            // pd may be pl: each element is read before it is written.
            using A = acc_t<T>;
            A g = A(grad_output.item<T>()) / static_cast<A>(M);
            const bool capped = softcap > 0;
            const A c = static_cast<A>(softcap);
            const T* pl = l.data_ptr<T>();
            const A* ps = s.data_ptr<A>();
            const int64_t* pt = t.data_ptr<int64_t>();
            T* pd = dlogits.data_ptr<T>();
            detail::parallel_for(0, M, rows_grain(V), [&](int64_t i0, int64_t i1) {
                for (int64_t i = i0; i < i1; ++i)
                    for (int64_t v = 0; v < V; ++v) {
                        A z = A(pl[i * V + v]), dz = A(1);  // z and dz/dlogit: the logit and 1 without a cap
                        if (capped) {
                            const A th = std::tanh(z / c);
                            z = c * th;
                            dz = A(1) - th * th;
                        }
                        pd[i * V + v] = static_cast<T>((std::exp(z - ps[i]) - (v == pt[i] ? A(1) : A(0))) * g * dz);
                    }
            });
        });
        return {dlogits, Tensor()};
    }
};

}  // namespace

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in, double softcap) {
    const char* op = "cross_entropy";
    NT_CHECK(std::isfinite(softcap) && softcap >= 0, op, ": expected softcap >= 0 and finite (0: no cap), got ",
             softcap);
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
                                                          detail::device_ptr<int64_t>(targets), M, V, softcap,
                                                          logits.device().index));
            return;
        }
        const int64_t* pt = targets.data_ptr<int64_t>();
        const T* pl = logits.data_ptr<T>();
        A* ps = lse.data_ptr<A>();
        // The logit the loss sees, in double: the logit itself, or capped.
        auto z = [softcap](T x) { return softcap > 0 ? softcap * std::tanh(double(x) / softcap) : double(x); };
        double total = 0.0;  // the rows' losses, summed by chunks of rows added in chunk order
        detail::parallel_reduce(0, M, rows_grain(V), 1, &total, [&](int64_t i0, int64_t i1, double* acc) {
            for (int64_t i = i0; i < i1; ++i) {
                const T* row = pl + i * V;
                double maxv = z(row[0]);
                for (int64_t v = 1; v < V; ++v) maxv = std::max(maxv, z(row[v]));
                double sum = 0.0;
                for (int64_t v = 0; v < V; ++v) sum += std::exp(z(row[v]) - maxv);
                ps[i] = static_cast<A>(maxv + std::log(sum));
                *acc += maxv + std::log(sum) - z(row[pt[i]]);
            }
        });
        *loss.data_ptr<T>() = static_cast<T>(total / static_cast<double>(M));
    });
    if (should_record(logits))
        record(std::make_shared<CrossEntropyBackward>(logits, lse, targets, softcap), loss, logits, targets);
    detail::check_forward_anomaly(op, "loss", loss, {{"logits", logits}});
    return loss;
}

}  // namespace normtape
