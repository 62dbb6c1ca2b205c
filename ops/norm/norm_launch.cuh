// ops/norm/norm_launch.cuh: how the fast norm kernels are launched: the shapes a kernel is compiled for
// (Shape, Budget), the choice of threads per row for a row length (fast_layout), the dispatch of a
// runtime shape to its compiled kernel (with_shape), and the grid: launch configurations with
// thread-block clusters, the blocks that fit on the GPU at once, the grid size, and the limits of
// a device. Host code, included by ops/norm/norm_forward.cu and ops/norm/norm_backward.cu. Internal. Not
// here: the budgets themselves (each kernel's file, beside the kernel they are tuned for), the
// kernels, the device helpers (ops/norm/norm_rows.cuh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "ops/cuda_common.cuh"

namespace normtape::detail::norm {

// How the fast kernels spread a row over threads. A Shape is the number of 16-byte vectors of a
// row a thread holds (vecs), the largest block its kernel is compiled for (max_block, its
// __launch_bounds__: at most 64 registers a thread at 1024 threads, 128 at 512), the most
// threads a row may take with it, whether the forward loads a group's next row ahead
// (next_row), whether the kernel reads the weight and bias from shared memory (shared_affine),
// how many rows a group of the forward takes before its block retires (rows_per_group), and how
// many blocks of a thread-block cluster share a row of the backward (cluster). A Budget lists the
// shapes to choose from (forward_budget in ops/norm/norm_forward.cu, backward_budget in
// ops/norm/norm_backward.cu), which fast_layout turns into threads per row. The budgets were chosen with
// examples/bench/bench_norms.cpp (docs/PERFORMANCE.md).
struct Shape {
    int vecs, max_block, max_row_threads;
    bool next_row;       // forward: the group's next row is loaded into registers before this row's reduction
    bool shared_affine;  // the weight and bias are read from shared memory, copied there once per block
    int rows_per_group;  // forward: rows a group takes before its block retires (0: the backward's persistent blocks)
    int cluster;         // backward: blocks of a thread-block cluster that share a row, each holding a slice of it
};
struct Budget {
    Shape shapes[4];
    int count;
};

constexpr int kRowsThreads = 256;  // a block holds as many rows as fit in this many threads, one at least

// How a row is spread over threads: the budget's shape, or -1 where the fast kernels do not apply.
struct FastLayout {
    int shape = -1, threads_per_row = 0, block = 0, cluster = 1;  // threads_per_row: of one block's slice
};

// Threads per row: a multiple of 32, at most the shape's max_row_threads, each with at most the
// shape's vectors of the row; of the budget's shapes, the one that leaves the fewest vector slots
// idle, the earlier on a tie. A block holds as many rows as fit in kRowsThreads threads (at
// most 4 rows of several warps: row_barrier's named barriers). A shape of cluster > 1 splits the
// row into that many equal slices, one a block (threads_per_row is then a slice's); it is taken
// only where `clusters` (DeviceLimits) and no single-block shape before it holds the row.
template <class T>
FastLayout fast_layout(const Budget& budget, int64_t N, std::initializer_list<const void*> ptrs,
                       bool clusters = false) {
    static_assert(kRowsThreads / 64 <= 4);
    FastLayout l;
    constexpr int E = Pack<T>::E;
    if (std::is_same_v<T, double> || N % E != 0) return l;
    for (const void* p : ptrs)
        if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return l;
    const int64_t vecs_per_row = N / E;
    int64_t best_idle = -1;
    for (int i = 0; i < budget.count; ++i) {
        const Shape& shape = budget.shapes[i];
        if (shape.cluster > 1 && (!clusters || best_idle >= 0 || vecs_per_row % shape.cluster != 0)) continue;
        const int64_t vecs = vecs_per_row / shape.cluster;  // of a block's slice of the row
        int64_t threads = (vecs + shape.vecs - 1) / shape.vecs;
        threads = (threads + 31) / 32 * 32;
        if (threads > shape.max_row_threads) continue;
        int64_t idle = ((vecs + threads - 1) / threads * threads - vecs) * shape.cluster;
        if (best_idle >= 0 && idle >= best_idle) continue;
        best_idle = idle;
        l.shape = i;
        l.cluster = shape.cluster;
        l.threads_per_row = static_cast<int>(threads);
        l.block = l.threads_per_row * std::max(1, kRowsThreads / l.threads_per_row);
    }
    return l;
}

// run(std::integral_constant<int, shape>()) for 0 <= shape < 4, and what it returns; false for other shapes.
template <class Run, int... I>
bool with_shape(int shape, Run& run, std::integer_sequence<int, I...>) {
    bool done = false;
    ((void)(shape == I && (done = run(std::integral_constant<int, I>()))), ...);
    return done;
}
template <class Run>
bool with_shape(int shape, Run run) {
    return with_shape(shape, run, std::make_integer_sequence<int, 4>());
}

// The launch configuration of `block` threads and `shared` bytes of dynamic shared memory a block,
// in clusters of `cluster` blocks where cluster > 1. `attribute` holds the cluster's size.
inline cudaLaunchConfig_t launch_config(dim3 grid, int block, size_t shared, int cluster, cudaStream_t stream,
                                        cudaLaunchAttribute& attribute) {
    cudaLaunchConfig_t config{};
    config.gridDim = grid, config.blockDim = dim3(block), config.dynamicSmemBytes = shared, config.stream = stream;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = cluster, attribute.val.clusterDim.y = 1, attribute.val.clusterDim.z = 1;
    config.attrs = &attribute, config.numAttrs = cluster > 1 ? 1 : 0;
    return config;
}

// Blocks of `kernel` that fit on the GPU at once (in whole clusters of `cluster` blocks). The
// occupancy query is asked once per kernel, block, shared size, cluster and device.
template <class Kernel>
int64_t resident_blocks(Kernel kernel, int block, size_t shared_bytes, int device, int cluster = 1) {
    struct Key {
        const void* kernel;
        int block;
        size_t shared;
        int device, cluster;
        bool operator==(const Key& o) const {
            return kernel == o.kernel && block == o.block && shared == o.shared && device == o.device &&
                   cluster == o.cluster;
        }
    };
    static std::mutex mutex;
    static std::vector<std::pair<Key, int64_t>> resident;
    const Key key{reinterpret_cast<const void*>(kernel), block, shared_bytes, device, cluster};
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [k, n] : resident)
        if (k == key) return n;
    int64_t blocks = 0;
    if (cluster == 1) {
        int per_sm = 0, sms = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, shared_bytes));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        blocks = int64_t(std::max(per_sm, 1)) * sms;
    } else {
        cudaLaunchAttribute attribute;
        cudaLaunchConfig_t config = launch_config(dim3(cluster), block, shared_bytes, cluster, nullptr, attribute);
        int n = 0;
        CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &config));
        blocks = int64_t(std::max(n, 1)) * cluster;
    }
    resident.push_back({key, blocks});
    return blocks;
}

