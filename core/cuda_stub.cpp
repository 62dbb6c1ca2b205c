// core/cuda_stub.cpp: what a build without the CUDA backend links in place of core/cuda_*.cpp:
// no GPU is ever available, and anything that would touch one throws.
#include "core/check.h"
#include "core/cuda_allocator.h"
#include "core/cuda_copy.h"
#include "core/cuda_event.h"
#include "core/device.h"

namespace normtape {

bool cuda_is_built() { return false; }
bool cuda_is_available() { return false; }
int cuda_compute_capability(Device device) {
    NT_CHECK_AS(DeviceError, false, "cuda_compute_capability: expected a CUDA device in a build with the CUDA backend, got ",
                device_name(device), " in a build without it");
}
std::string cuda_device_name(Device device) {
    NT_CHECK_AS(DeviceError, false, "cuda_device_name: expected a CUDA device in a build with the CUDA backend, got ",
                device_name(device), " in a build without it");
}
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
int64_t cuda_available_bytes(int) { return 0; }
void cuda_reset_peak_memory_stats(int) {}
void cuda_empty_cache(int) {}
bool cuda_memory_caching() { return true; }
void set_cuda_memory_caching(bool) {}
void cuda_set_memory_trace(int, std::vector<MemoryEvent>*) {}
void* cuda_host_allocate(size_t) {
    NT_CHECK_AS(DeviceError, false, "allocate_pinned: expected a build with the CUDA backend, got one without it");
}
void cuda_host_deallocate(void*, size_t) noexcept {}
void cuda_host_empty_cache() {}
void cuda_end_dry_capture(int) {}
void cuda_graph_begin_capture(int) {
    NT_CHECK_AS(DeviceError, false, "CUDAGraph: expected a CUDA build, got one without the CUDA backend");
}
void* cuda_graph_end_capture(int) { return nullptr; }
std::string cuda_graph_abort_capture(int) noexcept { return ""; }
void cuda_graph_launch(void*, int) {}
void cuda_graph_destroy(void*) noexcept {}
void cuda_begin_graph_pool(int, uint64_t) {}
void cuda_end_graph_pool(int) {}
void cuda_release_graph_pool(int, uint64_t) noexcept {}
// SaveOnCpu keeps cpu tensors as they are: without CUDA it never copies, and these are never reached.
void* cuda_copy_event_create(int) {
    NT_CHECK_AS(DeviceError, false, "SaveOnCpu: expected device cpu, got cuda: this build has no CUDA backend");
}
void cuda_copy_to_host_async(void*, const void*, size_t, int, void*) {
    NT_CHECK_AS(DeviceError, false, "SaveOnCpu: expected device cpu, got cuda: this build has no CUDA backend");
}
void cuda_copy_to_device_async(void*, const void*, size_t, int, void*) {
    NT_CHECK_AS(DeviceError, false, "SaveOnCpu: expected device cpu, got cuda: this build has no CUDA backend");
}
void cuda_stream_wait_event(int, void*) {}
void cuda_stream_wait_side(int) {}
bool cuda_event_query(void*) { return true; }
void cuda_side_streams_synchronize() {}
void* cuda_event_create(int) {
    NT_CHECK_AS(DeviceError, false, "Event: expected device cpu, got cuda: this build of normtape has no CUDA backend");
}
void cuda_event_destroy(void*) noexcept {}
void cuda_event_record(void*, int) {}
double cuda_event_elapsed_ms(void*, void*) { return 0; }
}  // namespace detail

}  // namespace normtape
