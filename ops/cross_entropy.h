// ops/cross_entropy.h: softmax cross-entropy, fused with log-softmax.
#pragma once

#include "core/tensor.h"

namespace normtape {

// cross_entropy(logits, targets) = mean over rows i of (logsumexp(logits[i, :]) - logits[i, targets[i]]),
// as torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1)) (reduction "mean").
// logits: [..., V] f32, f64 or bf16 on the cpu or a CUDA device, M = numel / V rows; targets: i64
// on logits' device, with the shape of logits without its last dimension, each in [0, V) (a CUDA
// targets is copied to the host to be checked). Returns a 0-dim tensor (nats).
// Saves logits and lse [M] (log-sum-exp per row, f32; f64 for f64 logits); backward recomputes softmax from them:
// dlogits = (softmax(logits) - onehot(targets)) * g / M, written (=) into a fresh [..., V] tensor,
// or into the saved logits' own storage when nothing else can reach it (the caller dropped the
// logits and no other node saved them; Note [Cross-entropy writes its gradient over its logits],
// ops/cross_entropy.cpp), so that the backward needs no second [M, V] buffer; never under
// retain_graph. CUDA: exp by the hardware's exp2 (2 ulp).
// Throws, naming cross_entropy: Error on an undefined input or a target out of [0, V) (the
// message gives the value and its position); DTypeError on non-floating logits or targets not
// i64; ShapeError on empty or scalar logits or targets of the wrong shape; DeviceError on targets
// on another device; AnomalyError on a non-finite loss under anomaly detection.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);

}  // namespace normtape