// The grid for `rows` rows, `rows_per_block` a sweep of a block: a block per sweep, but at most
// `most` blocks (the kernels walk the rows gridDim.x * rows_per_block apart, so fewer blocks
// cover them all), at least 1, and within CUDA's 2^31 - 1.
inline unsigned grid_size(int64_t rows, int64_t rows_per_block, int64_t most) {
    int64_t sweeps = (rows + rows_per_block - 1) / rows_per_block;
    return static_cast<unsigned>(std::clamp<int64_t>(std::min(sweeps, most), 1, (int64_t(1) << 31) - 1));
}

// What the backward needs to know of a device, asked once per device: the shared memory a block
// may opt in to (bytes), and whether rows may be split over thread-block clusters, which needs a
// device that launches them (sm_90 and later) running the kernels from code built for sm_90 or
// later (a build for an earlier architecture, run through its PTX, has no cluster code and would
// trap). `probe` is one of the kernels, whose PTX version tells which code runs.
struct DeviceLimits {
    int shared_optin = 0;
    bool clusters = false;
};
inline DeviceLimits device_limits(int device, const void* probe) {
    static std::mutex mutex;
    static std::vector<std::pair<int, DeviceLimits>> known;
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [d, limits] : known)
        if (d == device) return limits;
    (void)cuda::stream(device);  // makes `device` current for the kernel's attributes
    DeviceLimits limits;
    int launch = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&limits.shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&launch, cudaDevAttrClusterLaunch, device));
    cudaFuncAttributes attributes{};
    CUDA_CHECK(cudaFuncGetAttributes(&attributes, probe));
    limits.clusters = launch != 0 && attributes.ptxVersion >= 90;
    known.push_back({device, limits});
    return limits;
}

}  // namespace normtape::detail::norm
