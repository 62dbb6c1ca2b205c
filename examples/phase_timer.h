// examples/phase_timer.h: PhaseTimer, the times of the three phases of one training step (forward,
// backward, optimizer) for train_gpt, taken without adding work or waits to a step where the build
// allows it. Not here: the step itself (examples/train_gpt.cpp), the report (examples/report.h).
//
// How each device is timed (method()):
//   "cuda events"  cuda, in a build linked with the static library: a CUDA event recorded on
//                  normtape's stream (core/cuda_context.h) at each boundary, read after the step's
//                  closing synchronize: the GPU's own times, no wait inside the step
//   "host clock"   cpu: the steady clock at each boundary (cpu ops are done when they return)
//   "host clock, synchronized phases"
//                  cuda, in a build against libnormtape.so, which does not export the stream:
//                  synchronize(device), then the steady clock, at each boundary: the same phases
//                  plus two waits per step (after the forward and after the backward)
#pragma once

#include <array>
#include <chrono>

#include "normtape.h"

struct CUevent_st;   // cudaEvent_t is CUevent_st*: this header needs no CUDA header
struct CUstream_st;  // cudaStream_t is CUstream_st*

class PhaseTimer {
public:
    // Boundaries of a step, in the order they are marked.
    enum Boundary { kStart = 0, kForwardDone = 1, kBackwardDone = 2, kOptimizerDone = 3 };

    // Creates the events on a cuda device; throws normtape::Error on a CUDA error.
    explicit PhaseTimer(normtape::Device device);
    ~PhaseTimer();
    PhaseTimer(const PhaseTimer&) = delete;
    PhaseTimer& operator=(const PhaseTimer&) = delete;

    // Marks boundary `b` of the current step. Throws normtape::Error on a CUDA error.
    void mark(Boundary b);
    // Forward, backward and optimizer time of the step just marked, in ms. Call once the step's work
    // has finished (after synchronize(device)). Throws normtape::Error on a CUDA error.
    std::array<double, 3> read() const;
    // How the times are taken (see the top of this file).
    const char* method() const;

private:
    normtape::Device device_;
    std::array<std::chrono::steady_clock::time_point, 4> host_{};
    std::array<CUevent_st*, 4> events_{};  // all null unless timing with events
    CUstream_st* stream_ = nullptr;
};
