// examples/bench/bench_attention.cpp: the speed of causal_self_attention (ops/attention.h) on a GPU, in
// bf16, as time and as TFLOP/s, with the bytes it saves for backward, under each attention backend:
// cuDNN's fused flash attention (where the library has cuDNN) and normtape's own kernels.
//
// For each shape (B, NH, T, hs), C = NH * hs: qkv [B, T, 3C] bf16 on cuda, N(0, 1), requiring grad,
// and a gradient dout [B, T, C] bf16, N(0, 1). Two things are timed:
//   forward          out = causal_self_attention(qkv, NH) with grad mode on (it records its node
//                    and saves what backward reads, as in training); the graph is dropped after
//   forward+backward qkv.zero_grad(); out = causal_self_attention(qkv, NH); out.backward(dout):
//                    the forward, the op's backward and the engine's copy of dqkv into qkv.grad
// Each is timed with CUDA events on normtape's stream: --warmup runs, then --repeat runs queued back
// to back, each between its own pair of events, and their median. The stream waits on a host
// function (2 ms per run) while the runs are queued, so each run starts as the one before ends:
// the times are the GPU's, without the host's launch overhead, even for runs of a few microseconds.
// FLOPs count the causal half of the two products: forward 4 * B * NH * T * T * hs / 2, backward
// 2.5 times that, forward+backward 3.5 times (FlashAttention-2's convention, arXiv:2307.08691).
// Memory: saved_bytes() right after one forward (the storages its node holds for backward; qkv is a
// leaf that requires grad, so it is not counted, as saved_bytes() never counts such leaves), and
// the allocator's peak over its base during one forward+backward.
//
//   bench_attention [--shapes B,NH,T,hs ...] [--backend both|cudnn|kernels] [--warmup N] [--repeat N]
//                   [--json FILE]
//   default shapes: 16,16,1024,64  8,16,2048,64  4,16,4096,64  16,8,1024,128
//   default backend: both where the library has cuDNN (set_attention_backend before each), else kernels
// Exit status: 0 done, 2 a bad flag or no GPU, 1 an error while measuring.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "bench_timing.h"
#include "normtape.h"

using namespace normtape;

