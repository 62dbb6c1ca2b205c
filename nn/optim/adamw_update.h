// nn/optim/adamw_update.h: the AdamW update of one element, shared by the cpu loop (nn/optim/adamw.cpp) and
// the CUDA kernel (nn/optim/adamw.cu) so that the formula exists once; and the interface between the
// host code of nn/optim/adamw.cpp and the multi-tensor CUDA launchers of nn/optim/adamw.cu (the tables and
// kernel arguments of Note [Multi-tensor AdamW and the gradient norm], nn/optim/adamw.cu). Internal.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace normtape::detail {

struct AdamWStep {
    double lr, beta1, beta2, eps, weight_decay;
    double bias_correction1, bias_correction2;  // 1 - beta^t
};

// p: the parameter; master: its f32 copy when p is bf16 (updated, then rounded into p), else
// nullptr; m, v: moments in acc_t<T>. Loshchilov & Hutter 2019; as torch.optim.AdamW.
template <class T>
NT_HOST_DEVICE inline void adamw_update(T* p, acc_t<T>* master, T g_in, acc_t<T>* m, acc_t<T>* v, const AdamWStep& s) {
    using A = acc_t<T>;
    A g = A(g_in);
    A w = master ? *master : A(*p);
    *m = A(s.beta1) * *m + A(1 - s.beta1) * g;
    *v = A(s.beta2) * *v + A(1 - s.beta2) * g * g;
    A update = (*m / A(s.bias_correction1)) / (sqrt(*v / A(s.bias_correction2)) + A(s.eps));
    w = w * A(1 - s.lr * s.weight_decay) - A(s.lr) * update;
    if (master) *master = w;
    *p = static_cast<T>(w);
}

// ---- Multi-tensor CUDA launchers (nn/optim/adamw.cu) ---------------------------------------------------
// Each queues its kernels on the device's stream and returns without synchronizing. T is float,
// double or bf16. A chunk is kMultiTensorChunk elements of one tensor (its last chunk fewer); one
// block takes one chunk.

constexpr int64_t kMultiTensorChunk = 65536;

// The chunks of a tensor of n elements.
inline int64_t chunks_of(int64_t n) { return (n + kMultiTensorChunk - 1) / kMultiTensorChunk; }

// One parameter in the device table of a multi-tensor AdamW step: pointers on one device (the f32
// master copy for bf16 only, else nullptr), its size and its group's weight decay and lr_scale.
template <class T>
struct AdamWTensor {
    T* p;
    acc_t<T>* master;
    acc_t<T>* m;
    acc_t<T>* v;
    int64_t numel;
    double weight_decay;
    double lr_scale;
};

// One block's work: elements [index * kMultiTensorChunk, min((index + 1) * kMultiTensorChunk, numel))
// of table entry `tensor`.
struct AdamWChunk {
    int32_t tensor;
    int32_t index;
};

// The gradients of table entries first_tensor, first_tensor + 1, ... (they change from step to step,
// so they travel as kernel arguments, not in the table; at most 4 KiB of arguments in all).
constexpr int kAdamWGradsPerLaunch = 400;
template <class T>
struct AdamWGrads {
    const T* grad[kAdamWGradsPerLaunch];
    int32_t first_tensor;
};

// Updates the chunks chunks[0 .. num_chunks) of the table `tensors` (both in device memory) by
// adamw_update with `s`, its lr and bias corrections read from `scalars` (device memory, laid out
// as nn/optim/step_scalars.h says), its lr scaled by each entry's lr_scale and its weight_decay
// replaced by the entry's: one kernel launch. Every chunk's tensor must lie in grads' range.
// Where skip_if_nonfinite is not null and the value it points to (on the device) is NaN or
// infinite, nothing is written.
template <class T>
void adamw_multi_tensor_cuda(const AdamWTensor<T>* tensors, const AdamWChunk* chunks, int64_t num_chunks,
                             const AdamWGrads<T>& grads, const AdamWStep& s, const double* scalars,
                             const double* skip_if_nonfinite, int device);

// Up to kGradListTensors gradients of one dtype, as kernel arguments: data[i] holds numel[i]
// contiguous elements; chunk_end[i] is the number of chunks of tensors 0..i (so chunks
// [chunk_end[i - 1], chunk_end[i]) belong to tensor i).
constexpr int kGradListTensors = 192;
struct GradList {
    void* data[kGradListTensors];
    int64_t numel[kGradListTensors];
    int32_t chunk_end[kGradListTensors];
    int32_t count;
};

// partial[c] = the sum of x^2 over chunk c of the list, in double, for c < chunk_end[count - 1].
template <class T>
void grad_sum_squares_cuda(double* partial, const GradList& list, int device);
// One block adds partial[0 .. n) in a fixed order; norm[0] = sqrt(sum) and
// coef[0] = norm > max_norm ? max_norm / (norm + 1e-6) : 1 (both on the device).
void clip_coef_cuda(double* norm, double* coef, const double* partial, int64_t n, double max_norm, int device);
// x = T(acc_t<T>(x) * acc_t<T>(coef[0])) for every element of the list, as Tensor::mul_ rounds;
// nothing is written where coef[0] == 1.
template <class T>
void grad_scale_cuda(const GradList& list, const double* coef, int device);

}  // namespace normtape::detail
