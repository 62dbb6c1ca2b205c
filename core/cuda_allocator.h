// core/cuda_allocator.h: the CUDA caching allocator behind allocate(Device::CUDA, n). Internal.
//
// In the spirit of PyTorch's CUDACachingAllocator, simplified to one stream per device:
// - requests are rounded up to 512 bytes;
// - those of at most 1 MiB come from 2 MiB segments (the small pool), larger ones from 20 MiB
//   segments below 10 MiB and from segments of their own size rounded up to 2 MiB above (the
//   large pool); a segment is obtained with cudaMalloc and kept when its blocks are freed;
// - a request takes the smallest cached free block that fits (best fit), split when the rest is
//   at least 512 bytes (small pool) or more than 1 MiB (large pool); freed blocks merge with free
//   neighbours of the same segment;
// - when cudaMalloc fails, every wholly free segment is returned (empty_cache) and the call is
//   tried once more before Error is thrown with the request and the counters.
// Freed blocks can be reused at once: all of normtape's work on a device is on its one stream,
// so later work is ordered after earlier work that used the block.
// With caching off (NORMTAPE_NO_CUDA_MEMORY_CACHING=1, core/allocator.h) none of this happens: every
// request gets a cudaMalloc of exactly its bytes, freed with cudaFree after a wait for the device as
// soon as it is deallocated; inside a dry run, whose stream capture a free would break, at the next
// allocation or empty_cache after it instead.
// Counters: allocated_bytes counts the bytes asked for (as the CPU allocator does, so that
// predictions hold to the byte); reserved_bytes counts the segments held from the driver.
//
// Also here: the pinned host memory behind allocate_pinned (core/allocator.h), page-locked with
// cudaHostAlloc (portable: every GPU may copy from and to it). cudaHostAlloc is slow, and the
// sizes asked for repeat exactly from one training step to the next, so a freed block is kept in
// a cache keyed by its exact size and handed out again to a request of that size. Its only users
// are the side-stream copies of core/cuda_copy.h, each ordered after the copies queued before it
// on the same GPU's side stream (and a copy into host memory after the other GPUs' too), so a
// block can be reused at once. cuda_host_empty_cache waits for those copies, then frees the
// cache. The cpu's counters, which count these bytes, are core/allocator.cpp's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"

namespace normtape::detail {

void* cuda_allocate(int device, size_t nbytes);
void cuda_deallocate(int device, void* ptr) noexcept;
MemoryStats cuda_memory_stats(int device);
// The device's free bytes (cudaMemGetInfo) plus what this allocator holds unused (reserved - allocated).
int64_t cuda_available_bytes(int device);
void cuda_reset_peak_memory_stats(int device);
void cuda_empty_cache(int device);
void cuda_set_memory_trace(int device, std::vector<MemoryEvent>* trace);
// Whether allocations from now on are cached: cuda_memory_caching_setting of
// NORMTAPE_NO_CUDA_MEMORY_CACHING, read at the first call of either or of cuda_allocate. The setter
// is for tests: blocks allocated before a switch are returned the way they came. Always true, and
// the setter does nothing, in a build without the CUDA backend.
bool cuda_memory_caching();
void set_cuda_memory_caching(bool on);
// What a value of NORMTAPE_NO_CUDA_MEMORY_CACHING means: nullptr (unset), "" and "0" keep caching
// on (true), "1" turns it off (false); anything else throws Error naming the variable and the value.
bool cuda_memory_caching_setting(const char* value);
// With caching off, marks `count` ranges of `bytes` bytes, `stride` bytes apart from `p` on, as
// written for compute-sanitizer's initcheck (NVTX's memory API, nvToolsExtMemCudaRt.h; read by a
// tool run with --nvtx yes, a no-op without one); with caching on it does nothing. initcheck does not
// see the writes of cuBLAS's and cuDNN's Hopper kernels (their tensor-memory-accelerator stores) and
// would report every read of their outputs as a read of memory never written: their callers mark
// what those libraries wrote in full. Inside a dry run it does nothing.
void cuda_mark_written(int device, const void* p, int64_t bytes, int64_t count = 1, int64_t stride = 0);

// `nbytes` (> 0) of pinned host memory, from the cache or cudaHostAlloc (after a failure the
// cache is freed and the call tried once more). Throws OutOfMemoryError, Error on a CUDA error.
void* cuda_host_allocate(size_t nbytes);
// Returns a block of cuda_host_allocate(nbytes) to the cache.
void cuda_host_deallocate(void* ptr, size_t nbytes) noexcept;
// Frees the cached pinned blocks (cudaFreeHost) once the side streams' copies are done. Throws Error.
void cuda_host_empty_cache();

// A CUDA graph's private pool (Note [Graph pools], core/cuda_graph.h). begin: until end, the
// device's allocations come from segments of pool `id` (> 0, new), which only its own blocks'
// releases return to, and the shared pools' blocks released meanwhile are held out of every pool.
// release: the pool's segments join the shared pools and the held blocks are returned; the caller
// has waited for the device (the graph's replays are done). begin throws Error for id 0, an id in
// use or a pool already capturing.
void cuda_begin_graph_pool(int device, uint64_t id);
void cuda_end_graph_pool(int device);
void cuda_release_graph_pool(int device, uint64_t id) noexcept;

// A CUDA dry run's capture (Note [The dry run], core/dry_run.h): begin makes the device's context
// and starts capturing its stream into a CUDA graph (relaxed mode); end stops it and destroys the
// graph unrun. end throws Error when CUDA refused a call during the capture (the capture is then
// invalidated), naming what it reports.
// begin is cuda_graph_begin_capture below.
void cuda_end_dry_capture(int device);

// A CUDA graph's capture and replay (core/cuda_graph.h). begin starts capturing the device's stream
// (relaxed mode); end stops it and returns the graph instantiated (a cudaGraphExec_t), or throws
// Error naming what CUDA refused during the capture (the graph is then destroyed); abort stops it
// and destroys the graph unrun, returning that message or "" when CUDA refused nothing; launch
// queues it on the device's stream; destroy frees it.
void cuda_graph_begin_capture(int device);
void* cuda_graph_end_capture(int device);
std::string cuda_graph_abort_capture(int device) noexcept;
void cuda_graph_launch(void* exec, int device);
void cuda_graph_destroy(void* exec) noexcept;

}  // namespace normtape::detail
