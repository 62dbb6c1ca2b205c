// core/cuda_graph.cpp: CUDAGraph (Note [CUDA graphs], core/cuda_graph.h) over the capture calls and
// the graph pools of core/cuda_allocator.h.
#include "core/cuda_graph.h"

#include <exception>
#include <string>

#include "core/allocator.h"
#include "core/check.h"
#include "core/cuda_allocator.h"
#include "core/dry_run.h"

namespace normtape {

namespace {
bool capturing = false;  // a CUDAGraph capture is in progress (the library is single-threaded)
uint64_t pools = 0;      // graph pools made so far: the next one's id is pools + 1
}  // namespace

bool detail::cuda_graph_capturing() { return capturing; }

CUDAGraph::~CUDAGraph() {
    try {
        reset();
    } catch (...) {  // a failed wait: the device's error stays for the next call that checks
    }
}

void CUDAGraph::capture(Device device, const std::function<void()>& fn) {
    NT_CHECK_AS(DeviceError, device.is_cuda(), "CUDAGraph::capture: expected a CUDA device, got ", device_name(device));
    NT_CHECK_AS(DeviceError, cuda_is_available(), "CUDAGraph::capture: expected a visible GPU for ", device_name(device),
                ", got ", cuda_is_built() ? "none" : "a build without the CUDA backend");
    NT_CHECK(!is_dry_run(), "CUDAGraph::capture: expected to run outside a dry run, got one in progress");
    NT_CHECK(!capturing, "CUDAGraph::capture: expected no other capture in progress, got one");
    NT_CHECK(!captured(), "CUDAGraph::capture: expected an empty graph, got one holding a capture (reset() it first)");
    NT_CHECK(detail::cuda_memory_caching(), "CUDAGraph::capture: expected the caching allocator on, got "
             "NORMTAPE_NO_CUDA_MEMORY_CACHING=1 (a graph replays its allocations' addresses)");
    synchronize(device);
    empty_cache(device);  // the pool takes the memory that the shared pools cached for an eager run
    const uint64_t pool = ++pools;
    detail::cuda_begin_graph_pool(device.index, pool);
    capturing = true;
    auto give_up = [&] {  // nothing captured: the pool's blocks go back to the shared pools
        capturing = false;
        detail::cuda_release_graph_pool(device.index, pool);
    };
    try {
        detail::cuda_graph_begin_capture(device.index);
    } catch (...) {
        give_up();
        throw;
    }
    std::exception_ptr failed;
    try {
        fn();
    } catch (...) {
        failed = std::current_exception();
    }
    if (failed) {
        // When fn's error broke the capture, CUDA's refusal says why; else fn's error is rethrown.
        const std::string refused = detail::cuda_graph_abort_capture(device.index);
        give_up();
        if (refused.empty()) std::rethrow_exception(failed);
        std::string what = "an exception not derived from std::exception";
        try {
            std::rethrow_exception(failed);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        detail::throw_error<Error>(refused, "; what failed: ", what);
    }
    void* exec = nullptr;
    try {
        exec = detail::cuda_graph_end_capture(device.index);
    } catch (...) {
        give_up();
        throw;
    }
    capturing = false;
    detail::cuda_end_graph_pool(device.index);
    device_ = device;
    exec_ = exec;
    pool_ = pool;
}

void CUDAGraph::replay() {
    NT_CHECK(captured(), "CUDAGraph::replay: expected a captured graph, got an empty one");
    NT_CHECK(!is_dry_run(), "CUDAGraph::replay: expected to run outside a dry run, got one in progress");
    detail::cuda_graph_launch(exec_, device_.index);
}

void CUDAGraph::reset() {
    if (!captured()) return;
    std::exception_ptr failed;
    try {
        synchronize(device_);  // no replay may still use the pool's memory
    } catch (...) {            // the device failed: release all the same, then say so
        failed = std::current_exception();
    }
    detail::cuda_graph_destroy(exec_);
    detail::cuda_release_graph_pool(device_.index, pool_);
    exec_ = nullptr;
    pool_ = 0;
    if (failed) std::rethrow_exception(failed);
}

}  // namespace normtape
