// ops/rotary.cpp: rotary_embedding: checks, dispatch, the CPU kernel (a table of cos and sin per
// position, then rows of heads on parallel threads, core/parallel.h) and the node, which saves
// nothing. The CUDA kernel is in ops/rotary.cu. This file is compiled with -ffp-contract=off
// (CMakeLists.txt): the rotation's products and sum are rounded one by one, as transformers'
// separate tensor ops round them, never fused into a multiply-add.
#include "ops/rotary.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "core/cuda_dispatch.h"
#include "core/device_ptr.h"
#include "core/dispatch.h"
#include "core/parallel.h"
#include "ops/checks.h"
#include "ops/cuda_launchers.h"

namespace normtape {

namespace {

using detail::device_ptr;
using detail::kGrain;
using detail::parallel_for;

// cos and sin of position p's angle for the pair (d, d + hs/2), as ops/rotary.h defines them
// (and rotary_cos_sin in ops/rotary.cu computes them on the GPU). f32 and bf16: transformers'
// f32 arithmetic, the power rounded once from double.
void rotary_cos_sin(int64_t p, int64_t d, int64_t hs, double theta, float& c, float& s) {
    const float exponent = static_cast<float>(2 * d) / static_cast<float>(hs);
    const float r = static_cast<float>(std::pow(static_cast<double>(static_cast<float>(theta)), double(exponent)));
    const float angle = static_cast<float>(p) * (1.0f / r);
    c = std::cos(angle);
    s = std::sin(angle);
}
void rotary_cos_sin(int64_t p, int64_t d, int64_t hs, double theta, double& c, double& s) {
    const double angle = static_cast<double>(p) * (1.0 / std::pow(theta, static_cast<double>(2 * d) / double(hs)));
    c = std::cos(angle);
    s = std::sin(angle);
}

// out = x rotated by the angles of positions position_offset .. position_offset + Tn - 1, or by
// minus those angles where `inverse` (the backward). out, x: [B, Tn, H, hs] contiguous. The twin
// of rotary_embedding_cuda (ops/cuda_launchers.h), same arguments.
template <class T>
void rotary_embedding_cpu(T* out, const T* x, int64_t B, int64_t Tn, int64_t H, int64_t hs, int64_t position_offset,
                          double theta, bool inverse) {
    using A = acc_t<T>;
    const int64_t half = hs / 2;
    // cos and sin [Tn, half], once per position; sin negated for the inverse rotation
    // (x1 c - x2 (-s) has the bits of x1 c + x2 s).
    std::vector<A> cos_t(Tn * half), sin_t(Tn * half);
    parallel_for(0, Tn, std::max<int64_t>(1, kGrain / 16 / half), [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t)
            for (int64_t d = 0; d < half; ++d) {
                A c, s;
                rotary_cos_sin(position_offset + t, d, hs, theta, c, s);
                cos_t[t * half + d] = c;
                sin_t[t * half + d] = inverse ? -s : s;
            }
    });
    // One head's row of hs at a time: row r = (b * Tn + t) * H + h.
    parallel_for(0, B * Tn * H, std::max<int64_t>(1, kGrain / hs), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
            const A* c = cos_t.data() + (r / H) % Tn * half;
            const A* s = sin_t.data() + (r / H) % Tn * half;
            const T* xr = x + r * hs;
            T* o = out + r * hs;
            for (int64_t d = 0; d < half; ++d) {
                const A x1 = xr[d], x2 = xr[d + half];
                o[d] = static_cast<T>(x1 * c[d] - x2 * s[d]);
                o[d + half] = static_cast<T>(x2 * c[d] + x1 * s[d]);
            }
        }
    });
}

// rotary_embedding's kernel on x's device, forward or (inverse) backward. x: [B, T, H, hs]
// contiguous. Checks nothing, records nothing; returns a new contiguous tensor.
Tensor rotary_apply(const Tensor& x, int64_t position_offset, double theta, bool inverse) {
    const int64_t B = x.size(0), Tn = x.size(1), H = x.size(2), hs = x.size(3);
    Tensor out = empty(x.shape(), TensorOptions().dtype(x.dtype()).device(x.device()));
    dispatch_floating(x.dtype(), "rotary_embedding", [&](auto tag) {
        using T = decltype(tag);
        if (x.device().is_cuda()) {
            NT_CUDA(detail::rotary_embedding_cuda<T>(device_ptr<T>(out), device_ptr<T>(x), B, Tn, H, hs,
                                                     position_offset, theta, inverse, x.device().index));
            return;
        }
        rotary_embedding_cpu<T>(device_ptr<T>(out), device_ptr<T>(x), B, Tn, H, hs, position_offset, theta, inverse);
    });
    return out;
}

// dx = g rotated back: the inverse rotation, from position_offset and theta alone.
struct RotaryEmbeddingBackward : Node {
    int64_t position_offset;
    double theta;
    RotaryEmbeddingBackward(int64_t offset, double theta_) : position_offset(offset), theta(theta_) {}
    const char* name() const override { return "RotaryEmbeddingBackward"; }
    std::vector<Tensor> apply(const Tensor& grad_output) override {
        return {rotary_apply(grad_output.contiguous(), position_offset, theta, /*inverse=*/true)};
    }
};

}  // namespace

Tensor rotary_embedding(const Tensor& x_in, int64_t position_offset, double theta) {
    detail::check_floating_input("rotary_embedding", "x", x_in);
    NT_CHECK_AS(ShapeError, x_in.dim() == 4, "rotary_embedding: expected x of shape [B, T, H, hs], got ",
                shape_str(x_in.shape()));
    NT_CHECK_AS(ShapeError, x_in.size(3) % 2 == 0,
                "rotary_embedding: expected an even head size hs (the last dim of x ", shape_str(x_in.shape()),
                "), got ", x_in.size(3));
    NT_CHECK(position_offset >= 0 && position_offset <= std::numeric_limits<int64_t>::max() - x_in.size(1),
             "rotary_embedding: expected position_offset >= 0 (with position_offset + T in int64), got ",
             position_offset);
    NT_CHECK(std::isfinite(theta) && theta > 0, "rotary_embedding: expected a finite theta > 0, got ", theta);
    Tensor x = x_in.contiguous();
    Tensor out = rotary_apply(x, position_offset, theta, /*inverse=*/false);
    if (should_record(x)) record(std::make_shared<RotaryEmbeddingBackward>(position_offset, theta), out, x);
    detail::check_forward_anomaly("rotary_embedding", "out", out, {{"x", x}});
    return out;
}

}  // namespace normtape
