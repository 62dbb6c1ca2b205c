// examples/train_gpt/phase_timer.cpp: PhaseTimer (examples/train_gpt/phase_timer.h).
#include "phase_timer.h"

using normtape::Event;

PhaseTimer::PhaseTimer(normtape::Device device)
    : events_{Event(device), Event(device), Event(device), Event(device)} {}

std::array<double, 3> PhaseTimer::read() const {
    std::array<double, 3> ms{};
    for (int i = 0; i < 3; ++i) ms[i] = Event::elapsed_ms(events_[i], events_[i + 1]);
    return ms;
}
