// examples/bench/bench_ops.cpp: the bandwidth-bound ops of a GPT step on a GPU (cross-entropy, gelu, add,
// linear's bias), as effective bandwidth against a device-to-device copy timed in the same run.
//
// At the GPT preset's shapes (B*T = 16384 rows; --quick: 1024), in bf16 and f32:
//   cross_entropy  [16384, 32768] and [16384, 256]: the kernels (cross_entropy_forward_cuda: the
//                  row kernel and the mean over rows; cross_entropy_backward_cuda into a separate
//                  dlogits, and in place, dlogits = logits, as the node runs when nothing else holds
//                  the logits); and the op as a caller meets it: cross_entropy() under NoGradGuard
//                  (it copies the targets to the host to check them, waiting on the GPU) and its
//                  node's apply()
//   gelu           [16384, 4096]: gelu() under NoGradGuard; its node's apply() (dx from dy and x)
//   add            [16384, 1024] + [16384, 1024] (its backward passes the gradient through: no kernel)
//   add bias       [16384, 4096] + [4096]; its node's apply(): the bias gradient, a column sum over
//                  the rows, the same kernel as linear's bias gradient (column_sum_cuda)
//   linear bias    out[r, :] += bias, [16384, 4096] (add_bias_rows_cuda, linear's forward without
//                  cuBLASLt)
//   head loss      lm_head and cross-entropy, forward and backward, [16384, 1024] @ [32768, 1024]^T:
//                  linear + cross_entropy against linear_cross_entropy at several chunk sizes (ms
//                  only: product-bound)
// A node's apply() is called directly, under NoGradGuard, on a node recorded once: it times the
// backward's own work, without the engine's copy of a leaf's first gradient.
// Each case is timed with CUDA events on normtape's stream: 3 warm-up runs, then 20 runs queued
// back to back behind a host wait of 2 ms a run (so that each starts as the one before ends, even
// for runs of microseconds), each between its own pair of events, and their median. Effective
// bandwidth = bytes that must move / time: cross_entropy forward the logits in; backward the logits
// in and dlogits out; gelu forward x in, y out; backward x and dy in, dx out; add a and b in, out
// out; add bias and linear bias the [rows, N] array in and out; bias gradient the array in (the
// targets, log-sum-exps, bias and bias gradient, at most 8 bytes a row or column, are not
// counted). copy = a cudaMemcpyAsync of the same array: its bytes read + written / time; "% copy"
// divides the two. The [16384, 32768] arrays (1 or 2 GiB) are far larger than the L2 cache; the
// [16384, 256] ones (8 or 16 MiB) are not, and their runs of a few microseconds are as much launch
// as transfer.
//
//   bench_ops [--quick] [--head-loss] [--dtype bf16|f32...] [--json FILE]
//   --quick: 1024 rows instead of 16384 (a smoke test; CI compiles this program, it has no GPU)
//   --head-loss: only the head loss's rows
// Exit status: 0 done, 2 a bad flag or no GPU, 1 an error while measuring.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "bench_timing.h"
#include "normtape.h"
#include "ops/cuda_launchers.h"

using namespace normtape;

namespace {

struct Row {
    std::string op, dtype, shape;
    double ms, gbps, pct_copy;
};

using detail::device_ptr;

// The rows of one dtype. `copy_gbps` caches the copy's bandwidth per array size in bytes.
class Bench {
public:
    Bench(std::string dtype, std::vector<Row>& rows) : dtype_(std::move(dtype)), rows_(rows) {}

    // Times a device-to-device copy of `bytes` (once per size; its row named after `shape`, the
    // first array of that size) and returns its GB/s, read + written.
    double copy_gbps(int64_t bytes, const std::string& shape) {
        auto it = copy_.find(bytes);
        if (it != copy_.end()) return it->second;
        TensorOptions o = TensorOptions().dtype(DType::I64).device(Device::CUDA);
        Tensor from = empty({(bytes + 7) / 8}, o), to = empty({(bytes + 7) / 8}, o);
        const double ms = time_ms([&] {
            CUDA_CHECK(cudaMemcpyAsync(device_ptr<char>(to), device_ptr<char>(from), static_cast<size_t>(bytes),
                                       cudaMemcpyDeviceToDevice, cuda::stream(0)));
        });
        const double gbps = 2.0 * static_cast<double>(bytes) / ms / 1e6;
        rows_.push_back({"copy", dtype_, shape, ms, gbps, 100.0});
        return copy_[bytes] = gbps;
    }

