// examples/train_gpt/phase_timer.cpp: PhaseTimer (examples/train_gpt/phase_timer.h).
#include "phase_timer.h"

using normtape::Event;

PhaseTimer::PhaseTimer(normtape::Device device, int64_t micro_batches) {
    NT_CHECK(micro_batches >= 1, "PhaseTimer: expected micro_batches >= 1, got ", micro_batches);
    events_.reserve(static_cast<size_t>(2 * micro_batches + 2));
    for (int64_t i = 0; i < 2 * micro_batches + 2; ++i) events_.emplace_back(device);
    host_.resize(events_.size());
}

template <class Ms>
std::array<double, 3> PhaseTimer::phases(Ms ms) const {
    std::array<double, 3> sum{};
    const size_t last = events_.size() - 1;  // the optimizer's end; the last backward's is last - 1
    for (size_t i = 1; i < last; i += 2) {
        sum[0] += ms(i - 1, i);  // the forward, from the start or the previous backward
        sum[1] += ms(i, i + 1);
    }
    sum[2] = ms(last - 1, last);
    return sum;
}

std::array<double, 3> PhaseTimer::read() const {
    return phases([&](size_t i, size_t j) { return Event::elapsed_ms(events_[i], events_[j]); });
}

std::array<double, 3> PhaseTimer::host_read() const {
    return phases([&](size_t i, size_t j) { return std::chrono::duration<double, std::milli>(host_[j] - host_[i]).count(); });
}
