// core/cuda_stub.cpp: what a build without the CUDA backend links in place of core/cuda_*.cpp:
// no GPU is ever available, and anything that would touch one throws.
#include "core/check.h"
#include "core/cuda_allocator.h"
#include "core/cuda_event.h"
#include "core/device.h"

namespace normtape {

bool cuda_is_built() { return false; }
bool cuda_is_available() { return false; }
void synchronize(Device device) {
    NT_CHECK_AS(DeviceError, device.is_cpu(), "synchronize: expected device cpu, got ", device_name(device),
                ", which needs the CUDA backend that this build does not have");
}

namespace detail {
void* cuda_allocate(int, size_t) {
    NT_CHECK_AS(DeviceError, false, "allocate: expected device cpu, got cuda: this build of normtape has no CUDA backend");
}
void cuda_deallocate(int, void*) noexcept {}
MemoryStats cuda_memory_stats(int) { return {}; }
void cuda_reset_peak_memory_stats(int) {}
void cuda_empty_cache(int) {}
void cuda_set_memory_trace(int, std::vector<MemoryEvent>*) {}
void* cuda_event_create(int) {
    NT_CHECK_AS(DeviceError, false, "Event: expected device cpu, got cuda: this build of normtape has no CUDA backend");
}
void cuda_event_destroy(void*) noexcept {}
void cuda_event_record(void*, int) {}
double cuda_event_elapsed_ms(void*, void*) { return 0; }
}  // namespace detail

}  // namespace normtape
