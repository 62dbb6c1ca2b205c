// core/cuda_graph.h: work on a GPU captured once into a CUDA graph and replayed, with no host work
// and no launch gaps between its kernels (torch.cuda.CUDAGraph's capture and replay).
//
// Note [CUDA graphs]
// capture(device, fn) runs fn() once while the device's stream is captured (cudaStreamBeginCapture,
// relaxed mode): fn's host code runs as usual (the engine, the optimizers' bookkeeping, the
// allocator), but its kernels, cuBLAS products, cuDNN graphs, copies and memsets within the
// device are recorded, not run. replay() runs what was recorded, on the same stream, ordered with
// the work queued before and after it, reading and writing the same addresses each time.
// So between replays:
//   - inputs change by writing into tensors that fn read (copy_ into them), never by new tensors;
//   - outputs are the tensors fn made and the caller kept; each replay writes them again;
//   - a value fn passed to a kernel from the host (a learning rate, a step count, a dropout seed
//     and offset) is frozen: what must change between replays is read from device memory. AdamW
//     and Muon read their learning rate and step count there (set_lr writes it, outside fn);
//     dropout's masks would repeat, so fn should not draw random numbers.
// What cannot be captured makes capture throw Error, naming what CUDA refused: a host read of a
// device value (item(), to_vector(), a copy to the host), a wait for the device or another stream
// (SaveOnCpu's copies: offload), a collective. fn's first run of a kernel may do such things
// (AdamW's table, cuDNN's plans, cuBLAS's heuristics), so run fn once before capturing it. The
// ops' checks of values are not made during a capture, as in a dry run (core/dry_run.h): embedding's
// and cross_entropy's ids are not checked to be in range (the caller checks what it copies into
// the inputs), and a norm under SavePolicy::Output does not fall back to Input for weights near 0
// (Note [Weights near zero under SavePolicy::Output]). linear_cross_entropy, which counts its
// targets on the host, throws Error during a capture.
//
// Note [Graph pools]
// Memory fn allocates comes from a pool of the graph's own (cudaMalloc'd during the capture; the
// caching allocator must be on): every replay uses those addresses again, so no other tensor may
// take them while the graph lives. Its blocks freed during fn are reused within fn, as in an eager
// run, and those fn leaves alive go back to that pool when the caller drops them. The statistics
// count fn's allocations and releases as an eager run's (allocated and peak bytes are the same;
// reserved bytes include the pool's segments, held until the graph goes); a replay allocates
// nothing and changes no counter. Memory from before the capture that fn releases may still be
// read by a replay, so it is held out of every pool until the graph goes too. Tensors fn reads that
// were made before the capture must stay alive while the graph is replayed (the caller's duty).
#pragma once

#include <cstdint>
#include <functional>

#include "core/device.h"

namespace normtape {

// A captured CUDA graph (Note [CUDA graphs]). Not copyable; one capture per object (reset() to
// capture again). Single-threaded, like the rest of the library.
class CUDAGraph {
public:
    CUDAGraph() = default;
    // Waits for the device, then frees the graph and its pool (reset()).
    ~CUDAGraph();
    CUDAGraph(const CUDAGraph&) = delete;
    CUDAGraph& operator=(const CUDAGraph&) = delete;

    // Captures fn() on `device`'s stream (Note [CUDA graphs]), allocating from the graph's pool
    // (Note [Graph pools]). Waits for the device and returns the shared pools' free segments to
    // the driver first (empty_cache), so that the graph's pool does not hold a second copy of what
    // an eager run of fn left cached. Throws DeviceError for a device that is not
    // CUDA or a build or machine without a GPU; Error inside a dry run, during another capture,
    // when this graph holds a capture already, with the caching allocator off
    // (NORMTAPE_NO_CUDA_MEMORY_CACHING=1), or when CUDA refused a call during the capture (naming
    // CUDA's reason); whatever fn throws. When it throws, nothing is captured and the pool is gone.
    void capture(Device device, const std::function<void()>& fn);
    // Queues the captured work on the device's stream and returns without waiting. Throws Error when
    // nothing is captured or inside a dry run; Error naming CUDA's reason when the launch fails.
    void replay();
    // Waits for the device, then drops the capture and returns its pool's memory to the allocator.
    // Tensors made by the capture and still held stay valid; no replay writes them anymore. Throws
    // Error when the wait reports a CUDA error (the capture is dropped all the same).
    void reset();
    bool captured() const { return exec_ != nullptr; }
    Device device() const { return device_; }

private:
    Device device_ = Device::CPU;
    void* exec_ = nullptr;  // cudaGraphExec_t
    uint64_t pool_ = 0;
};

namespace detail {
// True while CUDAGraph::capture runs its function: the checks that read a device value on the
// host (ids in range: ops/checks.h; a norm weight's size under SavePolicy::Output) are not made.
bool cuda_graph_capturing();
}  // namespace detail

}  // namespace normtape
