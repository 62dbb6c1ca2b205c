// core/allocator.h: the one way tensor bytes are obtained, and the byte counters that prove
// what a policy saves.
//
// Every Storage gets its bytes from allocate() and returns them with deallocate(), or, for pinned
// host memory, from allocate_pinned() and deallocate_pinned(); nothing else allocates tensor data.
// Both allocators count the bytes that were asked for (not the rounded block), so that
// allocated_bytes matches sums of numel * element_size exactly. The CPU allocator hands out
// 64-byte aligned blocks straight from the system, and counts pinned blocks as it counts those;
// the CUDA allocator caches blocks (core/cuda_allocator.h) and also counts the bytes it holds from
// the driver (reserved).
//
// Caching off: with NORMTAPE_NO_CUDA_MEMORY_CACHING=1 in the environment (PyTorch's is
// PYTORCH_NO_CUDA_MEMORY_CACHING), every CUDA allocation is a cudaMalloc of exactly the bytes asked
// for, and every deallocation a cudaFree, at once. It is for compute-sanitizer: its memcheck and
// initcheck then see each tensor's own bounds, where with caching a kernel that overruns its
// tensor writes into the rest of a cached block unseen. allocated_bytes and peak_allocated_bytes
// are the same bytes either way; reserved_bytes stays the bytes held from the driver, which with
// caching off from the start equal allocated_bytes. The outputs of cuBLAS and cuDNN are then also
// marked as written for initcheck (cuda_mark_written, core/cuda_allocator.h). Slow: every free
// waits for the device. Unset, empty or 0 leaves caching on; any other value makes every CUDA
// allocation throw Error, naming it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
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

// Returns `nbytes` bytes of pinned (page-locked) host memory, which a GPU copies from and to
// asynchronously (cudaHostAlloc; SaveOnCpu's host copies, core/save_on_cpu.h); nbytes == 0 gives
// nullptr. Counted by memory_stats(Device::CPU) exactly as allocate(Device::CPU, nbytes) is
// (allocated_bytes, peak, num_allocs, the memory trace). Freed blocks are cached by exact size
// (cudaHostAlloc is slow) until empty_cache(Device::CPU). Throws DeviceError in a build without
// the CUDA backend or when no GPU is visible, OutOfMemoryError when the bytes cannot be pinned
// (after freeing the cache), Error on another CUDA error.
void* allocate_pinned(size_t nbytes);

// Returns a block obtained from allocate_pinned(nbytes) to the cache; `nbytes` as asked for.
void deallocate_pinned(void* ptr, size_t nbytes) noexcept;

// The counters of `device`'s allocator. Throws DeviceError for a device without a backend in this build.
MemoryStats memory_stats(Device device);

// The bytes a training run could still allocate on `device`: on CUDA the device's free memory
// (cudaMemGetInfo) plus the bytes this process's allocator caches unused (reserved - allocated);
// on the cpu the kernel's estimate of available memory (MemAvailable in /proc/meminfo, Linux;
// 0 where it cannot be read). Throws as memory_stats, and Error on a CUDA error.
int64_t memory_available_bytes(Device device);

// Sets the peaks to the current values. Throws as memory_stats.
void reset_peak_memory_stats(Device device);

// CUDA: returns the allocator's cached, wholly free segments to the driver (reserved_bytes falls);
// waits for the device first. cpu: returns the cached pinned blocks (allocate_pinned) to the
// driver, after waiting for the copies that may still use them; nothing else (and nothing in a
// build without CUDA). Throws DeviceError for CUDA in a build without the backend, Error on a
// CUDA error (e.g. no GPU visible).
void empty_cache(Device device);

// One point of a memory timeline: the counters right after an allocation or a deallocation, and
// where it happened (core/named_scope.h).
struct MemoryEvent {
    int64_t num_allocs = 0;       // MemoryStats::num_allocs then (frees do not advance it)
    int64_t allocated_bytes = 0;  // MemoryStats::allocated_bytes then
    int64_t delta_bytes = 0;      // the bytes allocated (> 0) or released (< 0)
    bool backward = false;        // inside a backward (a node's apply(), or a checkpoint's rerun)
    const char* node = nullptr;   // in backward: the node being run ("LayerNormBackward")
    std::shared_ptr<const std::string> scope;  // the module path then ("h.3.ln_1"; "" at the top)
};

// While `trace` is set, appends a MemoryEvent to it after every allocation and deallocation on
// `device` (train_gpt charts one step this way); nullptr stops recording. If the trace itself
// cannot grow (no host memory), recording stops; the allocation is never lost. Throws DeviceError for
// CUDA in a build without the backend.
void set_memory_trace(Device device, std::vector<MemoryEvent>* trace);

namespace detail {
// Appends the event of a `delta_bytes` change with `stats` after it, labelled with the current
// scope, to *trace; on std::bad_alloc sets trace to nullptr instead (never throws).
void append_memory_event(std::vector<MemoryEvent>*& trace, const MemoryStats& stats, int64_t delta_bytes) noexcept;
}  // namespace detail

}  // namespace normtape
