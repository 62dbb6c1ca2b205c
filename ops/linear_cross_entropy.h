// ops/linear_cross_entropy.h: a language model's head and its loss in one op, cross_entropy(linear(x,
// weight), targets), that never holds the [M, V] logits whole.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace normtape {

struct LinearCrossEntropyOptions {
    double softcap = 0.0;          // > 0: z = softcap * tanh(logits / softcap), as cross_entropy's
    double label_smoothing = 0.0;  // in [0, 1]: the target is (1 - s) onehot + s / V, as PyTorch's
    int64_t ignore_index = -100;   // rows whose target is this add nothing and are not counted, as PyTorch's
    int64_t chunk_rows = 0;        // rows of logits made at a time; 0: linear_cross_entropy_chunk_rows
};

// linear_cross_entropy(x, weight, targets, options) = the mean over the counted rows i (targets[i]
// != ignore_index) of
//   (1 - s) (lse_i - z[i, t_i]) + s (lse_i - mean_v z[i, v]),   lse_i = logsumexp_v z[i, v],
// z = x @ weight^T (softcap > 0: softcap * tanh of it), s = label_smoothing: the value of
// cross_entropy(linear(x, weight), targets, softcap) (no smoothing, no ignored row), and of
// torch.nn.functional.cross_entropy(x @ weight.T, targets, ignore_index=..., label_smoothing=...)
// with reduction "mean" (NaN when every row is ignored, as PyTorch's mean over no rows).
// The head's logits are made chunk_rows rows at a time (the product in x's dtype with f32
// accumulation, as linear's), reduced to lse_i and the row's loss, and dropped: the forward's
// transient is one [chunk_rows, V] chunk, never [M, V] (Wijmans et al. 2024, "Cut Your Losses in
// Large-Vocabulary Language Models", arXiv:2411.09009, keep lse only; Liger-Kernel's
// FusedLinearCrossEntropy chunks rows).
// x: [..., C] f32, f64 or bf16 on the cpu or a CUDA device, M = numel / C rows; weight: [V, C],
// x's dtype and device (lm_head.weight); targets: i64 on x's device with x's shape without its
// last dimension, each in [0, V) or ignore_index (a CUDA targets is copied to the host to be
// checked). Returns a 0-dim tensor of x's dtype (nats).
// Saves x, weight and lse [M] (stat_dtype(x.dtype): f32, f64 for f64) and targets [M] i64: the
// bytes cross_entropy(linear(x, weight)) saves less its [M, V] logits (x and weight are what the
// head saves anyway; weight is a parameter's storage).
// Backward makes each chunk's logits again and forms its gradient in f32 (f64 for f64),
//   dz = (softmax(z) - (1 - s) onehot(t) - s / V) * g / n,  n the counted rows, 0 on ignored rows,
// times 1 - tanh^2 under a cap, rounded to x's dtype as the product's input (the bytes the
// unfused backward's dlogits has); then dx[chunk] = dz @ weight (one product per chunk: its rows
// are no other chunk's) and dweight += dz^T @ x[chunk] into an f32 accumulator [V, C] (the
// product's own f32 accumulation, beta = 1), rounded to x's dtype once, after the last chunk:
// every chunk's contribution is added in f32, whatever the dtype, so that many small chunks are
// not lost to bf16 rounding, as in Liger's bf16 accumulation (linkedin/Liger-Kernel issues 512,
// 827). For f32 and f64 the accumulator is dweight itself. The true class's p - 1 is computed in
// f32 before it is rounded, so that p near 1 keeps its gradient (Liger issue 1329). Gradients are
// written (=); the engine adds them into leaves (+=).
// Transients: forward one [chunk_rows, V] chunk of x's dtype and [M] f32 row losses; backward one
// chunk, dx [M, C], dweight [V, C] and, for bf16, the [V, C] f32 accumulator.
// Throws, naming linear_cross_entropy: Error on an undefined input, a softcap or label_smoothing
// out of range (the value in the message), a target out of [0, V) that is not ignore_index (the
// value and its position), chunk_rows < 0; DTypeError on non-floating x, weight of another dtype,
// targets not i64; ShapeError on scalar x, an empty x or weight (no rows, C 0 or V 0: the mean
// over no rows is undefined; PyTorch returns NaN, normtape refuses), weight not [V, C] with x's C,
// targets of the wrong shape; DeviceError on inputs on different devices; AnomalyError on a non-finite loss under
// anomaly detection.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets,
                            const LinearCrossEntropyOptions& options = {});

// The rows of logits linear_cross_entropy makes at a time for M rows, vocabulary V and width C,
// when options.chunk_rows is 0: M cut into ceil(V / C) chunks, so that a chunk's [rows, V] logits
// hold about as many elements as x [M, C] (the head's input, saved anyway), but no fewer than
// 2^22 / C rows, so that each chunk's dx product [rows, C] (of depth V) fills a GPU; at most M.
// The gpt2-medium-ish preset (M 16384, C 1024, V 32768): 4096 rows, a quarter of the logits.
int64_t linear_cross_entropy_chunk_rows(int64_t M, int64_t V, int64_t C);

}  // namespace normtape
