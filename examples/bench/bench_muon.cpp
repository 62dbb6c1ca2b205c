// examples/bench/bench_muon.cpp: the time of Muon's step (nn/optim/muon.h) on a GPU against the floor of its
// Newton-Schulz products run alone in cuBLAS, beside AdamW's step on the same matrices.
//
// The model: a GPT of --arch with --layers, --heads, --embd, --vocab (default: train_gpt's
// gpt2-medium-ish preset, L = 12, C = 1024, NH = 16, V = 32768) in bf16 on cuda; its blocks'
// matrices (param_groups_for_muon) get gradients N(0, 1). Three things are timed:
//   muon      Muon::step() over the matrices (momentum, normalization, the orthogonalization of
//             each shape class as one batch, the update)
//   products  the products alone: per class and iteration, the three strided-batched bf16 GEMMs of
//             the same sizes as Muon's (the Gram matrix, the polynomial, the update), called here
//             with cublasGemmStridedBatchedEx on buffers of their own: the floor Muon's step
//             cannot go below
//   adamw     AdamW::step() over the same matrices (f32 moments and masters), for scale
// and Muon's step and the products each captured once as a CUDA graph (core/cuda_graph.h) and
// replayed: the same kernels with no launch gaps between them.
// Each is timed with CUDA events on normtape's stream (bench_timing.h): --warmup runs, then --repeat
// runs queued back to back behind a host wait, their median. FLOPs: per matrix [rows, cols],
// m = min, n = max, per iteration 2 m^2 n (Gram) + 2 m^3 (polynomial) + 2 m^2 n (update).
//
//   bench_muon [--arch gpt2|nanochat|llama] [--layers N] [--heads N] [--embd N] [--vocab N]
//              [--warmup N] [--repeat N] [--json FILE]
// Exit status: 0 done, 2 a bad flag or no GPU, 1 an error while measuring.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_timing.h"
#include "core/cuda_check.h"
#include "core/cuda_context.h"
#include "core/device_ptr.h"
#include "normtape.h"

using namespace normtape;

