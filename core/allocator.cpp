// core/allocator.cpp: the CPU allocator and its counters.
#include "core/allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <new>
#include <string>

#include "core/check.h"
#include "core/cuda_allocator.h"
#include "core/dry_run.h"
#include "core/named_scope.h"

namespace normtape {

namespace {

constexpr size_t kAlignment = 64;

MemoryStats cpu_stats;
std::vector<MemoryEvent>* cpu_trace = nullptr;

void check_backend(Device device, const char* what) {
    NT_CHECK_AS(DeviceError, device.is_cpu() || cuda_is_built(), what, ": expected device cpu, got ",
                device_name(device), ", which needs the CUDA backend that this build of normtape does not have");
}

void count_cpu_allocation(size_t nbytes) noexcept {
    cpu_stats.allocated_bytes += static_cast<int64_t>(nbytes);
    cpu_stats.peak_allocated_bytes = std::max(cpu_stats.peak_allocated_bytes, cpu_stats.allocated_bytes);
    cpu_stats.num_allocs += 1;
    detail::append_memory_event(cpu_trace, cpu_stats, static_cast<int64_t>(nbytes));
}

void count_cpu_deallocation(size_t nbytes) noexcept {
    cpu_stats.allocated_bytes -= static_cast<int64_t>(nbytes);
    detail::append_memory_event(cpu_trace, cpu_stats, -static_cast<int64_t>(nbytes));
}

}  // namespace

bool detail::cuda_memory_caching_setting(const char* value) {
    std::string v = value ? value : "";
    NT_CHECK(v.empty() || v == "0" || v == "1",
             "allocate: expected NORMTAPE_NO_CUDA_MEMORY_CACHING to be unset, empty, 0 or 1, got \"", v, "\"");
    return v != "1";
}

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
    count_cpu_allocation(nbytes);
    return ptr;
}

void deallocate(Device device, void* ptr, size_t nbytes) noexcept {
    if (ptr == nullptr) return;
    if (device.is_cuda()) {
        detail::cuda_deallocate(device.index, ptr);
        return;
    }
    std::free(ptr);
    count_cpu_deallocation(nbytes);
}

void* allocate_pinned(size_t nbytes) {
    NT_CHECK_AS(DeviceError, cuda_is_built(), "allocate_pinned: expected a build with the CUDA backend for ", nbytes,
                " bytes of pinned host memory, got one without it");
    NT_CHECK_AS(DeviceError, cuda_is_available(), "allocate_pinned: expected a visible CUDA GPU for ", nbytes,
                " bytes of pinned host memory, got none");
    if (nbytes == 0) return nullptr;
    void* ptr = nullptr;
    try {
        ptr = detail::cuda_host_allocate(nbytes);
    } catch (const OutOfMemoryError& e) {
        detail::throw_error<OutOfMemoryError>("allocate_pinned: out of memory on cpu: requested ", nbytes,
                                              " pinned bytes with ", cpu_stats.allocated_bytes,
                                              " bytes allocated (peak ", cpu_stats.peak_allocated_bytes,
                                              "): ", e.what());
    }
    count_cpu_allocation(nbytes);
    return ptr;
}

void deallocate_pinned(void* ptr, size_t nbytes) noexcept {
    if (ptr == nullptr) return;
    detail::cuda_host_deallocate(ptr, nbytes);
    count_cpu_deallocation(nbytes);
}

MemoryStats memory_stats(Device device) {
    check_backend(device, "memory_stats");
    if (is_dry_run()) return detail::dry_memory_stats(device);
    return device.is_cuda() ? detail::cuda_memory_stats(device.index) : cpu_stats;
}

int64_t memory_available_bytes(Device device) {
    check_backend(device, "memory_available_bytes");
    if (device.is_cuda()) return detail::cuda_available_bytes(device.index);
    std::ifstream meminfo("/proc/meminfo");
    std::string key;
    int64_t kib = 0;
    while (meminfo >> key >> kib) {
        if (key == "MemAvailable:") return kib * 1024;
        meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    return 0;
}

void reset_peak_memory_stats(Device device) {
    check_backend(device, "reset_peak_memory_stats");
    if (is_dry_run()) detail::dry_reset_peak_memory_stats(device);
    else if (device.is_cuda()) detail::cuda_reset_peak_memory_stats(device.index);
    else cpu_stats.peak_allocated_bytes = cpu_stats.allocated_bytes;
}

void empty_cache(Device device) {
    check_backend(device, "empty_cache");
    if (is_dry_run()) return;  // nothing is cached, and a CUDA dry run may not wait for its device
    if (device.is_cuda()) detail::cuda_empty_cache(device.index);
    else detail::cuda_host_empty_cache();
}

void detail::append_memory_event(std::vector<MemoryEvent>*& trace, const MemoryStats& stats,
                                 int64_t delta_bytes) noexcept {
    if (!trace) return;
    try {
        MemoryEvent e;
        e.num_allocs = stats.num_allocs;
        e.allocated_bytes = stats.allocated_bytes;
        e.delta_bytes = delta_bytes;
        e.backward = in_backward();
        e.node = current_backward_node();
        e.scope = current_scope();
        trace->push_back(std::move(e));
    } catch (...) {
        trace = nullptr;  // out of host memory for the trace: stop tracing rather than lose the block
    }
}

void set_memory_trace(Device device, std::vector<MemoryEvent>* trace) {
    check_backend(device, "set_memory_trace");
    if (is_dry_run()) detail::dry_set_memory_trace(device, trace);
    else if (device.is_cuda()) detail::cuda_set_memory_trace(device.index, trace);
    else cpu_trace = trace;
}

}  // namespace normtape
