// examples/train_gpt/phase_timer.h: PhaseTimer, the times of the three phases of one training step (forward,
// backward, optimizer) for train_gpt, taken with normtape::Event (core/device.h): on a GPU the
// device's own times, with no wait added inside a step; on the cpu the host clock. Not here: the
// step itself (examples/train_gpt/train_gpt.cpp), the report (examples/train_gpt/report.h).
#pragma once

#include <array>

#include "normtape.h"

class PhaseTimer {
public:
    // Boundaries of a step, in the order they are marked.
    enum Boundary { kStart = 0, kForwardDone = 1, kBackwardDone = 2, kOptimizerDone = 3 };

    // Throws normtape::DeviceError as Event does.
    explicit PhaseTimer(normtape::Device device);
    // Marks boundary `b` of the current step (queues nothing, waits for nothing).
    void mark(Boundary b) { events_[b].record(); }
    // Forward, backward and optimizer time of the step just marked, in ms; waits for the step's end.
    std::array<double, 3> read() const;
    // How the times are taken: "cuda events" or "host clock".
    const char* method() const { return events_[0].device().is_cuda() ? "cuda events" : "host clock"; }

private:
    std::array<normtape::Event, 4> events_;
};
