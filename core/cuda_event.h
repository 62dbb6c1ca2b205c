// core/cuda_event.h: the CUDA side of Event (core/device.h), without CUDA types: the event is a
// cudaEvent_t passed as void*. Defined in core/cuda_context.cpp; in a build without CUDA,
// core/cuda_stub.cpp's versions throw DeviceError (create) or do nothing. Internal.
#pragma once

namespace normtape::detail {

void* cuda_event_create(int device);                            // throws DeviceError, Error
void cuda_event_destroy(void* event) noexcept;
void cuda_event_record(void* event, int device);                // on the device's stream
double cuda_event_elapsed_ms(void* start, void* end);           // waits for end

}  // namespace normtape::detail
