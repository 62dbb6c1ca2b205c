// core/anomaly.cpp: anomaly detection (Note [Anomaly detection], core/anomaly.h): its switch, the
// scan for NaN and Inf, and the forward and backward checks with their messages. Not here: the
// engine that runs the backward check on every node's gradients (core/autograd.cpp).
#include "core/anomaly_internal.h"

#include <cmath>
#include <sstream>
#include <string>

#include "core/dispatch.h"
#include "core/dry_run.h"

namespace normtape {

namespace {

bool anomaly_mode = false;  // Note [Anomaly detection]
bool backward_running = false;  // a backward is running: forward checks are left to the engine

// The NaN and Inf values of a tensor: how many, and the first in row-major order.
struct NonFinite {
    int64_t count = 0;
    int64_t first_index = -1;
    double first_value = 0.0;
};

NonFinite find_non_finite(const Tensor& t) {
    NonFinite r;
    if (!t.defined() || !is_floating(t.dtype()) || t.numel() == 0) return r;
    Tensor host = t.device().is_cuda() ? t.to(Device::CPU) : t.detach().contiguous();  // CUDA: waits for the device
    if (is_dry_run()) return r;  // Note [The dry run]: the copy made, no values to look at
    dispatch_floating(host.dtype(), "detect_anomaly", [&](auto tag) {
        using T = decltype(tag);
        const T* p = host.data_ptr<T>();
        for (int64_t i = 0, end = host.numel(); i < end; ++i) {
            double v = static_cast<double>(static_cast<acc_t<T>>(p[i]));
            if (std::isfinite(v)) continue;
            if (r.count++ == 0) {
                r.first_index = i;
                r.first_value = v;
            }
        }
    });
    return r;
}

// "expected finite values in <what> [2, 4] f32, found 3 non-finite (NaN or Inf), the first at flat index 1 (nan)"
std::string describe_non_finite(const std::string& what, const Tensor& t, const NonFinite& nf) {
    std::ostringstream ss;
    ss << "expected finite values in " << what << " " << shape_str(t.shape()) << " " << dtype_name(t.dtype())
       << " on " << device_name(t.device()) << ", found " << nf.count << " non-finite (NaN or Inf), the first at flat index "
       << nf.first_index << " (" << (std::isnan(nf.first_value) ? "nan" : nf.first_value > 0 ? "inf" : "-inf") << ")";
    return ss.str();
}

}  // namespace

void set_detect_anomaly(bool enabled) { anomaly_mode = enabled; }
bool is_anomaly_enabled() { return anomaly_mode; }
DetectAnomalyGuard::DetectAnomalyGuard(bool enabled) : previous_(anomaly_mode) { anomaly_mode = enabled; }
DetectAnomalyGuard::~DetectAnomalyGuard() { anomaly_mode = previous_; }

detail::BackwardAnomalyScope::BackwardAnomalyScope() : previous_(backward_running) { backward_running = true; }
detail::BackwardAnomalyScope::~BackwardAnomalyScope() { backward_running = previous_; }

void detail::check_forward_anomaly(const char* op, const char* output_name, const Tensor& output,
                                   std::initializer_list<NamedInput> inputs) {
    if (!anomaly_mode || backward_running) return;
    NonFinite nf = find_non_finite(output);
    if (nf.count == 0) return;
    std::string upstream;
    for (const NamedInput& in : inputs) {
        NonFinite n = find_non_finite(in.second);
        if (n.count == 0) continue;
        upstream += std::string(upstream.empty() ? "" : ", ") + in.first + " (" + std::to_string(n.count) +
                    ", the first at flat index " + std::to_string(n.first_index) + ")";
    }
    detail::throw_error<AnomalyError>(op, ": anomaly in forward: ",
                                      describe_non_finite(std::string("its output ") + output_name, output, nf),
                                      upstream.empty() ? std::string("; its inputs were finite, so ") + op + " produced them"
                                                       : "; non-finite values were already in its input " + upstream);
}

void detail::check_backward_anomaly(const char* node_name, size_t i, const Tensor& grad_input,
                                    const std::vector<Tensor>& grad_outputs) {
    NonFinite nf = find_non_finite(grad_input);
    if (nf.count == 0) return;
    NonFinite upstream;
    for (const Tensor& g : grad_outputs) upstream.count += find_non_finite(g).count;
    detail::throw_error<AnomalyError>(
        node_name, ": anomaly in backward: ",
        describe_non_finite("the gradient for input " + std::to_string(i), grad_input, nf),
        upstream.count == 0 ? std::string("; grad_output was finite, so ") + node_name + " produced them"
                            : "; grad_output already held " + std::to_string(upstream.count) +
                                  " non-finite values, so they came from a later op");
}

}  // namespace normtape
