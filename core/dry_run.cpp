// core/dry_run.cpp: the dry run's counters, its addresses, and the capture that keeps a CUDA
// dry run's kernels from running (Note [The dry run], core/dry_run.h).
#include "core/dry_run.h"

#include <algorithm>

#include "core/check.h"
#include "core/cuda_allocator.h"
#include "core/cuda_graph.h"
#include "core/device_ptr.h"
#include "core/philox.h"

namespace normtape {

namespace {

// The dry run in progress, if any: its device, its counters (the dry run's device and, in a CUDA
// dry run, the cpu) and where its next address starts.
struct DryRun {
    Device device;
    MemoryStats stats[2];  // [0] the cpu, [1] the dry run's GPU
    std::vector<MemoryEvent>* user_trace[2] = {nullptr, nullptr};
    std::vector<MemoryEvent>* timeline = nullptr;  // the result's: every event on `device`
    uintptr_t next_address = uintptr_t(1) << 44;   // far from any real mapping, 256-byte aligned
    bool capturing = false;
    uint64_t id = 0;
};
DryRun* current = nullptr;
uint64_t runs = 0;  // dry runs started so far

// The counters of `device` in the current dry run; DeviceError for a device it does not cover.
int slot(Device device) {
    if (device.is_cpu()) return 0;
    NT_CHECK_AS(DeviceError, current->device == device, "dry_run: a dry run on ", device_name(current->device),
                " covers its own device", current->device.is_cuda() ? " and the cpu" : "", ", got a tensor on ",
                device_name(device));
    return 1;
}

void record(int s, int64_t delta) noexcept {
    detail::append_memory_event(current->user_trace[s], current->stats[s], delta);
    if ((s == 1) == current->device.is_cuda()) detail::append_memory_event(current->timeline, current->stats[s], delta);
}

}  // namespace

bool is_dry_run() { return current != nullptr; }

void detail::throw_dry_access() {
    throw_error<Error>("a kernel reached a tensor of a dry run (core/dry_run.h), which holds no data: a dry run ",
                       "skips the cpu kernels behind dispatch_floating and dispatch_all, and cannot run one outside ",
                       "them, nor a cpu kernel inside a CUDA dry run; and a dry tensor cannot be used after its run");
}

bool detail::dry_run_skips_kernels() { return current != nullptr && !current->capturing; }

void* detail::dry_allocate(Device device, size_t nbytes) {
    const int s = slot(device);
    if (nbytes == 0) return nullptr;
    NT_CHECK_AS(OutOfMemoryError, nbytes <= (size_t(1) << 56), "allocate: a dry run on ", device_name(device),
                " cannot count ", nbytes, " bytes (expected at most 2^56 a tensor)");
    void* address = reinterpret_cast<void*>(current->next_address);
    current->next_address += (nbytes + 255) / 256 * 256;
    MemoryStats& m = current->stats[s];
    m.allocated_bytes += static_cast<int64_t>(nbytes);
    m.peak_allocated_bytes = std::max(m.peak_allocated_bytes, m.allocated_bytes);
    m.num_allocs += 1;
    record(s, static_cast<int64_t>(nbytes));
    return address;
}

uint64_t detail::dry_run_id() { return current ? current->id : 0; }

void detail::dry_deallocate(uint64_t id, Device device, size_t nbytes) noexcept {
    if (!current || current->id != id || nbytes == 0) return;  // a tensor that outlived its dry run counts nowhere
    const int s = device.is_cpu() ? 0 : 1;
    if (s == 1 && current->device != device) return;
    current->stats[s].allocated_bytes -= static_cast<int64_t>(nbytes);
    record(s, -static_cast<int64_t>(nbytes));
}

MemoryStats detail::dry_memory_stats(Device device) { return current->stats[slot(device)]; }

void detail::dry_reset_peak_memory_stats(Device device) {
    MemoryStats& m = current->stats[slot(device)];
    m.peak_allocated_bytes = m.allocated_bytes;
}

void detail::dry_set_memory_trace(Device device, std::vector<MemoryEvent>* trace) {
    current->user_trace[slot(device)] = trace;
}

DryRunResult dry_run(Device device, const std::function<void()>& fn) {
    NT_CHECK(current == nullptr, "dry_run: expected no dry run in progress, got one on ", device_name(current->device),
             " (dry runs do not nest)");
    if (device.is_cuda()) {
        NT_CHECK_AS(DeviceError, cuda_is_built(), "dry_run: expected device cpu, got ", device_name(device),
                    ", which needs the CUDA backend that this build of normtape does not have");
        NT_CHECK_AS(DeviceError, cuda_is_available(), "dry_run: a dry run on ", device_name(device),
                    " records its kernels into a CUDA graph that never runs, and asks the device for its plans "
                    "(cuDNN, cuBLASLt): expected a visible GPU, got none");
    }
    NT_CHECK(!detail::cuda_graph_capturing(), "dry_run: expected no CUDA graph capture in progress, got one "
             "(core/cuda_graph.h)");
    DryRunResult result;
    result.device = device;
    DryRun run;
    run.device = device;
    run.id = ++runs;
    run.timeline = &result.timeline;
    const PhiloxState philox = philox_state();  // dropout's offsets advance; the real run's do not
    current = &run;
    try {
        if (device.is_cuda()) {
            detail::cuda_graph_begin_capture(device.index);
            run.capturing = true;
        }
        fn();
    } catch (...) {
        current = nullptr;
        set_philox_state(philox);
        if (run.capturing) {
            try {
                detail::cuda_end_dry_capture(device.index);
            } catch (...) {  // what fn threw says more than the capture it broke
            }
        }
        throw;
    }
    current = nullptr;
    set_philox_state(philox);
    if (run.capturing) detail::cuda_end_dry_capture(device.index);
    result.stats = run.stats[device.is_cuda() ? 1 : 0];
    if (!run.timeline) result.timeline.clear();  // the timeline ran out of host memory: say nothing rather than part
    return result;
}

}  // namespace normtape
