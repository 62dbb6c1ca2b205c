// examples/train_gpt/phase_timer.h: PhaseTimer, the times of the three phases of one training step (forward,
// backward, optimizer) for train_gpt, taken with normtape::Event (core/device.h): on a GPU the
// device's own times, with no wait added inside a step; on the cpu the host clock. Beside them, the
// host's time to queue each phase (on a GPU: where the host takes as long as the device, the device
// waits on it between kernels). A step of
// micro-batches (--micro-batch) alternates forwards and backwards: each phase's time is the sum of
// its parts. Not here: the step itself (examples/train_gpt/step_runner.h), the report
// (examples/train_gpt/report.h).
#pragma once

#include <array>
#include <chrono>
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
    void mark_start() { mark(0); }
    void mark_forward_done(int64_t k) { mark(static_cast<size_t>(1 + 2 * k)); }
    void mark_backward_done(int64_t k) { mark(static_cast<size_t>(2 + 2 * k)); }
    void mark_optimizer_done() { mark(events_.size() - 1); }
    // Forward, backward and optimizer time of the step just marked, in ms: the forwards' times
    // summed (each from the start or the previous backward's end), the backwards' summed, and the
    // optimizer's. Waits for the step's end.
    std::array<double, 3> read() const;
    // The same three phases by the host clock between the marks: the time the host took to queue
    // each phase's work (on the cpu, to do it).
    std::array<double, 3> host_read() const;
    // How the times are taken: "cuda events" or "host clock".
    const char* method() const { return events_[0].device().is_cuda() ? "cuda events" : "host clock"; }

private:
    // start, then forward end and backward end of each micro-batch, then the optimizer's end.
    std::vector<normtape::Event> events_;
    std::vector<std::chrono::steady_clock::time_point> host_;  // the host clock at each mark
    void mark(size_t i) {
        events_[i].record();
        host_[i] = std::chrono::steady_clock::now();
    }
    // Forward, backward and optimizer sums of `ms(i, j)`, the time between marks i and j.
    template <class Ms>
    std::array<double, 3> phases(Ms ms) const;
};
