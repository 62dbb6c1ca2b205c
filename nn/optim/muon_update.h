// nn/optim/muon_update.h: Muon's elementwise formulas, shared by the cpu loops (nn/optim/muon.cpp) and the
// CUDA kernels (nn/optim/muon.cu) so that each exists once, and the interface of nn/optim/muon.cu's launchers
// (Note [Muon on CUDA] there). Internal.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace normtape::detail {

// The quintic Newton-Schulz coefficients of KellerJordan/Muon (zeropower_via_newtonschulz5), and
// the epsilon added to the Frobenius norm before dividing by it.
constexpr double kNewtonSchulzA = 3.4445, kNewtonSchulzB = -4.7750, kNewtonSchulzC = 2.0315;
constexpr double kNewtonSchulzEps = 1e-7;

// The momentum step of one element in acc_t: buf = momentum buf + (1 - momentum) g; returns the
// update to orthogonalize, Nesterov's (1 - momentum) g + momentum buf or the buffer itself.
template <class A>
NT_HOST_DEVICE inline A muon_momentum(A g, A* buf, A momentum, bool nesterov) {
    *buf = momentum * *buf + (A(1) - momentum) * g;
    return nesterov ? (A(1) - momentum) * g + momentum * *buf : *buf;
}

// p = p decay - step o (decay = 1 - lr wd, step = lr max(1, rows / cols)^0.5), through the f32
// master copy of a bf16 parameter (else master is nullptr).
template <class T>
NT_HOST_DEVICE inline void muon_apply(T* p, acc_t<T>* master, acc_t<T> o, acc_t<T> decay, acc_t<T> step) {
    using A = acc_t<T>;
    A w = master ? *master : A(*p);
    w = w * decay - step * o;
    if (master) *master = w;
    *p = static_cast<T>(w);
}

// ---- CUDA launchers (nn/optim/muon.cu) ------------------------------------------------------------------
// Each queues its work on the device's stream and returns without synchronizing. T is the
// parameters' dtype (float, double, bf16); the orthogonalization runs in ns_t<T>.

template <class T>
using ns_t = std::conditional_t<std::is_same_v<T, double>, double, bf16>;

// Elements per block of the elementwise kernels; the sums of squares are kept per chunk.
constexpr int64_t kMuonChunk = 4096;
inline int64_t muon_chunks(int64_t numel) { return (numel + kMuonChunk - 1) / kMuonChunk; }

// Up to kMuonMatricesPerLaunch matrices of one class (one shape, one dtype, one group), as kernel
// arguments: parameter, f32 master copy (bf16 only, else nullptr), gradient, momentum buffer
// (nullptr: the gradient itself is the update, as newton_schulz alone takes it).
constexpr int kMuonMatricesPerLaunch = 64;
// The most matrices of one class (a grid's y dimension); a larger class is cut into several.
constexpr int64_t kMuonMaxClass = 65535;
template <class T>
struct MuonMatrices {
    T* p[kMuonMatricesPerLaunch];
    acc_t<T>* master[kMuonMatricesPerLaunch];
    const T* grad[kMuonMatricesPerLaunch];
    acc_t<T>* buf[kMuonMatricesPerLaunch];
    int32_t count;
};
static_assert(sizeof(MuonMatrices<double>) + 128 <= 4096, "kernel arguments must stay within 4 KiB");

// For each matrix i < m.count of numel elements: muon_momentum of each element, the update u
// rounded into x[i numel ..] (consecutive matrices), and sum[i muon_chunks(numel) + c] = the sum
// of the rounded values' squares over chunk c (in acc_t<ns_t<T>>). Where skip_if_nonfinite is not
// null and the value it points to is NaN or infinite, no buffer changes and x and sum are zeros.
template <class T>
void muon_momentum_cuda(const MuonMatrices<T>& m, int64_t numel, double momentum, bool nesterov, ns_t<T>* x,
                        acc_t<ns_t<T>>* sum, const double* skip_if_nonfinite, int device);

// x[i] /= (sqrt(s_i) + kNewtonSchulzEps) for each of `count` matrices of numel elements, s_i the
// sum of sum[i muon_chunks(numel) ..] (one block per matrix adds them in a fixed order, into the
// first of them).
template <class X>
void muon_normalize_cuda(X* x, int64_t count, int64_t numel, acc_t<X>* sum, int device);

// `steps` Newton-Schulz iterations of the `count` normalized matrices [rows, cols] in x (Note
// [Muon on CUDA]): y the same size, a and b [count, m, m] (m = min(rows, cols)) scratch. Returns
// x or y, whichever holds the result. The caller keeps count <= kMuonMaxClass and rows, cols
// within an int (cuBLAS's).
template <class X>
X* newton_schulz_cuda(X* x, X* y, X* a, X* b, int64_t count, int64_t rows, int64_t cols, int64_t steps,
                      int device);

// muon_apply of each element of matrix i < m.count with o = x[i numel ..], with lr = scalars[0]
// lr_scale (scalars: device memory, nn/optim/step_scalars.h), decay = 1 - lr weight_decay and
// step = lr aspect, each rounded once in f64 as the host computes them. Nothing is written where
// skip_if_nonfinite is not null and points to a NaN or an infinity.
template <class T>
void muon_apply_cuda(const MuonMatrices<T>& m, int64_t numel, const ns_t<T>* x, const double* scalars,
                     double lr_scale, double weight_decay, double aspect, const double* skip_if_nonfinite, int device);

}  // namespace normtape::detail
