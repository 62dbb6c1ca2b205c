// tests/optim_test_util.h: what the optimizer tests (tests/test_adamw.cpp, tests/test_nn.cpp,
// tests/test_muon.cpp, tests/test_muon_api.cpp) share: setting a gradient, a tensor's values on the
// host, comparing two tensors bit for bit, a step's update, and the normwise tolerances of
// newton_schulz (named per dtype, as tests/test_util.h names the others).
#pragma once

#include <cmath>
#include <vector>

#include "test_util.h"

namespace normtape::testing {

// Sets p's gradient to g (same shape, dtype and device): backward of sum(p * g), exact in every dtype.
inline void set_grad(Tensor p, const Tensor& g) {
    p.zero_grad();
    sum(mul(p, g)).backward();
}

// The values of t on the host, converted exactly to f64.
inline std::vector<double> host_values(const Tensor& t) { return t.to(Device::CPU).to(DType::F64).to_vector<double>(); }

// Whether a and b hold the same values bit for bit (NaNs equal to NaNs), whatever their device.
inline bool same_bits(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
    std::vector<double> va = host_values(a), vb = host_values(b);
    for (size_t i = 0; i < va.size(); ++i)
        if (!(va[i] == vb[i] || (std::isnan(va[i]) && std::isnan(vb[i]))) || std::signbit(va[i]) != std::signbit(vb[i]))
            return false;
    return true;
}

// a - b elementwise in f64 on the cpu: a step's update, compared normwise (the parameter itself
// would hide the update's error behind its much larger values).
inline Tensor difference(const Tensor& a, const Tensor& b) {
    std::vector<double> va = host_values(a), vb = host_values(b);
    for (size_t i = 0; i < va.size(); ++i) va[i] -= vb[i];
    return from_vector(va, a.shape());
}
inline Tensor difference(const std::vector<double>& a, const std::vector<double>& b, const Shape& shape) {
    std::vector<double> d(a.size());
    for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
    return from_vector(d, shape);
}

// Normwise tolerances of newton_schulz against newton_schulz_reference (tests/test_muon.cpp;
// measured worst in the comments of the test cases): the cpu computes in f32 (f64 for f64) through
// Eigen; CUDA in bf16 products with f32 accumulation, every iterate rounded to bf16 (f64 for f64).
// Five bf16 iterations, which amplify the small singular directions, leave a few percent: on an H200,
// newton_schulz 2.2e-2 and a Muon update 2.7e-2 at worst (the small matrices, [8, 12] and [4, 6]);
// a simulation of nn/optim/muon.cu's roundings in PyTorch over 20 seeds per shape gave up to 3.5e-2
// ([24, 6]), and KellerJordan/Muon's own bf16 iteration up to 7e-2 ([4, 6]).
constexpr double kNewtonSchulzF32 = 1e-5;
constexpr double kNewtonSchulzF64 = 1e-12;
constexpr double kNewtonSchulzBF16 = 4e-2;
// Two bf16 orthogonalizations that round at different points (ours on CUDA against PyTorch's in
// bf16): measured worst 3.5e-2 on an H200.
constexpr double kTwoNewtonSchulzBF16 = 6e-2;

}  // namespace normtape::testing
