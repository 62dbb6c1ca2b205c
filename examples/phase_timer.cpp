// examples/phase_timer.cpp: PhaseTimer (examples/phase_timer.h). CUDA events where the build
// defines NORMTAPE_PHASE_EVENTS (CMakeLists.txt: the CUDA backend and the static library, whose
// internal cuda::stream() train_gpt can then reach); the host clock otherwise.
#include "phase_timer.h"

#if NORMTAPE_PHASE_EVENTS
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#endif

using namespace normtape;

namespace {
bool use_events(Device device) {
#if NORMTAPE_PHASE_EVENTS
    return device.is_cuda();
#else
    (void)device;
    return false;
#endif
}
}  // namespace

PhaseTimer::PhaseTimer(Device device) : device_(device) {
#if NORMTAPE_PHASE_EVENTS
    if (!use_events(device_)) return;
    stream_ = cuda::stream(device_.index);
    for (CUevent_st*& e : events_) CUDA_CHECK(cudaEventCreate(&e));
#endif
}

PhaseTimer::~PhaseTimer() {
#if NORMTAPE_PHASE_EVENTS
    for (CUevent_st* e : events_)
        if (e) cudaEventDestroy(e);  // unchecked: a destructor does not throw
#endif
}

void PhaseTimer::mark(Boundary b) {
#if NORMTAPE_PHASE_EVENTS
    if (use_events(device_)) {
        CUDA_CHECK(cudaEventRecord(events_[b], stream_));
        return;
    }
#endif
    synchronize(device_);  // a no-op on the cpu
    host_[b] = std::chrono::steady_clock::now();
}

std::array<double, 3> PhaseTimer::read() const {
    std::array<double, 3> ms{};
    for (int i = 0; i < 3; ++i) {
#if NORMTAPE_PHASE_EVENTS
        if (use_events(device_)) {
            float t = 0;
            CUDA_CHECK(cudaEventElapsedTime(&t, events_[i], events_[i + 1]));
            ms[i] = t;
            continue;
        }
#endif
        ms[i] = std::chrono::duration<double, std::milli>(host_[i + 1] - host_[i]).count();
    }
    return ms;
}

const char* PhaseTimer::method() const {
    if (use_events(device_)) return "cuda events";
    return device_.is_cuda() ? "host clock, synchronized phases" : "host clock";
}
