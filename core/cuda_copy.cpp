// core/cuda_copy.cpp: the side streams and the asynchronous copies of core/cuda_copy.h.
#include "core/cuda_copy.h"

#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/dry_run.h"

namespace normtape::detail {

namespace {

struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t ready = nullptr;  // re-recorded on the device's stream before each copy
    cudaEvent_t tail = nullptr;   // re-recorded on the side stream after each copy: all it has queued
};

std::vector<SideStream>& side_streams() {
    static std::vector<SideStream> s;  // kept for the process, as the device's stream is
    return s;
}

// Makes `device` current (checking its index) and returns its side stream, made on first use.
SideStream& side(int device) {
    cuda::stream(device);
    if (side_streams().size() <= static_cast<size_t>(device)) side_streams().resize(device + 1);
    SideStream& s = side_streams()[device];
    if (!s.stream) {
        SideStream made;
        CUDA_CHECK(cudaEventCreateWithFlags(&made.ready, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&made.tail, cudaEventDisableTiming));
        CUDA_CHECK(cudaStreamCreateWithFlags(&made.stream, cudaStreamNonBlocking));
        s = made;
    }
    return s;
}

// In a dry run (core/dry_run.h) no copy is made and no stream waits: the side stream is not
// captured, and the dry run's addresses hold nothing. Its copies never finish (cuda_event_query),
// so SaveOnCpu keeps their sources: the dry run's peak is a bound of the real one.
void copy_async(void* dst, const void* src, size_t nbytes, int device, void* done, cudaMemcpyKind kind) {
    if (is_dry_run()) return;
    SideStream& s = side(device);
    CUDA_CHECK(cudaEventRecord(s.ready, cuda::stream(device)));
    CUDA_CHECK(cudaStreamWaitEvent(s.stream, s.ready, 0));
    if (kind == cudaMemcpyDeviceToHost) {  // dst may be a pinned block another GPU's copy still reads
        const std::vector<SideStream>& all = side_streams();
        for (size_t d = 0; d < all.size(); ++d)
            if (d != static_cast<size_t>(device) && all[d].stream)
                CUDA_CHECK(cudaStreamWaitEvent(s.stream, all[d].tail, 0));
    }
    if (nbytes > 0) CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, s.stream));
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(done), s.stream));
    CUDA_CHECK(cudaEventRecord(s.tail, s.stream));
}

}  // namespace

void* cuda_copy_event_create(int device) {
    cuda::stream(device);  // checks the device and makes it current: the event belongs to it
    cudaEvent_t event = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
}

void cuda_copy_to_host_async(void* dst, const void* src, size_t nbytes, int device, void* done) {
    copy_async(dst, src, nbytes, device, done, cudaMemcpyDeviceToHost);
}

void cuda_copy_to_device_async(void* dst, const void* src, size_t nbytes, int device, void* done) {
    copy_async(dst, src, nbytes, device, done, cudaMemcpyHostToDevice);
}

void cuda_stream_wait_event(int device, void* event) {
    if (is_dry_run()) return;
    CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device), static_cast<cudaEvent_t>(event), 0));
}

void cuda_stream_wait_side(int device) {
    if (is_dry_run()) return;
    if (device < 0 || side_streams().size() <= static_cast<size_t>(device) || !side_streams()[device].stream) return;
    CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(device), side_streams()[device].tail, 0));
}

bool cuda_event_query(void* event) {
    if (is_dry_run()) return false;
    cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaErrorNotReady) {
        cudaGetLastError();  // "not ready" is an answer, not an error: leave no error behind
        return false;
    }
    CUDA_CHECK(err);
    return true;
}

void cuda_side_streams_synchronize() {
    if (is_dry_run()) return;
    for (const SideStream& s : side_streams())
        if (s.stream) CUDA_CHECK(cudaStreamSynchronize(s.stream));
}

}  // namespace normtape::detail
