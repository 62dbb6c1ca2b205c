// examples/train_gpt/phase_timer.cpp: PhaseTimer (examples/train_gpt/phase_timer.h).
#include "phase_timer.h"

using normtape::Event;

PhaseTimer::PhaseTimer(normtape::Device device, int64_t micro_batches) {
    NT_CHECK(micro_batches >= 1, "PhaseTimer: expected micro_batches >= 1, got ", micro_batches);
    events_.reserve(static_cast<size_t>(2 * micro_batches + 2));
    for (int64_t i = 0; i < 2 * micro_batches + 2; ++i) events_.emplace_back(device);
}

std::array<double, 3> PhaseTimer::read() const {
    std::array<double, 3> ms{};
    const size_t last = events_.size() - 1;  // the optimizer's end; the last backward's is last - 1
    for (size_t i = 1; i < last; i += 2) {
        ms[0] += Event::elapsed_ms(events_[i - 1], events_[i]);  // the forward, from the start or the previous backward
        ms[1] += Event::elapsed_ms(events_[i], events_[i + 1]);
    }
    ms[2] = Event::elapsed_ms(events_[last - 1], events_[last]);
    return ms;
}
