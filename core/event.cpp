// core/event.cpp: Event (core/device.h). The cpu side is here; the CUDA side calls the detail
// functions of core/cuda_context.cpp (core/cuda_stub.cpp in a build without CUDA).
#include <chrono>
#include <utility>

#include "core/check.h"
#include "core/cuda_event.h"
#include "core/device.h"

namespace normtape {

Event::Event(Device device) : device_(device) {
    if (device_.is_cuda()) cuda_event_ = detail::cuda_event_create(device_.index);
}

Event::~Event() {
    if (cuda_event_) detail::cuda_event_destroy(cuda_event_);
}

Event::Event(Event&& other) noexcept
    : device_(other.device_), cuda_event_(std::exchange(other.cuda_event_, nullptr)), host_ns_(other.host_ns_),
      recorded_(other.recorded_) {}

Event& Event::operator=(Event&& other) noexcept {
    if (this != &other) {
        if (cuda_event_) detail::cuda_event_destroy(cuda_event_);
        device_ = other.device_;
        cuda_event_ = std::exchange(other.cuda_event_, nullptr);
        host_ns_ = other.host_ns_;
        recorded_ = other.recorded_;
    }
    return *this;
}

void Event::record() {
    if (device_.is_cuda()) {
        detail::cuda_event_record(cuda_event_, device_.index);
    } else {
        host_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch())
                       .count();
    }
    recorded_ = true;
}

double Event::elapsed_ms(const Event& start, const Event& end) {
    NT_CHECK(start.recorded_ && end.recorded_, "Event::elapsed_ms: expected two recorded events, got ",
             start.recorded_ ? "an end" : "a start", " that was never recorded");
    NT_CHECK(start.device_ == end.device_, "Event::elapsed_ms: expected events of one device, got ",
             device_name(start.device_), " and ", device_name(end.device_));
    if (start.device_.is_cuda()) return detail::cuda_event_elapsed_ms(start.cuda_event_, end.cuda_event_);
    return static_cast<double>(end.host_ns_ - start.host_ns_) / 1e6;
}

}  // namespace normtape
