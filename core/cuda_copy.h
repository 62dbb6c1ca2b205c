// core/cuda_copy.h: asynchronous copies between pinned host memory and a GPU on a side stream, for
// SaveOnCpu (core/save_on_cpu.h), without CUDA types: events are cudaEvent_t passed as void*.
// Defined in core/cuda_copy.cpp; in a build without CUDA, core/cuda_stub.cpp's versions throw
// DeviceError (event creation, copies) or do nothing. Internal; not thread-safe, like the rest.
//
// Each GPU gets one side stream (created on first use with cudaStreamNonBlocking, kept for the
// process, as the device's own stream is: core/cuda_context.h). A copy on it first waits for the
// work queued so far on the device's stream, so it sees (and writes over) the bytes that work left;
// the caller makes the device's stream wait for the copy's event before it reads what the copy
// wrote (cuda_stream_wait_event), and keeps the bytes the copy reads alive until then. The host
// never waits, except in cuda_side_streams_synchronize.
#pragma once

#include <cstddef>

namespace normtape::detail {

// A new event on `device` without timing (cudaEventDisableTiming), for cuda_copy_*_async's `done`.
// Destroy it with cuda_event_destroy (core/cuda_event.h). Throws DeviceError, Error.
void* cuda_copy_event_create(int device);

// Queues on `device`'s side stream, after the work queued so far on its stream, a copy of `nbytes`
// from `src` (GPU memory of `device`) to `dst` (pinned host memory), then records `done` there.
// Also waits for the copies queued so far on the other GPUs' side streams, which may still read a
// pinned block that came back to the cache (core/cuda_allocator.h). Returns at once. Throws Error
// on a CUDA error.
void cuda_copy_to_host_async(void* dst, const void* src, size_t nbytes, int device, void* done);

// The other way: `src` pinned host memory, `dst` GPU memory of `device` (whose block may have been
// freed by work still queued on the device's stream: the copy waits for that work). Returns at
// once. Throws Error on a CUDA error.
void cuda_copy_to_device_async(void* dst, const void* src, size_t nbytes, int device, void* done);

// Makes `device`'s stream wait for `event` (its last record); queued, the host does not wait.
// Throws Error on a CUDA error.
void cuda_stream_wait_event(int device, void* event);

// Makes `device`'s stream wait for everything queued so far on its side stream (nothing when the
// side stream was never made). Throws Error on a CUDA error.
void cuda_stream_wait_side(int device);

// True when the work before `event`'s last record has finished (cudaEventQuery; never waits).
// Throws Error on a CUDA error other than "not ready".
bool cuda_event_query(void* event);

// Waits on the host until the copies queued on every side stream made so far have finished (before
// pinned memory goes back to the driver). Throws Error on a CUDA error.
void cuda_side_streams_synchronize();

}  // namespace normtape::detail
