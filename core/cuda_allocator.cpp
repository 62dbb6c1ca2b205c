// core/cuda_allocator.cpp: the caching allocator described in core/cuda_allocator.h.
#include "core/cuda_allocator.h"

#include <algorithm>
#include <cstdlib>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include <nvtx3/nvToolsExtMemCudaRt.h>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/cuda_copy.h"
#include "core/dry_run.h"

namespace normtape::detail {

namespace {

constexpr size_t kRound = 512;
constexpr size_t kSmallRequest = size_t(1) << 20;   // at most this: small pool
constexpr size_t kSmallSegment = size_t(2) << 20;   // segment size of the small pool
constexpr size_t kMediumRequest = size_t(10) << 20; // below this: a shared 20 MiB segment
constexpr size_t kMediumSegment = size_t(20) << 20;
constexpr size_t kLargeRound = size_t(2) << 20;     // larger segments are rounded to this
constexpr size_t kLargeSplitMin = size_t(1) << 20;  // large blocks split only above this rest

struct Block {
    char* ptr;
    size_t size;           // bytes of the block
    bool small;            // in the small pool
    bool uncached = false; // its own cudaMalloc, freed at once (caching off)
    size_t requested = 0;  // bytes asked for while allocated
    bool allocated = false;
    uint64_t pool = 0;      // 0: the shared pools; else the CUDA graph pool its segment belongs to
    Block* prev = nullptr;  // neighbours within the same segment
    Block* next = nullptr;
};

struct BySize {
    bool operator()(const Block* a, const Block* b) const {
        return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
};

using FreeBlocks = std::set<Block*, BySize>;

// The segments of one CUDA graph's capture (Note [Graph pools], core/cuda_graph.h): their free
// blocks, and the shared pools' blocks released during the capture, held until the pool goes.
struct GraphPool {
    FreeBlocks small_free, large_free;
    std::vector<Block*> held;
};

struct DeviceAllocator {
    FreeBlocks small_free, large_free;
    std::unordered_map<uint64_t, GraphPool> graph_pools;
    uint64_t capturing = 0;  // the graph pool that allocations come from; 0: the shared pools
    std::unordered_map<void*, Block*> live;
    // Uncached blocks deallocated during a dry run, whose CUDA stream capture a cudaFree would
    // break: freed at the next allocation or empty_cache outside one.
    std::vector<Block*> deferred;
    MemoryStats stats;
    std::vector<MemoryEvent>* trace = nullptr;

    void record(int64_t delta_bytes) noexcept { append_memory_event(trace, stats, delta_bytes); }

    // Marks `b` allocated for a request of `nbytes` and counts it; returns its address.
    void* take(Block* b, size_t nbytes) {
        b->allocated = true;
        b->requested = nbytes;
        live[b->ptr] = b;
        stats.allocated_bytes += static_cast<int64_t>(nbytes);
        stats.peak_allocated_bytes = std::max(stats.peak_allocated_bytes, stats.allocated_bytes);
        stats.num_allocs += 1;
        record(static_cast<int64_t>(nbytes));
        return b->ptr;
    }

