// examples/train_gpt/phase_timer.h: PhaseTimer, the times of the three phases of one training step (forward,
// backward, optimizer) for train_gpt, taken with normtape::Event (core/device.h): on a GPU the
// device's own times, with no wait added inside a step; on the cpu the host clock. A step of
// micro-batches (--micro-batch) alternates forwards and backwards: each phase's time is the sum of
// its parts. Not here: the step itself (examples/train_gpt/train_gpt.cpp), the report
// (examples/train_gpt/report.h).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "normtape.h"

class PhaseTimer {
public:
    // A timer of steps of `micro_batches` forward-backward pairs. Throws normtape::Error on
    // micro_batches < 1, normtape::DeviceError as Event does.
    PhaseTimer(normtape::Device device, int64_t micro_batches);
    // Mark the boundaries of the current step, in this order: its start; then, for each micro-batch
    // k from 0 to micro_batches - 1, the end of its forward (the loss) and of its backward; then
    // the end of the optimizer (gradient clipping, AdamW, zero_grad). Each queues nothing and waits
    // for nothing.
    void mark_start() { events_.front().record(); }
    void mark_forward_done(int64_t k) { events_[1 + 2 * k].record(); }
    void mark_backward_done(int64_t k) { events_[2 + 2 * k].record(); }
    void mark_optimizer_done() { events_.back().record(); }
    // Forward, backward and optimizer time of the step just marked, in ms: the forwards' times
    // summed (each from the start or the previous backward's end), the backwards' summed, and the
    // optimizer's. Waits for the step's end.
    std::array<double, 3> read() const;
    // How the times are taken: "cuda events" or "host clock".
    const char* method() const { return events_[0].device().is_cuda() ? "cuda events" : "host clock"; }

private:
    // start, then forward end and backward end of each micro-batch, then the optimizer's end.
    std::vector<normtape::Event> events_;
};
