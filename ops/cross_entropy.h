// ops/cross_entropy.h: softmax cross-entropy, fused with log-softmax.
#pragma once

#include "core/tensor.h"

namespace normtape {

// cross_entropy(logits, targets, softcap) = mean over rows i of (logsumexp(z[i, :]) - z[i, targets[i]]),
// z = logits (softcap == 0: as torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1)),
// reduction "mean"), or, for softcap > 0, the logits capped to (-softcap, softcap) by
// z = softcap * tanh(logits / softcap): the logit softcap of Gemma 2 (Gemma Team 2024,
// arXiv:2408.00118, final logits capped at 30) and nanochat (karpathy/nanochat nanochat/gpt.py, 15),
// fused here so that z is never stored.
// logits: [..., V] f32, f64 or bf16 on the cpu or a CUDA device, M = numel / V rows; targets: i64
// on logits' device, with the shape of logits without its last dimension, each in [0, V) (a CUDA
// targets is copied to the host to be checked). Returns a 0-dim tensor (nats).
// Saves logits and lse [M] (log-sum-exp of z per row, f32; f64 for f64 logits), the same with
// or without a cap; backward recomputes z (and tanh) and softmax from them:
// dlogits = (softmax(z) - onehot(targets)) * g / M, times (1 - tanh(logits / softcap)^2) when
// capped, written (=) into a fresh [..., V] tensor,
// or into the saved logits' own storage when nothing else can reach it (the caller dropped the
// logits and no other node saved them; Note [Cross-entropy writes its gradient over its logits],
// ops/cross_entropy.cpp), so that the backward needs no second [M, V] buffer; never under
// retain_graph. softcap == 0 computes exactly what the op without a cap did, bit for bit.
// CUDA: exp by the hardware's exp2 (2 ulp); tanh by tanhf (f32) or tanh (f64).
// Throws, naming cross_entropy: Error on a softcap that is negative, NaN or infinite (the message
// gives the value), on an undefined input or a target out of [0, V) (the
// message gives the value and its position); DTypeError on non-floating logits or targets not
// i64; ShapeError on empty or scalar logits or targets of the wrong shape; DeviceError on targets
// on another device; AnomalyError on a non-finite loss under anomaly detection.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double softcap = 0.0);

}  // namespace normtape