namespace {

// Muon's classes: [rows, cols] -> how many matrices.
std::map<std::pair<int64_t, int64_t>, int64_t> classes_of(const std::vector<Tensor>& matrices) {
    std::map<std::pair<int64_t, int64_t>, int64_t> classes;
    for (const Tensor& p : matrices) ++classes[{p.size(0), p.numel() / p.size(0)}];
    return classes;
}

// One strided-batched bf16 product with f32 accumulation, column-major (cuBLAS's convention).
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float beta, const void* a, int64_t lda, int64_t sa,
          const void* b, int64_t ldb, int64_t sb, void* c, int64_t ldc, int64_t sc, int64_t count) {
    const float alpha = 1;
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cuda::cublas(0), ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                                            int(m), int(n), int(k), &alpha, a, CUDA_R_16BF, int(lda), sa, b, CUDA_R_16BF,
                                            int(ldb), sb, &beta, c, CUDA_R_16BF, int(ldc), sc, int(count),
                                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_muon: Muon's step against its Newton-Schulz products alone, and AdamW's, in bf16 on a GPU"};
    std::string arch = "gpt2", json;
    int64_t layers = 12, heads = 16, embd = 1024, vocab = 32768;
    int warmup = 3, repeats = 20;
    app.add_option("--arch", arch, "gpt_config's architecture")
        ->capture_default_str()
        ->check(CLI::IsMember({"gpt2", "nanochat", "llama"}));
    app.add_option("--layers", layers, "L")->capture_default_str()->check(CLI::Range(1, 1000));
    app.add_option("--heads", heads, "NH")->capture_default_str()->check(CLI::Range(1, 1000));
    app.add_option("--embd", embd, "C")->capture_default_str()->check(CLI::Range(1, 65536));
    app.add_option("--vocab", vocab, "V")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    app.add_option("--warmup", warmup, "untimed runs before the timed ones")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000));
    app.add_option("--repeat", repeats, "timed runs; the median is reported")
        ->capture_default_str()
        ->check(CLI::Range(1, 10000));
    app.add_option("--json", json, "write the figures as JSON here");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    if (!cuda_is_available()) {
        std::fprintf(stderr, "bench_muon: no CUDA GPU is visible\n");
        return 2;
    }
    try {
        manual_seed(0);
        GPTConfig config = gpt_config(arch);
        config.n_layer = layers;
        config.n_head = heads;
        config.n_embd = embd;
        config.vocab_size = vocab;
        config.block_size = 1024;
        config.dtype = DType::BF16;
        config.device = Device::cuda(0);
        GPT model(config);
        const std::vector<Tensor> matrices = param_groups_for_muon(model).matrices;
        int64_t elements = 0;
        for (Tensor p : matrices) {
            p.impl().grad = randn(p.shape(), TensorOptions().dtype(DType::BF16).device(p.device())).impl_ptr();
            elements += p.numel();
        }
        Muon muon(matrices, MuonOptions{});
        AdamW adamw(matrices, AdamWOptions{});
        const double muon_ms = time_ms([&] { muon.step(); }, warmup, repeats);
        const double adamw_ms = time_ms([&] { adamw.step(); }, warmup, repeats);

        // The products alone, on buffers of their own (Note [Muon on CUDA] in nn/optim/muon.cu: wide X is
        // cuBLAS's X^T, A = X X^T, B += c A A onto b A + a I, X' = B X; a tall Y is iterated as Y B).
        const auto classes = classes_of(matrices);
        struct Buffers {
            int64_t rows, cols, count;
            Tensor x, y, a, b;
        };
        std::vector<Buffers> buffers;
        double flops = 0;
        const TensorOptions in_bf16 = TensorOptions().dtype(DType::BF16).device(Device::cuda(0));
        for (const auto& [shape, count] : classes) {
            const auto [rows, cols] = shape;
            const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
            buffers.push_back({rows, cols, count, randn({count, rows, cols}, in_bf16), empty({count, rows, cols}, in_bf16),
                               empty({count, m, m}, in_bf16), zeros({count, m, m}, in_bf16)});
            flops += 5.0 * static_cast<double>(count) * (4.0 * m * m * n + 2.0 * m * m * m);
        }
        const auto products = [&] {
            for (Buffers& c : buffers) {
                const int64_t m = std::min(c.rows, c.cols), sx = c.rows * c.cols, sa = m * m;
                bf16 *x = detail::device_ptr<bf16>(c.x), *y = detail::device_ptr<bf16>(c.y);
                bf16 *a = detail::device_ptr<bf16>(c.a), *b = detail::device_ptr<bf16>(c.b);
                for (int s = 0; s < 5; ++s) {
                    if (c.rows > c.cols) gemm(false, true, m, m, c.rows, 0, x, c.cols, sx, x, c.cols, sx, a, m, sa, c.count);
                    else gemm(true, false, m, m, c.cols, 0, x, c.cols, sx, x, c.cols, sx, a, m, sa, c.count);
                    gemm(false, false, m, m, m, 1, a, m, sa, a, m, sa, b, m, sa, c.count);
                    if (c.rows > c.cols)
                        gemm(false, false, c.cols, c.rows, c.cols, 0, b, m, sa, x, c.cols, sx, y, c.cols, sx, c.count);
                    else gemm(false, false, c.cols, c.rows, c.rows, 0, x, c.cols, sx, b, m, sa, y, c.cols, sx, c.count);
                    std::swap(x, y);
                }
            }
        };
        const double products_ms = time_ms(products, warmup, repeats);
        CUDAGraph muon_graph, products_graph;
        muon_graph.capture(Device::cuda(0), [&] { muon.step(); });
        products_graph.capture(Device::cuda(0), products);
        const double muon_graph_ms = time_ms([&] { muon_graph.replay(); }, warmup, repeats);
        const double products_graph_ms = time_ms([&] { products_graph.replay(); }, warmup, repeats);

        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        std::printf("%s, %s L=%lld C=%lld NH=%lld V=%lld in bf16: %zu matrices (%lld elements) in %zu classes, "
                    "median of %d CUDA-event timings after %d warm-ups\n",
                    prop.name, arch.c_str(), static_cast<long long>(layers), static_cast<long long>(embd),
                    static_cast<long long>(heads), static_cast<long long>(vocab), matrices.size(),
                    static_cast<long long>(elements), classes.size(), repeats, warmup);
        for (const auto& [shape, count] : classes)
            std::printf("  class [%lld, %lld] x %lld\n", static_cast<long long>(shape.first),
                        static_cast<long long>(shape.second), static_cast<long long>(count));
        std::printf("Newton-Schulz products alone (cuBLAS): %.3f ms, %.2f TFLOP, %.0f TFLOP/s\n", products_ms,
                    flops / 1e12, flops / (products_ms * 1e-3) / 1e12);
        std::printf("Muon step:                            %.3f ms, %.3f of the products alone\n", muon_ms,
                    muon_ms / products_ms);
        std::printf("AdamW step, same matrices:            %.3f ms\n", adamw_ms);
        std::printf("as CUDA graphs: products %.3f ms, Muon step %.3f ms, %.3f of the products\n", products_graph_ms,
                    muon_graph_ms, muon_graph_ms / products_graph_ms);
        if (!json.empty()) {
            nlohmann::json out = {{"device", prop.name},       {"arch", arch},
                                  {"layers", layers},          {"embd", embd},
                                  {"heads", heads},            {"vocab", vocab},
                                  {"matrices", matrices.size()}, {"elements", elements},
                                  {"products_ms", products_ms}, {"products_tflop", flops / 1e12},
                                  {"muon_ms", muon_ms},        {"muon_over_products", muon_ms / products_ms},
                                  {"adamw_ms", adamw_ms},      {"products_graph_ms", products_graph_ms},
                                  {"muon_graph_ms", muon_graph_ms},
                                  {"muon_graph_over_products_graph", muon_graph_ms / products_graph_ms},
                                  {"warmup", warmup},
                                  {"repeat", repeats}};
            std::ofstream f(json);
            f << out.dump(1) << "\n";
            if (!f) throw IOError("--json " + json + ": cannot write");
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_muon: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
