// ops/reduce.cpp: sum and mean: one kernel, one node, a factor apart. On the cpu the sum is made
// in double by chunks added in chunk order (detail::parallel_reduce, core/parallel.h); the CUDA
// kernel is in ops/reduce.cu.
#include "ops/reduce.h"

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

namespace normtape {

namespace {

// dx = g * factor, broadcast to the input's shape.
struct SumBackward : Node {
    Shape input_shape;
    double factor;
    const char* node_name;
    SumBackward(Shape s, double f, const char* n) : input_shape(std::move(s)), factor(f), node_name(n) {}
    const char* name() const override { return node_name; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        double g = 0.0;
        dispatch_floating(grad_output.dtype(), name(), [&](auto tag) {
            using T = decltype(tag);
            g = static_cast<double>(grad_output.item<T>());
        });
        return {full(input_shape, g * factor, TensorOptions().dtype(grad_output.dtype()).device(grad_output.device()))};
    }
};

Tensor reduce(const char* op, const char* node_name, const Tensor& x_in, bool divide) {
    detail::check_floating_input(op, "x", x_in);
    Tensor x = x_in.contiguous();
    double factor = divide ? 1.0 / static_cast<double>(x.numel()) : 1.0;
    Tensor out = empty({}, TensorOptions().dtype(x.dtype()).device(x.device()));
    dispatch_floating(x.dtype(), op, [&](auto tag) {
        using T = decltype(tag);
        if (x.device().is_cuda()) {
            NT_CUDA(detail::sum_cuda<T>(detail::device_ptr<T>(out), detail::device_ptr<T>(x), x.numel(), factor,
                                        x.device().index));
            return;
        }
        const T* p = x.data_ptr<T>();
        double s = 0.0;
        detail::parallel_reduce(0, x.numel(), detail::kGrain, 1, &s, [&](int64_t i0, int64_t i1, double* acc) {
            double chunk = 0.0;
            for (int64_t i = i0; i < i1; ++i) chunk += p[i];
            *acc = chunk;
        });
        *out.data_ptr<T>() = static_cast<T>(s * factor);
    });
    if (should_record(x)) record(std::make_shared<SumBackward>(x.shape(), factor, node_name), out, x);
    detail::check_forward_anomaly(op, "out", out, {{"x", x}});
    return out;
}

}  // namespace

Tensor sum(const Tensor& x) { return reduce("sum", "SumBackward", x, false); }
Tensor mean(const Tensor& x) { return reduce("mean", "MeanBackward", x, true); }

}  // namespace normtape
