// core/anomaly_internal.h: the engine's side of anomaly detection (Note [Anomaly detection],
// core/anomaly.h). Internal: not installed, not included by include/normtape.h; used by
// core/autograd.cpp and defined in core/anomaly.cpp. Not here: the public switch and the forward
// check that ops call (core/anomaly.h).
#pragma once

#include <cstddef>
#include <vector>

#include "core/anomaly.h"

namespace normtape::detail {

// The engine's side (core/autograd.cpp). Throws AnomalyError when the gradient that the node
// `node_name` returned for its input `i` holds a NaN or Inf, saying whether the gradients of its
// outputs (`grad_outputs`, undefined where none reached one) already did. Checks whether or not
// anomaly detection is on: the engine calls it only when it is.
void check_backward_anomaly(const char* node_name, size_t i, const Tensor& grad_input,
                            const std::vector<Tensor>& grad_outputs);
// Marks a backward as running for its scope (nested scopes restore the outer state):
// check_forward_anomaly does nothing inside it, since the engine checks the nodes.
class BackwardAnomalyScope {
public:
    BackwardAnomalyScope();
    ~BackwardAnomalyScope();
    BackwardAnomalyScope(const BackwardAnomalyScope&) = delete;
    BackwardAnomalyScope& operator=(const BackwardAnomalyScope&) = delete;

private:
    bool previous_;
};

}  // namespace normtape::detail
