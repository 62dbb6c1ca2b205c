// core/allocator.cpp: the CPU allocator and its counters.
#include "core/allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "core/check.h"
#include "core/cuda_allocator.h"

namespace normtape {

namespace {

constexpr size_t kAlignment = 64;

MemoryStats cpu_stats;
std::vector<MemoryEvent>* cpu_trace = nullptr;

void check_backend(Device device, const char* what) {
    NT_CHECK_AS(DeviceError, device.is_cpu() || cuda_is_built(), what, ": expected device cpu, got ",
                device_name(device), ", which needs the CUDA backend that this build of normtape does not have");
}

}  // namespace

void* allocate(Device device, size_t nbytes) {
    check_backend(device, "allocate");
    if (device.is_cuda()) {  // checked even for 0 bytes: no tensor may claim a GPU that is not there
        NT_CHECK_AS(DeviceError, cuda_is_available(), "allocate: expected a visible CUDA GPU for ", nbytes,
                    " bytes on ", device_name(device), ", got none");
        return nbytes == 0 ? nullptr : detail::cuda_allocate(device.index, nbytes);
    }
    if (nbytes == 0) return nullptr;
    // Above INT64_MAX the byte counters would wrap; no host can give that much anyway.
    NT_CHECK_AS(OutOfMemoryError, nbytes <= static_cast<size_t>(INT64_MAX) - kAlignment,
                "allocate: out of memory on cpu: requested ", nbytes, " bytes, more than any host can hold");
    size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
    void* ptr = nullptr;
    try {
        ptr = std::aligned_alloc(kAlignment, rounded);  // returns nullptr on failure; the catch is for
    } catch (const std::bad_alloc&) {                   // C libraries that throw instead
        ptr = nullptr;
    }
    NT_CHECK_AS(OutOfMemoryError, ptr != nullptr, "allocate: out of memory on cpu: requested ", nbytes,
                " bytes with ", cpu_stats.allocated_bytes, " bytes allocated (peak ", cpu_stats.peak_allocated_bytes,
                ")");
    cpu_stats.allocated_bytes += static_cast<int64_t>(nbytes);
    cpu_stats.peak_allocated_bytes = std::max(cpu_stats.peak_allocated_bytes, cpu_stats.allocated_bytes);
    cpu_stats.num_allocs += 1;
    if (cpu_trace) {
        try {
            cpu_trace->push_back({cpu_stats.num_allocs, cpu_stats.allocated_bytes});
        } catch (...) {
            cpu_trace = nullptr;  // out of host memory for the trace: stop tracing rather than lose the block
        }
    }
    return ptr;
}

void deallocate(Device device, void* ptr, size_t nbytes) noexcept {
    if (ptr == nullptr) return;
    if (device.is_cuda()) {
        detail::cuda_deallocate(device.index, ptr);
        return;
    }
    std::free(ptr);
    cpu_stats.allocated_bytes -= static_cast<int64_t>(nbytes);
    if (cpu_trace) {
        try {
            cpu_trace->push_back({cpu_stats.num_allocs, cpu_stats.allocated_bytes});
        } catch (...) {
            cpu_trace = nullptr;  // out of host memory for the trace: stop tracing, never throw from here
        }
    }
}

MemoryStats memory_stats(Device device) {
    check_backend(device, "memory_stats");
    return device.is_cuda() ? detail::cuda_memory_stats(device.index) : cpu_stats;
}

void reset_peak_memory_stats(Device device) {
    check_backend(device, "reset_peak_memory_stats");
    if (device.is_cuda()) detail::cuda_reset_peak_memory_stats(device.index);
    else cpu_stats.peak_allocated_bytes = cpu_stats.allocated_bytes;
}

void empty_cache(Device device) {
    check_backend(device, "empty_cache");
    if (device.is_cuda()) detail::cuda_empty_cache(device.index);
}

void set_memory_trace(Device device, std::vector<MemoryEvent>* trace) {
    check_backend(device, "set_memory_trace");
    if (device.is_cuda()) detail::cuda_set_memory_trace(device.index, trace);
    else cpu_trace = trace;
}

}  // namespace normtape