    // Times `fn`, which moves `moved` bytes over an array of `array_bytes`, and adds its row.
    void add(const std::string& op, const std::string& shape, int64_t array_bytes, double moved,
             const std::function<void()>& fn) {
        const double copy = copy_gbps(array_bytes, shape);
        const double ms = time_ms(fn);
        const double gbps = moved / ms / 1e6;
        rows_.push_back({op, dtype_, shape, ms, gbps, 100.0 * gbps / copy});
    }

private:
    std::string dtype_;
    std::vector<Row>& rows_;
    std::map<int64_t, double> copy_;
};

std::string shape_of(int64_t rows, int64_t n) { return "[" + std::to_string(rows) + ", " + std::to_string(n) + "]"; }

// Targets (i * 7919 + 13) mod V, i64 on the GPU.
Tensor targets_for(int64_t M, int64_t V) {
    std::vector<int64_t> t(M);
    for (int64_t i = 0; i < M; ++i) t[i] = (i * 7919 + 13) % V;
    return from_vector<int64_t>(t, {M}).to(Device::CUDA);
}

template <class T>
void bench_cross_entropy(Bench& b, int64_t M, int64_t V) {
    TensorOptions o = TensorOptions().dtype(dtype_of<T>()).device(Device::CUDA);
    const int64_t bytes = M * V * static_cast<int64_t>(sizeof(T));
    const std::string shape = shape_of(M, V);
    Tensor logits = scale(randn({M, V}, o), 2.0), dlogits = empty({M, V}, o), targets = targets_for(M, V);
    Tensor loss = empty({}, o), lse = empty({M}, TensorOptions().dtype(DType::F32).device(Device::CUDA));
    const int64_t* pt = device_ptr<int64_t>(targets);
    Tensor one = ones({}, o);  // the loss's gradient
    b.add("cross_entropy fwd", shape, bytes, double(bytes), [&] {
        detail::cross_entropy_forward_cuda<T>(device_ptr<T>(loss), device_ptr<float>(lse), device_ptr<T>(logits), pt,
                                              M, V, 0.0, 0);
    });
    b.add("cross_entropy bwd", shape, bytes, 2.0 * bytes, [&] {
        detail::cross_entropy_backward_cuda<T>(device_ptr<T>(dlogits), device_ptr<T>(logits), device_ptr<float>(lse),
                                               pt, device_ptr<T>(one), M, V, 0.0, 0);
    });
    {
        // In place: the values become gradients run after run; the work per element is the same.
        Tensor work = logits.clone();
        b.add("cross_entropy bwd in place", shape, bytes, 2.0 * bytes, [&] {
            detail::cross_entropy_backward_cuda<T>(device_ptr<T>(work), device_ptr<T>(work), device_ptr<float>(lse),
                                                   pt, device_ptr<T>(one), M, V, 0.0, 0);
        });
    }
    b.add("cross_entropy op fwd (host check)", shape, bytes, double(bytes), [&] {
        NoGradGuard no_grad;
        Tensor l = cross_entropy(logits, targets);
    });
    Tensor x = logits.detach().requires_grad_(true);  // held here: the node allocates dlogits
    Tensor recorded = cross_entropy(x, targets);
    b.add("cross_entropy op bwd", shape, bytes, 2.0 * bytes, [&] {
        NoGradGuard no_grad;
        std::vector<Tensor> d = recorded.grad_fn()->apply(one);
    });
}

template <class T>
void bench_elementwise(Bench& b, int64_t rows) {
    TensorOptions o = TensorOptions().dtype(dtype_of<T>()).device(Device::CUDA);
    const int64_t size = static_cast<int64_t>(sizeof(T));
    {
        const int64_t N = 4096, bytes = rows * N * size;
        Tensor x = randn({rows, N}, o).requires_grad_(true), dy = randn({rows, N}, o);
        b.add("gelu fwd", shape_of(rows, N), bytes, 2.0 * bytes, [&] {
            NoGradGuard no_grad;
            Tensor y = gelu(x);
        });
        Tensor y = gelu(x);
        b.add("gelu bwd", shape_of(rows, N), bytes, 3.0 * bytes, [&] {
            NoGradGuard no_grad;
            std::vector<Tensor> d = y.grad_fn()->apply(dy);
        });
    }
    {
        const int64_t N = 1024, bytes = rows * N * size;
        Tensor a = randn({rows, N}, o), c = randn({rows, N}, o);
        b.add("add fwd", shape_of(rows, N) + " + " + shape_of(rows, N), bytes, 3.0 * bytes, [&] {
            NoGradGuard no_grad;
            Tensor out = add(a, c);
        });
    }
    {
        const int64_t N = 4096, bytes = rows * N * size;
        const std::string shape = shape_of(rows, N) + " + [" + std::to_string(N) + "]";
        Tensor a = randn({rows, N}, o).requires_grad_(true), bias = randn({N}, o).requires_grad_(true);
        Tensor g = randn({rows, N}, o);
        b.add("add bias fwd", shape, bytes, 2.0 * bytes, [&] {
            NoGradGuard no_grad;
            Tensor out = add(a, bias);
        });
        Tensor out = add(a, bias);
        b.add("add/linear bias bwd (column sum)", shape_of(rows, N), bytes, double(bytes), [&] {
            NoGradGuard no_grad;
            std::vector<Tensor> d = out.grad_fn()->apply(g);
        });
        Tensor y = randn({rows, N}, o);
        b.add("linear bias fwd (out += bias)", shape, bytes, 2.0 * bytes, [&] {
            detail::add_bias_rows_cuda<T>(device_ptr<T>(y), device_ptr<T>(bias), rows, N, 0);
        });
    }
}

// lm_head and its loss at [rows, 1024] @ [32768, 1024]^T: forward and backward (loss.backward()
// from leaves x and weight), the unfused pair linear + cross_entropy, then linear_cross_entropy
// with chunks of 512 .. 8192 rows and its own choice (chunk_rows 0). A product-bound op: its
// rows give ms only (GB/s and % copy 0).
template <class T>
void bench_head_loss(std::vector<Row>& out, const std::string& dtype, int64_t rows) {
    const int64_t C = 1024, V = 32768;
    TensorOptions o = TensorOptions().dtype(dtype_of<T>()).device(Device::CUDA);
    Tensor x = randn({rows, C}, o).requires_grad_(true);
    Tensor w = scale(randn({V, C}, o), 0.02).requires_grad_(true), targets = targets_for(rows, V);
    const std::string shape = shape_of(rows, C) + " @ " + shape_of(V, C) + "^T";
    auto run = [&](const std::string& op, const std::function<Tensor()>& loss) {
        const double ms = time_ms([&] {
            loss().backward();
            x.zero_grad();
            w.zero_grad();
        });
        out.push_back({op, dtype, shape, ms, 0.0, 0.0});
    };
    run("head loss fwd+bwd, linear + cross_entropy", [&] { return cross_entropy(linear(x, w), targets); });
    for (int64_t chunk : {512, 1024, 2048, 4096, 8192, 0}) {
        LinearCrossEntropyOptions options;
        options.chunk_rows = chunk;
        run("head loss fwd+bwd, fused, chunk " + (chunk ? std::to_string(chunk) : std::string("auto")),
            [&] { return linear_cross_entropy(x, w, targets, options); });
    }
}

template <class T>
void bench_dtype(const std::string& dtype, int64_t rows, bool head_loss_only, std::vector<Row>& out) {
    bench_head_loss<T>(out, dtype, rows);
    if (head_loss_only) return;
    Bench b(dtype, out);
    bench_cross_entropy<T>(b, rows, 32768);
    bench_cross_entropy<T>(b, rows, 256);
    bench_elementwise<T>(b, rows);
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_ops: the bandwidth-bound ops' effective bandwidth against a device-to-device copy"};
    bool quick = false;
    std::vector<std::string> dtypes = {"bf16", "f32"};
    std::string json;
    app.add_flag("--quick", quick, "1024 rows instead of 16384: a smoke test");
    bool head_loss_only = false;
    app.add_flag("--head-loss", head_loss_only, "the head loss's rows only");
    app.add_option("--dtype", dtypes, "dtypes")->check(CLI::IsMember({"bf16", "f32"}));
    app.add_option("--json", json, "write the rows as JSON here");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    if (!cuda_is_available()) {
        std::fprintf(stderr, "bench_ops: no CUDA GPU is visible\n");
        return 2;
    }
    try {
        const int64_t rows = quick ? 1024 : 16384;
        std::vector<Row> out;
        for (const std::string& d : dtypes) {
            if (d == "bf16") bench_dtype<bf16>("bf16", rows, head_loss_only, out);
            else bench_dtype<float>("f32", rows, head_loss_only, out);
            empty_cache(Device::CUDA);
        }
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("%s, %lld rows, median of 20 CUDA-event timings after 3 warm-ups\n", prop.name,
                    static_cast<long long>(rows));
        std::printf("%-36s %-5s %-26s %9s %8s %7s\n", "op", "dtype", "shape", "ms", "GB/s", "%copy");
        for (const Row& r : out)
            std::printf("%-36s %-5s %-26s %9.4f %8.1f %7.1f\n", r.op.c_str(), r.dtype.c_str(), r.shape.c_str(), r.ms,
                        r.gbps, r.pct_copy);
        if (!json.empty()) {
            nlohmann::json j = nlohmann::json::array();
            for (const Row& r : out)
                j.push_back({{"op", r.op}, {"dtype", r.dtype}, {"shape", r.shape}, {"ms", r.ms}, {"gbps", r.gbps},
                             {"pct_copy", r.pct_copy}});
            std::ofstream(json) << j.dump(1) << "\n";
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_ops: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
