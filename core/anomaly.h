// core/anomaly.h: anomaly detection, a check for NaN and Inf in every op's outputs and in every
// gradient a backward node returns (as torch.autograd.set_detect_anomaly); off by default. Not
// here: the engine, which calls the backward check (core/autograd.cpp, through the internal
// core/anomaly_internal.h).
//
// Note [Anomaly detection]
// set_detect_anomaly(true) (or a DetectAnomalyGuard) turns on, for the whole process, a check
// for NaN and Inf: every op of ops/ checks its outputs before returning
// (detail::check_forward_anomaly; Tensor's own methods, such as to(DType), are not checked), and
// the engine checks every gradient a node returns. The first non-finite value throws
// AnomalyError naming the op ("layer_norm") or node ("LayerNormBackward"), which output or
// input gradient, how many values are non-finite and the flat index of the first; it also says
// whether the op's inputs (a node's grad_output) were already non-finite, i.e. whether the op
// made the value or passed it on. The engine knows no op: ops call the forward check themselves.
// Inside backward the forward checks are skipped (a node's own ops, e.g. MulBackward calling
// mul, are reported as the node). Cost: one pass over every output and gradient; a CUDA tensor
// is copied to the host for it, which synchronizes the device each time, so turn it on to find
// a bad value, not to train.
#pragma once

#include <initializer_list>
#include <utility>

#include "core/tensor.h"

namespace normtape {

// Anomaly detection, Note [Anomaly detection]; as torch.autograd.set_detect_anomaly. Off by
// default; process-wide (the library is single-threaded).
void set_detect_anomaly(bool enabled);
bool is_anomaly_enabled();
// Turns anomaly detection on (or to `enabled`) for its scope and restores the previous state.
class DetectAnomalyGuard {
public:
    explicit DetectAnomalyGuard(bool enabled = true);
    ~DetectAnomalyGuard();
    DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
    DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

private:
    bool previous_;
};

namespace detail {
// A tensor an op was given, named as in the op's signature ("x", "weight"), for anomaly messages.
using NamedInput = std::pair<const char*, Tensor>;
// Every op of ops/ calls this on each output before returning. Does nothing unless anomaly detection is
// on and no backward is running; then throws AnomalyError when `output` (named `output_name`)
// holds a NaN or Inf, saying which of `inputs` were already non-finite (Note [Anomaly detection]).
// Undefined inputs are skipped; i64 tensors are never non-finite.
void check_forward_anomaly(const char* op, const char* output_name, const Tensor& output,
                           std::initializer_list<NamedInput> inputs = {});
}  // namespace detail

}  // namespace normtape
