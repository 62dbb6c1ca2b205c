// ops/cuda_launchers.h: the CUDA entry points of every op, in one index. Internal.
//
// Each launcher takes raw device pointers, sizes and the CUDA device index; it picks the grid,
// queues the kernel on that device's stream (core/cuda_context.h), checks the launch, and
// returns without synchronizing. T is float, double or bf16 (arithmetic in acc_t<T>: f32, or
// f64 for double); statistics and log-sum-exps are acc_t<T>. Each is defined, and explicitly
// instantiated for the three types, in the op's .cu file; ops call them only through NT_CUDA
// (core/cuda_dispatch.h). Outputs are overwritten (=). Reductions are deterministic: a fixed
// order, no floating-point atomics.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "core/philox.h"
#include "ops/attention_layout.h"
#include "ops/norm/norm_policy.h"

namespace normtape::detail {

// ops/cuda_common.cu: the reductions shared by ops and nn, accumulated in acc_t<Out>. In/Out:
// column_sum_cuda <T, T> and <acc_t<T>, T>; single_block_sum_cuda <acc_t<T>, T> and <double, double>.
template <class In, class Out>  // out[j] = sum over r < rows of in[r * n + j], j < n (0 where rows == 0)
void column_sum_cuda(Out* out, const In* in, int64_t rows, int64_t n, int device);
template <class In, class Out>  // out[0] = scale * sum of in[0..n), by one block
void single_block_sum_cuda(Out* out, const In* in, int64_t n, double scale, int device);

// ops/elementwise.cu
template <class T>  // out[i] = a[i] + b[i % b_n]   (b broadcast over a's leading dimensions)
void add_forward_cuda(T* out, const T* a, const T* b, int64_t n, int64_t b_n, int device);
template <class T>  // out[i] = a[i] * b[i]
void mul_forward_cuda(T* out, const T* a, const T* b, int64_t n, int device);
template <class T>  // out[i] = a[i] * s
void scale_forward_cuda(T* out, const T* a, double s, int64_t n, int device);
template <class T>  // out[i] = gelu_tanh(x[i])
void gelu_forward_cuda(T* out, const T* x, int64_t n, int device);
template <class T>  // dx[i] = dy[i] * gelu_tanh'(x[i])
void gelu_backward_cuda(T* dx, const T* dy, const T* x, int64_t n, int device);
template <class T>  // out[r, j] += bias[j], out [rows, N]
void add_bias_rows_cuda(T* out, const T* bias, int64_t rows, int64_t N, int device);

// ops/activation.cu (see ops/activation.h)
template <class T>  // out[i] = relu(h[i])^2
void relu_squared_forward_cuda(T* out, const T* h, int64_t n, int device);
template <class T>  // dh[i] = dout[i] * 2 relu(h[i])
void relu_squared_backward_cuda(T* dh, const T* dout, const T* h, int64_t n, int device);
template <class T>  // out[r, j] = silu(h[r, j]) * h[r, H + j]; h [rows, 2H] = [gate | up], out [rows, H]
void swiglu_forward_cuda(T* out, const T* h, int64_t rows, int64_t H, int device);
template <class T>  // dh[r, j] = dout[r, j] * up * silu'(gate), dh[r, H + j] = dout[r, j] * silu(gate); dh [rows, 2H]
void swiglu_backward_cuda(T* dh, const T* dout, const T* h, int64_t rows, int64_t H, int device);

// ops/softmax.cu (see ops/softmax.h): x, y, dy, dx [rows, N]
template <class T>  // y[r, :] = exp(x[r, :] - max) / sum(exp(x[r, :] - max))
void softmax_forward_cuda(T* y, const T* x, int64_t rows, int64_t N, int device);
template <class T>  // dx[r, :] = y[r, :] * (dy[r, :] - sum(dy[r, :] * y[r, :]))
void softmax_backward_cuda(T* dx, const T* dy, const T* y, int64_t rows, int64_t N, int device);

// ops/rotary.cu (see ops/rotary.h)
template <class T>  // out[b, t, h, :] = x[b, t, h, :] with each pair (d, d + hs/2) rotated by the angle of
                    // position position_offset + t (inverse: by minus it); out, x [B, T, H, hs]
void rotary_embedding_cuda(T* out, const T* x, int64_t B, int64_t T_, int64_t H, int64_t hs, int64_t position_offset,
                           double theta, bool inverse, int device);

// ops/dropout.cu
template <class T>  // out[i] = keep(philox_word(state, i)) ? x[i] / (1 - p) : 0 (core/philox.h)
void dropout_cuda(T* out, const T* x, int64_t n, double p, PhiloxState state, int device);

// ops/reduce.cu
template <class T>  // out[0] = factor * sum of x[0..n)
void sum_cuda(T* out, const T* x, int64_t n, double factor, int device);

// ops/embedding.cu
template <class T>  // out[i, :] = weight[ids[i], :], i < n_ids, rows of C
void embedding_forward_cuda(T* out, const int64_t* ids, const T* weight, int64_t n_ids, int64_t C, int device);
template <class T>  // dweight[v, :] = sum over i with ids[i] == v of dout[i, :]; all V rows written
void embedding_backward_cuda(T* dweight, const int64_t* ids, const T* dout, int64_t n_ids, int64_t V, int64_t C,
                             int device);

// ops/cross_entropy.cu. z = logits where softcap == 0 (no tanh computed), or, for softcap > 0,
// z = softcap * tanh(logits / softcap) (the logit softcap, ops/cross_entropy.h), in acc_t<T>.
template <class T>  // lse[i] = logsumexp(z[i, :]); loss[0] = mean over i of lse[i] - z[i, targets[i]]
void cross_entropy_forward_cuda(T* loss, acc_t<T>* lse, const T* logits, const int64_t* targets, int64_t M, int64_t V,
                                double softcap, int device);
template <class T>  // dlogits[i, v] = (exp(z[i, v] - lse[i]) - [v == targets[i]]) * grad[0] / M * dz/dlogits[i, v]
                    // (1 without a cap, 1 - tanh(logits[i, v] / softcap)^2 with one); dlogits may be logits
void cross_entropy_backward_cuda(T* dlogits, const T* logits, const acc_t<T>* lse, const int64_t* targets,
                                 const T* grad, int64_t M, int64_t V, double softcap, int device);

// ops/linear_cross_entropy.cu: rows of one chunk of logits [rows, V] (ops/linear_cross_entropy.h);
// z = logits, or softcap * tanh(logits / softcap) for softcap > 0; s = smoothing.
template <class T>  // lse[i] = logsumexp(z[i, :]), loss[i] = lse[i] - (1 - s) z[i, t] - s / V sum_v z[i, v]; 0, 0 where ignored
void linear_cross_entropy_rows_cuda(acc_t<T>* lse, acc_t<T>* loss, const T* logits, const int64_t* targets,
                                    int64_t rows, int64_t V, double softcap, double smoothing, int64_t ignore_index,
                                    int device);
template <class T>  // logits[i, v] = (exp(z - lse[i]) - (1 - s)[v == t] - s / V) * grad[0] * scale * dz/dlogits; 0 where ignored
void linear_cross_entropy_grad_cuda(T* logits, const acc_t<T>* lse, const int64_t* targets, const T* grad,
                                    double scale, int64_t rows, int64_t V, double softcap, double smoothing,
                                    int64_t ignore_index, int device);

// ops/attention.cu: q, k, v, out and lse (or D) where `layout` puts them (ops/attention_layout.h;
// see ops/attention.h). The forward computes the rows first_row .. T-1 (lse may be null; dropout
// only with first_row 0); the backward (first_row 0) writes dq, dk, dv in q's, k's and v's layout
// and reads out only through D = rowsum(dout * out), which it allocates. `drop`: dropout on the
// probabilities, element (b * NH + h) * T * T + t * T + s of its mask (inactive: none).
template <class T>
void attention_forward_cuda(T* out, acc_t<T>* lse, const T* q, const T* k, const T* v, const AttentionLayout& layout,
                            const DropoutMask& drop, int device);
template <class T>
void attention_backward_cuda(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                             const acc_t<T>* lse, const AttentionLayout& layout, const DropoutMask& drop, int device);

// ops/matmul.cu: out = op(a) @ op(b) over row-major matrices, cuBLAS with f32 accumulation
// (f64 for double; f32 products without TF32). a: [a_rows, a_cols], b: [b_rows, b_cols].
template <class T>
void gemm_cuda(T* out, const T* a, int64_t a_rows, int64_t a_cols, bool trans_a, const T* b, int64_t b_rows,
               int64_t b_cols, bool trans_b, int device);
// out += op(a) @ op(b) with out of acc_t<T> (f32 for bf16): the product's own f32 (f64)
// accumulation carried on into out (cuBLAS's beta = 1), never rounded to T in between.
template <class T>
void gemm_accumulate_cuda(acc_t<T>* out, const T* a, int64_t a_rows, int64_t a_cols, bool trans_a, const T* b,
                          int64_t b_rows, int64_t b_cols, bool trans_b, int device);
// The same product with a cuBLASLt epilogue, in the row-major picture p = op(a) @ op(b), [M, N]:
enum class GemmEpilogue {
    Bias,         // out[i, j] = p[i, j] + bias[j]
    GeluAuxBias,  // aux[i, j] = p[i, j] + bias[j], rounded to T; out[i, j] = gelu_tanh(aux[i, j])
};
// Returns false, having queued nothing, where cuBLASLt offers no algorithm (always for double;
// GeluAuxBias needs N % 8 == 0); the caller then runs gemm_cuda and its own kernels.
template <class T>
bool gemm_epilogue_cuda(T* out, const T* a, int64_t a_rows, int64_t a_cols, bool trans_a, const T* b, int64_t b_rows,
                        int64_t b_cols, bool trans_b, GemmEpilogue epilogue, T* bias, T* aux, int device);
// D = alpha op(A) op(B) + beta C for `count` matrices in cuBLAS's column-major picture (D [m, n] in
// C's layout; d may be c or apart from it), each operand `stride` elements after the previous
// one, through cuBLASLt (nn/optim/muon.cu's Newton-Schulz products), accumulating in f32 (f64 for
// double). The problem's descriptors and algorithm are made on its first call and kept (asking
// costs more host time than a product takes). Throws Error where cuBLASLt has no algorithm.
template <class T>
void gemm_strided_batched_cuda(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, double alpha, const T* a,
                               int64_t lda, int64_t stride_a, const T* b, int64_t ldb, int64_t stride_b, double beta,
                               const T* c, T* d, int64_t ldc, int64_t stride_c, int64_t count, int device);

// ops/norm/norm_forward.cu, ops/norm/norm_backward.cu, ops/norm/norm_reference.cu: the norms (see
// ops/norm/norm_policy.h); mean is nullptr when not centered, weight/bias nullptr when absent;
// dx/dweight/dbias nullptr when not wanted. norm_*_cuda run the fast kernels where they apply;
// norm_*_reference_cuda always run the plain ones (tests compare).
// x_hat (SavePolicy::Normalized; nullptr otherwise): the forward writes x_hat too and computes y
// from the rounded x_hat as norm_affine_cuda does, so that the two agree bit for bit.
// residual (the fused norm; nullptr otherwise): the forward normalizes sum = x + residual, which it
// writes to `sum` ([M, N]) as add_forward_cuda would; dresidual (nullptr otherwise): the backward's
// dx is the norm's dx plus dresidual, as add_forward_cuda would add them.
template <class T>
void norm_forward_cuda(T* y, T* x_hat, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* residual, T* sum,
                       const T* weight, const T* bias, int64_t M, int64_t N, double eps, int device);
template <class T>  // y[i, j] = fma(x_hat[i, j], weight[j], bias[j]) (either may be nullptr), rows of N
void norm_affine_cuda(T* y, const T* x_hat, const T* weight, const T* bias, int64_t M, int64_t N, int device);
template <class T>
void norm_backward_cuda(T* dx, T* dweight, T* dbias, const T* dy, const T* dresidual, const T* saved,
                        const acc_t<T>* mean, const acc_t<T>* rstd, const T* weight, const T* bias, bool centered,
                        SavePolicy policy, int64_t M, int64_t N, int device);
template <class T>  // out[i, j] = x[i, j] * scale[i], rows of N (the fused norm's rowscale and its gradient)
void scale_rows_cuda(T* out, const T* x, const T* scale, int64_t M, int64_t N, int device);
template <class T>
void norm_forward_reference_cuda(T* y, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* weight, const T* bias,
                                 int64_t M, int64_t N, double eps, int device);
template <class T>
void norm_backward_reference_cuda(T* dx, T* dweight, T* dbias, const T* dy, const T* saved, const acc_t<T>* mean,
                                  const acc_t<T>* rstd, const T* weight, const T* bias, bool centered,
                                  SavePolicy policy, int64_t M, int64_t N, int device);

}  // namespace normtape::detail
