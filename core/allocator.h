// core/allocator.h: the one way tensor bytes are obtained, and the byte counters that prove
// what a policy saves.
//
// Every Storage gets its bytes from allocate() and returns them with deallocate(); nothing else
// allocates tensor data. Both allocators count the bytes that were asked for (not the rounded
// block), so that allocated_bytes matches sums of numel * element_size exactly. The CPU allocator
// hands out 64-byte aligned blocks straight from the system; the CUDA allocator caches blocks
// (core/cuda_allocator.h) and also counts the bytes it holds from the driver (reserved).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/device.h"

namespace normtape {

// Byte counters of one device's allocator, in bytes.
struct MemoryStats {
    int64_t allocated_bytes = 0;       // live tensor bytes now
    int64_t peak_allocated_bytes = 0;  // highest allocated_bytes since the last reset
    int64_t reserved_bytes = 0;        // CUDA: bytes held from the driver (cached or in use); cpu: 0
    int64_t peak_reserved_bytes = 0;   // CUDA: highest reserved_bytes since the last reset
    int64_t num_allocs = 0;            // allocations of more than 0 bytes since the process started
};

// Returns `nbytes` bytes on `device`, 64-byte (cpu) or 256-byte (CUDA) aligned; nbytes == 0
// gives nullptr. Throws OutOfMemoryError when the memory cannot be had (on CUDA after returning
// the cache to the driver; the message gives the request and the counters), DeviceError when
// `device` has no backend in this build or no GPU is visible (also for nbytes == 0), Error on
// another CUDA error (a GPU index that is not there reaches cudaSetDevice and fails there).
void* allocate(Device device, size_t nbytes);

// Returns a block obtained from allocate(device, nbytes); `nbytes` must be the size asked for.
void deallocate(Device device, void* ptr, size_t nbytes) noexcept;

// The counters of `device`'s allocator. Throws DeviceError for a device without a backend in this build.
MemoryStats memory_stats(Device device);

// Sets the peaks to the current values. Throws as memory_stats.
void reset_peak_memory_stats(Device device);

// Returns the CUDA allocator's cached, wholly free segments to the driver (reserved_bytes falls);
// waits for the device first. No-op on the cpu. Throws DeviceError for CUDA in a build without
// the backend, Error on a CUDA error (e.g. no GPU visible).
void empty_cache(Device device);

// One point of a memory timeline: the counters right after an allocation or a deallocation.
struct MemoryEvent {
    int64_t num_allocs;       // MemoryStats::num_allocs then (frees do not advance it)
    int64_t allocated_bytes;  // MemoryStats::allocated_bytes then
};

// While `trace` is set, appends a MemoryEvent to it after every allocation and deallocation on
// `device` (train_gpt charts one step this way); nullptr stops recording. Throws DeviceError for
// CUDA in a build without the backend.
void set_memory_trace(Device device, std::vector<MemoryEvent>* trace);

}  // namespace normtape