    FreeBlocks& pool(bool small) { return small ? small_free : large_free; }
    FreeBlocks& pool(uint64_t id, bool small) {
        if (id == 0) return pool(small);
        GraphPool& g = graph_pools.at(id);
        return small ? g.small_free : g.large_free;
    }
};

std::vector<DeviceAllocator>& allocators() {
    static std::vector<DeviceAllocator> a;
    return a;
}

DeviceAllocator& allocator(int device) {
    NT_CHECK_AS(DeviceError, device >= 0 && device < 1024, "cuda allocator: expected a device index in [0, 1024), got ",
                device);
    if (allocators().size() <= static_cast<size_t>(device)) allocators().resize(device + 1);
    return allocators()[device];
}

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// cudaFree waits for the device; the explicit wait makes that independent of the runtime's rules.
void release_free_segments(int device, DeviceAllocator& a) {
    CUDA_CHECK(cudaSetDevice(device));
    CUDA_CHECK(cudaDeviceSynchronize());
    for (bool small : {true, false}) {
        auto& pool = a.pool(small);
        for (auto it = pool.begin(); it != pool.end();) {
            Block* b = *it;
            if (b->prev || b->next) {  // part of a segment that is still partly in use
                ++it;
                continue;
            }
            CUDA_CHECK(cudaSetDevice(device));
            CUDA_CHECK(cudaFree(b->ptr));
            a.stats.reserved_bytes -= static_cast<int64_t>(b->size);
            it = pool.erase(it);
            delete b;
        }
    }
}

// `bytes` from cudaMalloc for a request of `nbytes`, counted as reserved. When the driver has no
// more, every wholly free segment is returned and the call tried once more; then OutOfMemoryError.
char* driver_allocate(int device, DeviceAllocator& a, size_t bytes, size_t nbytes, bool uncached) {
    void* ptr = nullptr;
    CUDA_CHECK(cudaSetDevice(device));
    cudaError_t err = cudaMalloc(&ptr, bytes);
    // During a graph's capture the cache cannot be given back (cudaFree waits for the device).
    if (err == cudaErrorMemoryAllocation && a.capturing == 0) {
        cudaGetLastError();  // clear it, give the cache back, try once more
        release_free_segments(device, a);
        err = cudaMalloc(&ptr, bytes);
    }
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        cudaGetLastError();
        NT_CHECK_AS(OutOfMemoryError, false, "allocate: out of memory on cuda:", device, ": tried to allocate ",
                    nbytes, " bytes (", uncached ? std::string("uncached") : "a segment of " + std::to_string(bytes),
                    "); ", a.stats.allocated_bytes, " bytes allocated, ", a.stats.reserved_bytes,
                    " reserved by normtape, ", free_bytes, " free of ", total_bytes, " on the device",
                    a.capturing != 0 ? " (during a CUDA graph's capture, which allocates from its own pool)" : "");
    }
    CUDA_CHECK(err);
    a.stats.reserved_bytes += static_cast<int64_t>(bytes);
    a.stats.peak_reserved_bytes = std::max(a.stats.peak_reserved_bytes, a.stats.reserved_bytes);
    return static_cast<char*>(ptr);
}

// Returns an uncached block to the driver once the device is done with it (cudaFree alone may not
// wait). A free that fails leaves its bytes counted as reserved; its error stays for the next check.
void free_uncached(int device, DeviceAllocator& a, Block* b) noexcept {
    (void)cudaSetDevice(device);
    (void)cudaDeviceSynchronize();
    if (cudaFree(b->ptr) == cudaSuccess) a.stats.reserved_bytes -= static_cast<int64_t>(b->size);
    delete b;
}

void free_deferred(int device, DeviceAllocator& a) noexcept {
    if (a.deferred.empty() || is_dry_run()) return;
    for (Block* b : a.deferred) free_uncached(device, a, b);
    a.deferred.clear();
}

bool& caching_on() {
    static bool on = cuda_memory_caching_setting(std::getenv("NORMTAPE_NO_CUDA_MEMORY_CACHING"));
    return on;
}

// Puts the free block `b` back into its pool, merged with its segment's free neighbours.
void return_to_pool(DeviceAllocator& a, Block* b) noexcept {
    auto& pool = a.pool(b->pool, b->small);
    if (b->prev && !b->prev->allocated) {  // merge into the free block before
        Block* p = b->prev;
        pool.erase(p);
        p->size += b->size;
        p->next = b->next;
        if (b->next) b->next->prev = p;
        delete b;
        b = p;
    }
    if (b->next && !b->next->allocated) {  // absorb the free block after
        Block* n = b->next;
        pool.erase(n);
        b->size += n->size;
        b->next = n->next;
        if (n->next) n->next->prev = b;
        delete n;
    }
    pool.insert(b);
}

}  // namespace

bool cuda_memory_caching() { return caching_on(); }

void set_cuda_memory_caching(bool on) { caching_on() = on; }

void cuda_mark_written(int device, const void* p, int64_t bytes, int64_t count, int64_t stride) {
    // Inside a dry run nothing is written: its kernels are captured, never run.
    if (caching_on() || is_dry_run() || count <= 0 || bytes <= 0) return;
    static const nvtxDomainHandle_t domain = nvtxDomainCreateA("normtape");
    std::vector<nvtxMemVirtualRangeDesc_t> ranges(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i)
        ranges[size_t(i)] = {static_cast<size_t>(bytes), static_cast<const char*>(p) + i * stride};
    nvtxMemMarkInitializedBatch_t batch{};
    batch.extCompatID = NVTX_EXT_COMPATID_MEM;
    batch.structSize = sizeof(batch);
    batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
    batch.regionDescCount = ranges.size();
    batch.regionDescElementSize = sizeof(nvtxMemVirtualRangeDesc_t);
    batch.regionDescElements = ranges.data();
    nvtxMemCudaMarkInitialized(domain, cuda::stream(device), 0, &batch);
}

void* cuda_allocate(int device, size_t nbytes) {
    DeviceAllocator& a = allocator(device);
    NT_CHECK_AS(OutOfMemoryError, nbytes <= (size_t(1) << 50), "allocate: out of memory on cuda:", device,
                ": requested ", nbytes, " bytes, more than any GPU holds (at most 2^50 bytes)");
    free_deferred(device, a);
    if (!caching_on())
        return a.take(new Block{driver_allocate(device, a, nbytes, nbytes, true), nbytes, false, true}, nbytes);
    size_t size = round_up(std::max<size_t>(nbytes, 1), kRound);
    bool small = size <= kSmallRequest;
    auto& pool = a.pool(a.capturing, small);
    Block key{nullptr, size, small};
    auto it = pool.lower_bound(&key);
    Block* b;
    if (it != pool.end()) {
        b = *it;
        pool.erase(it);
    } else {
        size_t segment = small ? kSmallSegment : size < kMediumRequest ? kMediumSegment : round_up(size, kLargeRound);
        b = new Block{driver_allocate(device, a, segment, nbytes, false), segment, small};
        b->pool = a.capturing;
    }
    size_t rest = b->size - size;
    if (small ? rest >= kRound : rest > kLargeSplitMin) {
        Block* r = new Block{b->ptr + size, rest, small};
        r->pool = b->pool;
        r->prev = b;
        r->next = b->next;
        if (b->next) b->next->prev = r;
        b->next = r;
        b->size = size;
        pool.insert(r);
    }
    return a.take(b, nbytes);
}

void cuda_deallocate(int device, void* ptr) noexcept {
    DeviceAllocator& a = allocators()[device];
    auto it = a.live.find(ptr);
    if (it == a.live.end()) return;  // not ours: nothing to do (never happens through Storage)
    Block* b = it->second;
    a.live.erase(it);
    a.stats.allocated_bytes -= static_cast<int64_t>(b->requested);
    a.record(-static_cast<int64_t>(b->requested));
    b->allocated = false;
    b->requested = 0;
    if (b->uncached) {
        if (!is_dry_run()) {
            free_uncached(device, a, b);
            return;
        }
        try {
            a.deferred.push_back(b);
        } catch (...) {
            // No host memory for the list: the block stays allocated on the device, counted as reserved.
            delete b;
        }
        return;
    }
    if (a.capturing != 0 && b->pool != a.capturing) {
        // A block from outside the capture that the captured work may still read on a replay: out
        // of every pool until the graph's pool goes (marked allocated, so that no neighbour merges it).
        b->allocated = true;
        try {
            a.graph_pools.at(a.capturing).held.push_back(b);
        } catch (...) {
            // No host memory for the list: the block stays out of every pool, counted as reserved.
        }
        return;
    }
    return_to_pool(a, b);
}

void cuda_begin_graph_pool(int device, uint64_t id) {
    DeviceAllocator& a = allocator(device);
    NT_CHECK(id != 0 && a.capturing == 0 && !a.graph_pools.count(id), "cuda allocator: expected a new graph pool "
             "id > 0 and no capture in progress on cuda:", device, ", got id ", id,
             a.graph_pools.count(id) ? " (in use)" : "", " with pool ", a.capturing, " capturing (0: none)");
    a.graph_pools[id];
    a.capturing = id;
}

void cuda_end_graph_pool(int device) { allocator(device).capturing = 0; }

void cuda_release_graph_pool(int device, uint64_t id) noexcept {
    if (allocators().size() <= static_cast<size_t>(device)) return;
    DeviceAllocator& a = allocators()[device];
    auto it = a.graph_pools.find(id);
    if (it == a.graph_pools.end()) return;
    if (a.capturing == id) a.capturing = 0;
    GraphPool pool = std::move(it->second);
    a.graph_pools.erase(it);
    // The pool's segments join the shared pools: free blocks move, live ones are retagged.
    for (FreeBlocks* blocks : {&pool.small_free, &pool.large_free})
        for (Block* b : *blocks) {
            b->pool = 0;
            a.pool(b->small).insert(b);
        }
    for (auto& [ptr, b] : a.live)
        if (b->pool == id) b->pool = 0;
    for (auto& entry : a.graph_pools)  // its blocks that another graph's capture released
        for (Block* b : entry.second.held)
            if (b->pool == id) b->pool = 0;
    for (Block* b : pool.held) {
        b->allocated = false;
        return_to_pool(a, b);
    }
}

MemoryStats cuda_memory_stats(int device) { return allocator(device).stats; }

int64_t cuda_available_bytes(int device) {
    CUDA_CHECK(cudaSetDevice(device));
    size_t free_bytes = 0, total_bytes = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const MemoryStats& s = allocator(device).stats;
    return static_cast<int64_t>(free_bytes) + s.reserved_bytes - s.allocated_bytes;
}

void cuda_reset_peak_memory_stats(int device) {
    MemoryStats& s = allocator(device).stats;
    s.peak_allocated_bytes = s.allocated_bytes;
    s.peak_reserved_bytes = s.reserved_bytes;
}

void cuda_set_memory_trace(int device, std::vector<MemoryEvent>* trace) { allocator(device).trace = trace; }

void cuda_empty_cache(int device) {
    free_deferred(device, allocator(device));
    release_free_segments(device, allocator(device));
}

namespace {

std::unordered_map<size_t, std::vector<void*>>& host_cache() {  // exact size -> free pinned blocks
    static std::unordered_map<size_t, std::vector<void*>> cache;
    return cache;
}

}  // namespace

void* cuda_host_allocate(size_t nbytes) {
    auto it = host_cache().find(nbytes);
    if (it != host_cache().end() && !it->second.empty()) {
        void* ptr = it->second.back();
        it->second.pop_back();
        return ptr;
    }
    void* ptr = nullptr;
    cudaError_t err = cudaHostAlloc(&ptr, nbytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // clear it, give the cache back, try once more
        cuda_host_empty_cache();
        err = cudaHostAlloc(&ptr, nbytes, cudaHostAllocPortable);
    }
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        NT_CHECK_AS(OutOfMemoryError, false, "cudaHostAlloc could not pin ", nbytes, " bytes of host memory");
    }
    CUDA_CHECK(err);
    return ptr;
}

void cuda_host_deallocate(void* ptr, size_t nbytes) noexcept {
    try {
        host_cache()[nbytes].push_back(ptr);
    } catch (...) {
        // No host memory for the cache's bookkeeping: keep the block pinned and unused (freeing it
        // here could race a copy still queued on a side stream).
    }
}

void cuda_host_empty_cache() {
    bool any = false;
    for (const auto& [size, blocks] : host_cache()) any = any || !blocks.empty();
    if (!any) return;
    cuda_side_streams_synchronize();  // a queued copy may still read or write a cached block
    for (auto& [size, blocks] : host_cache()) {
        while (!blocks.empty()) {
            CUDA_CHECK(cudaFreeHost(blocks.back()));
            blocks.pop_back();
        }
    }
    host_cache().clear();
}

}  // namespace normtape::detail
