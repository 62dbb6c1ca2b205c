// core/dry_run.h: running code without computing it, to know its memory before it runs.
//
// Note [The dry run]
// Inside dry_run(device, fn), every tensor is made as usual (shape, strides, dtype, device,
// autograd fields) over a Storage of N bytes that holds no memory: the allocator counts the bytes
// (allocated, peak, the timeline) on counters of the dry run's own, which start at zero, and
// hands out an address that is never read or written. Ops run their checks, allocate their outputs
// and temporaries in the same sizes and order, make their nodes and save what their policy saves,
// exactly as on the real path; only the computation is skipped:
//   - on the cpu, a kernel runs inside dispatch_floating / dispatch_all (core/dispatch.h), which
//     check the dtype and return without calling it; the few loops outside one (a cpu product's
//     blocks, copies, fills, the factories' values) ask is_dry_run() themselves;
//   - on CUDA, the launchers run, allocating their own temporaries (a reduction's partial sums,
//     the embedding's sort buffers, cuDNN's workspace), while the device's stream is captured into
//     a CUDA graph (cudaStreamBeginCapture, relaxed mode) that is destroyed without ever running:
//     the kernels, cuBLAS's products and cuDNN's graphs are recorded, never executed, and nothing
//     is allocated on the GPU. Copies and memsets within the device are skipped instead, since
//     CUDA checks their addresses when it records them. The plans that decide a workspace (cuDNN's,
//     cuBLASLt's heuristics) are asked of the device, as a real run asks them; so a CUDA dry run
//     needs the GPU visible.
// The autograd engine, hooks, checkpoint(), SaveOnCpu, the optimizers and DataParallel (over a
// stand-in process group, core/distributed.h) run their host logic unchanged, so the peak of a
// dry run is the peak of the real run: the same allocations, released where the real ones are.
// One exception: SaveOnCpu's copies on CUDA run on a side stream that the capture does not see and
// that no dry run can time; they are not made, and their sources are kept as if no copy finished,
// so under offload on CUDA the dry run's peak is a bound of the real one.
// A host read of a value returns a placeholder: item() gives 0 (so a gradient norm is finite and
// an optimizer steps, the path that allocates), to_vector() zeros, a copy between devices
// nothing; Tensor::data_ptr() throws, since a dry tensor has no data to point to. Code whose
// allocations depend on values (sampling a length from a tensor) sees the placeholders.
// fn should build what it runs: an optimizer or model made outside and stepped inside is changed
// by the dry run (its step count, its gradients, which hold no data). Dropout's Philox offset is
// restored when the run ends and randn draws nothing, but a manual_seed inside fn stays.
// What cannot be dry-run: a kernel that is not behind dispatch_* or is_dry_run() on the cpu (its
// data_ptr() throws, naming the dry run); a cpu kernel inside a CUDA dry run (same); a CUDA call
// that waits for the device or another stream (a synchronizing copy, an event query) inside a
// CUDA dry run, which CUDA refuses during a capture (Error, naming the call); a collective of a
// real process group (Error); a CUDA dry run without a visible GPU (DeviceError); a tensor
// allocated on another device than the dry run's (DeviceError), except cpu tensors in a CUDA dry
// run. After the run a dry tensor keeps its placeholders, and a kernel given one throws.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"

namespace normtape {

// What a dry run saw on its device's counters: the counters at its end (allocated_bytes of what
// fn left alive, peak_allocated_bytes over the whole run, in bytes; reserved_bytes 0, since nothing
// is held from a driver), and the timeline: one MemoryEvent per allocation and release, in order,
// with the module scope and the backward node that made it (core/allocator.h), as
// set_memory_trace records a real run.
struct DryRunResult {
    Device device;
    MemoryStats stats;
    std::vector<MemoryEvent> timeline;
};

// Runs fn() as a dry run on `device` (Note [The dry run]) and returns what the allocator counted
// for `device` over it. fn builds what it needs (model, optimizer, batch) and runs its steps:
// forward, loss, backward, optimizer step; inside, memory_stats(device), reset_peak_memory_stats
// and set_memory_trace act on the dry run's counters, so code that measures itself measures its
// dry run. Tensors fn leaves alive outside it stay dry: their bytes count on no counter once the
// dry run ends, item() and to_vector() give placeholders, and a kernel given one throws. Not
// reentrant: a dry run inside a dry run throws Error. Throws DeviceError for a CUDA device in a
// build without CUDA or with no GPU visible, and when fn allocates on a device other than
// `device` (cpu tensors aside in a CUDA dry run); whatever fn throws, after ending the dry run (a
// CUDA call refused during the capture is an Error naming it).
DryRunResult dry_run(Device device, const std::function<void()>& fn);

// True while a dry run is in progress (on this process: the library is single-threaded).
bool is_dry_run();

namespace detail {
// The dry run's allocator (called by Storage): counts nbytes on its counters for `device` and
// returns an address that is never dereferenced (256-byte aligned, distinct for every live block);
// nbytes == 0 gives nullptr. Throws DeviceError for a device the dry run does not cover.
void* dry_allocate(Device device, size_t nbytes);
// Releases bytes that dry run `id` counted: on its counters while it lasts, on none after it.
void dry_deallocate(uint64_t id, Device device, size_t nbytes) noexcept;
// The number of the dry run in progress (1, 2, ... in order), 0 outside one.
uint64_t dry_run_id();
// The dry run's counters and trace for `device`, in place of the allocator's (core/allocator.h).
MemoryStats dry_memory_stats(Device device);
void dry_reset_peak_memory_stats(Device device);
void dry_set_memory_trace(Device device, std::vector<MemoryEvent>* trace);
// Whether dispatch_floating / dispatch_all skip their kernel: in a dry run that is not capturing a
// CUDA stream (on CUDA the launchers run, recorded into the capture).
bool dry_run_skips_kernels();
}  // namespace detail

}  // namespace normtape
