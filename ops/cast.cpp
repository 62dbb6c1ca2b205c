// ops/cast.cpp: cast: checks and the autograd node. The conversion itself is Tensor::to's (its cpu
// loop and CUDA kernel, core/tensor.cpp).
#include "ops/cast.h"

#include "core/anomaly.h"
#include "core/autograd.h"
#include "ops/checks.h"

namespace normtape {

namespace {

// dx = dy converted back to x's dtype.
struct CastBackward : Node {
    DType input_dtype;
    explicit CastBackward(DType dtype) : input_dtype(dtype) {}
    const char* name() const override { return "CastBackward"; }
    std::vector<Tensor> apply(const Tensor& grad_output) override { return {grad_output.to(input_dtype)}; }
};

}  // namespace

Tensor cast(const Tensor& x, DType dtype) {
    detail::check_floating_input("cast", "x", x);
    NT_CHECK_AS(DTypeError, is_floating(dtype), "cast: expected a floating dtype (f32, f64 or bf16) to cast to, got ",
                dtype_name(dtype), " (Tensor::to converts to i64, without a gradient)");
    if (x.device().is_cuda() && dtype == DType::BF16)
        detail::check_dtype_on_gpu("cast", "its output", dtype, x.device(), cuda_compute_capability(x.device()));
    if (x.dtype() == dtype) return x;
    Tensor out = x.to(dtype);
    if (should_record(x)) record(std::make_shared<CastBackward>(x.dtype()), out, x);
    detail::check_forward_anomaly("cast", "out", out, {{"x", x}});  // a narrowing overflow is Inf
    return out;
}

}  // namespace normtape