namespace {

struct Shape4 {
    int64_t B, NH, T, hs;
};

struct Row {
    Shape4 s;
    AttentionBackend backend;
    double fwd_ms, fwd_bwd_ms, fwd_tflops, fwd_bwd_tflops;
    int64_t saved_bytes, peak_bytes;
};

// Parses "B,NH,T,hs" (four positive integers). Returns "" and fills `out`, or the reason it failed.
std::string parse_shape(const std::string& text, Shape4& out) {
    std::vector<int64_t> v;
    std::stringstream in(text);
    std::string item;
    while (std::getline(in, item, ',')) {
        size_t used = 0;
        long long x = 0;
        try {
            x = std::stoll(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (used != item.size() || item.empty() || x < 1)
            return "expected B,NH,T,hs as four positive integers, got \"" + text + "\"";
        v.push_back(x);
    }
    if (v.size() != 4) return "expected B,NH,T,hs as four positive integers, got \"" + text + "\"";
    out = {v[0], v[1], v[2], v[3]};
    return "";
}

// Causal FLOPs of one forward: QK^T and PV, 2 * T * T * hs each per (b, h), half of the matrix.
double forward_flops(const Shape4& s) {
    return 4.0 * static_cast<double>(s.B * s.NH) * static_cast<double>(s.T) * static_cast<double>(s.T) *
           static_cast<double>(s.hs) / 2.0;
}

Row bench_shape(const Shape4& s, AttentionBackend backend, int warmup, int repeats) {
    set_attention_backend(backend);
    const int64_t C = s.NH * s.hs;
    TensorOptions o = TensorOptions().dtype(DType::BF16).device(Device::CUDA);
    Tensor qkv = randn({s.B, s.T, 3 * C}, o).requires_grad_(true);
    Tensor dout = randn({s.B, s.T, C}, o);
    Row r{s, backend, 0, 0, 0, 0, 0, 0};
    r.fwd_ms = time_ms([&] { Tensor out = causal_self_attention(qkv, s.NH); }, warmup, repeats);
    auto fwd_bwd = [&] {
        qkv.zero_grad();
        Tensor out = causal_self_attention(qkv, s.NH);
        out.backward(dout);
    };
    r.fwd_bwd_ms = time_ms(fwd_bwd, warmup, repeats);
    {
        Tensor out = causal_self_attention(qkv, s.NH);
        r.saved_bytes = saved_bytes();
    }
    qkv.zero_grad();
    synchronize(Device::CUDA);
    const int64_t base = memory_stats(Device::CUDA).allocated_bytes;
    reset_peak_memory_stats(Device::CUDA);
    fwd_bwd();
    synchronize(Device::CUDA);
    r.peak_bytes = memory_stats(Device::CUDA).peak_allocated_bytes - base;
    const double f = forward_flops(s);
    r.fwd_tflops = f / (r.fwd_ms * 1e-3) / 1e12;
    r.fwd_bwd_tflops = 3.5 * f / (r.fwd_bwd_ms * 1e-3) / 1e12;
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_attention: causal_self_attention's forward and forward+backward in bf16 on a GPU"};
    std::vector<std::string> shape_args = {"16,16,1024,64", "8,16,2048,64", "4,16,4096,64", "16,8,1024,128"};
    int warmup = 3, repeats = 20;
    std::string json, backend = "both";
    std::string shapes_default;
    for (const std::string& s : shape_args) shapes_default += (shapes_default.empty() ? "" : " ") + s;
    app.add_option("--shapes", shape_args, "shapes as B,NH,T,hs (C = NH * hs)")->default_str(shapes_default);
    app.add_option("--warmup", warmup, "untimed runs before the timed ones")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000));
    app.add_option("--repeat", repeats, "timed runs; the median is reported")
        ->capture_default_str()
        ->check(CLI::Range(1, 10000));
    app.add_option("--backend", backend, "the attention backends to time")
        ->capture_default_str()
        ->check(CLI::IsMember({"both", "cudnn", "kernels"}));
    app.add_option("--json", json, "write the rows as JSON here");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    std::vector<Shape4> shapes;
    for (const std::string& text : shape_args) {
        Shape4 s{};
        if (std::string why = parse_shape(text, s); !why.empty()) {
            std::fprintf(stderr, "bench_attention: --shapes: %s\n", why.c_str());
            return 2;
        }
        shapes.push_back(s);
    }
    if (!cuda_is_available()) {
        std::fprintf(stderr, "bench_attention: no CUDA GPU is visible\n");
        return 2;
    }
    const bool has_cudnn = attention_backend() == AttentionBackend::Cudnn;
    if (backend == "cudnn" && !has_cudnn) {
        std::fprintf(stderr, "bench_attention: --backend cudnn: this build has no cuDNN\n");
        return 2;
    }
    std::vector<AttentionBackend> backends;
    if (backend != "kernels" && has_cudnn) backends.push_back(AttentionBackend::Cudnn);
    if (backend != "cudnn") backends.push_back(AttentionBackend::Kernels);
    try {
        manual_seed(0);
        std::vector<Row> rows;
        for (const Shape4& s : shapes)
            for (AttentionBackend b : backends) rows.push_back(bench_shape(s, b, warmup, repeats));
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("%s, causal_self_attention in bf16, median of %d CUDA-event timings after %d warm-ups\n",
                    prop.name, repeats, warmup);
        std::printf("%4s %4s %6s %4s %8s %10s %10s %12s %12s %12s %12s\n", "B", "NH", "T", "hs", "backend", "fwd ms",
                    "fwd TF/s",
                    "fwd+bwd ms", "fwd+bwd TF/s", "saved MiB", "peak MiB");
        for (const Row& r : rows)
            std::printf("%4lld %4lld %6lld %4lld %8s %10.4f %10.1f %12.4f %12.1f %12.1f %12.1f\n",
                        static_cast<long long>(r.s.B), static_cast<long long>(r.s.NH), static_cast<long long>(r.s.T),
                        static_cast<long long>(r.s.hs), attention_backend_name(r.backend), r.fwd_ms, r.fwd_tflops, r.fwd_bwd_ms, r.fwd_bwd_tflops,
                        static_cast<double>(r.saved_bytes) / (1 << 20), static_cast<double>(r.peak_bytes) / (1 << 20));
        if (!json.empty()) {
            nlohmann::json out;
            out["device"] = prop.name;
            out["dtype"] = "bf16";
            out["warmup"] = warmup;
            out["repeat"] = repeats;
            out["rows"] = nlohmann::json::array();
            for (const Row& r : rows)
                out["rows"].push_back({{"backend", attention_backend_name(r.backend)}, {"B", r.s.B}, {"NH", r.s.NH}, {"T", r.s.T}, {"hs", r.s.hs},
                                       {"C", r.s.NH * r.s.hs}, {"fwd_ms", r.fwd_ms}, {"fwd_bwd_ms", r.fwd_bwd_ms},
                                       {"fwd_tflops", r.fwd_tflops}, {"fwd_bwd_tflops", r.fwd_bwd_tflops},
                                       {"saved_bytes", r.saved_bytes}, {"peak_bytes", r.peak_bytes}});
            std::ofstream f(json);
            f << out.dump(1) << "\n";
            if (!f) throw IOError("--json " + json + ": cannot write");
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_attention: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
