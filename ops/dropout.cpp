// ops/dropout.cpp: dropout: checks, the autograd node that draws the mask again, the CPU kernel.
#include "ops/dropout.h"

#include <cmath>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

namespace normtape {

namespace {

struct DropoutBackward : Node {
    double p;
    PhiloxState state;
    DropoutBackward(double p_, PhiloxState s) : p(p_), state(s) {}
    const char* name() const override { return "DropoutBackward"; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return {detail::dropout_apply(grad_output.contiguous(), p, state)};
    }
};

}  // namespace

Tensor detail::dropout_apply(const Tensor& x, double p, PhiloxState state) {
    Tensor out = empty(x.shape(), TensorOptions().dtype(x.dtype()).device(x.device()));
    dispatch_floating(x.dtype(), "dropout", [&](auto tag) {
        using T = decltype(tag);
        if (x.device().is_cuda()) {
            NT_CUDA(detail::dropout_cuda<T>(device_ptr<T>(out), device_ptr<T>(x), x.numel(), p, state,
                                            x.device().index));
            return;
        }
        using A = acc_t<T>;
        const uint32_t threshold = drop_threshold(p);
        const A keep_scale = A(1) / (A(1) - A(p));
        const T* px = x.data_ptr<T>();
        T* po = out.data_ptr<T>();
        for (int64_t i = 0, end = x.numel(); i < end; ++i)
            po[i] = dropout_keep(philox_word(state, static_cast<uint64_t>(i)), threshold)
                        ? static_cast<T>(A(px[i]) * keep_scale)
                        : T(0);
    });
    return out;
}

Tensor dropout(const Tensor& x_in, double p, bool training) {
    detail::check_floating_input("dropout", "x", x_in);
    NT_CHECK(p >= 0 && p < 1, "dropout: expected a probability p in [0, 1), got ", p);
    if (!training || p == 0) return x_in;
    Tensor x = x_in.contiguous();
    const PhiloxState state = philox_next(static_cast<uint64_t>(x.numel()));
    Tensor out = detail::dropout_apply(x, p, state);
    if (should_record(x)) record(std::make_shared<DropoutBackward>(p, state), out, x);
    detail::check_forward_anomaly("dropout", "out", out, {{"x", x}});
    return out;
}

}  // namespace normtape
