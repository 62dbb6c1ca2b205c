// examples/bench/bench_norms.cpp: the norm kernels' speed on a GPU, as effective bandwidth against a
// device-to-device copy timed in the same run.
//
// For N in {768, 1024, 2048, 3000, 4096, 8192, 16384} and M = 2^28 / N rows, dtypes bf16 and f32,
// LayerNorm and RMSNorm: the forward, and the backward (dx, dweight and dbias, complete) under
// SavePolicy::Input and SavePolicy::Output; under SavePolicy::Normalized, the forward (x_hat and y
// by one kernel) and the backward; the fused norm with a residual ("+residual": s = x + residual
// and y in one forward; the backward under Input with the gradient that reached s added to dx). Each
// case is timed with CUDA events: 3 warm-up runs, then 20 runs queued back to back, each between
// its own pair of events, and their median (the host queues ahead of the GPU, so its launch
// overhead is not counted; --hold queues the runs behind a host wait first, as the PyTorch
// scripts' time_ms does, so that this holds for the shortest runs too). The data (2^28 elements,
// 512 MiB in bf16) is ten times the L2 cache, so nothing is served from it between runs. Effective
// bandwidth = bytes that must move / time:
// forward x in and y out (Normalized: x_hat out too); backward x (or y, or x_hat) and dy in, dx
// out (weights and statistics, M*8 bytes at most, are not counted); +residual: forward x and the
// residual in, s and y out; backward dy, s and s's gradient in, dx out; copy = bytes read + written.
//
//   bench_norms [--quick] [--reference] [--hold] [--rows M] [--n N...] [--dtype bf16|f32...] [--csv FILE] [--json FILE]
//   --quick: M = 2^20 / N (a smoke test; CI compiles this program, it has no GPU to run it)
//   --rows: M rows at every N instead (e.g. 16384, the fused norm's comparison with torch.compile)
//   --reference: also time the plain reference kernels
//   --n, --dtype: only these hidden sizes or dtypes (e.g. to profile one case)
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
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
    std::string dtype, norm, pass, policy;  // pass: forward | backward; policy: input | output | -
    int64_t N, M;
    double ms, gbps, pct_copy;
};

using detail::device_ptr;

template <class T>
void bench_dtype(const char* dtype_name_, int64_t total, int64_t fixed_rows, bool hold,
                 const std::vector<int64_t>& sizes, bool reference, std::vector<Row>& rows) {
    const DType dt = dtype_of<T>();
    for (int64_t N : sizes) {
        const int64_t M = fixed_rows > 0 ? fixed_rows : total / N;
        TensorOptions o = TensorOptions().dtype(dt).device(Device::CUDA);
        TensorOptions so = TensorOptions().dtype(DType::F32).device(Device::CUDA);
        Tensor x = randn({M, N}, o), dy = randn({M, N}, o), y = empty({M, N}, o), dx = empty({M, N}, o);
        Tensor w = add(ones({N}, o), scale(randn({N}, o), 0.1)), b = scale(randn({N}, o), 0.1);
        Tensor dw = empty({N}, o), db = empty({N}, o), mean = empty({M}, so), rstd = empty({M}, so);
        Tensor residual = randn({M, N}, o), sum = empty({M, N}, o);  // the fused norm's rows
        const double bytes = static_cast<double>(M * N) * sizeof(T);
        double copy_ms = time_ms([&] {
            CUDA_CHECK(cudaMemcpyAsync(device_ptr<T>(y), device_ptr<T>(x), static_cast<size_t>(bytes),
                                       cudaMemcpyDeviceToDevice, cuda::stream(0)));
        }, 3, 20, hold);
        double copy_gbps = 2 * bytes / copy_ms / 1e6;
        rows.push_back({dtype_name_, "-", "copy", "-", N, M, copy_ms, copy_gbps, 100.0});
        auto add_row = [&](const std::string& norm, const std::string& pass, const std::string& policy, double ms,
                           double moved) {
            double gbps = moved / ms / 1e6;
            rows.push_back({dtype_name_, norm, pass, policy, N, M, ms, gbps, 100.0 * gbps / copy_gbps});
        };
        for (int kernels = 0; kernels < (reference ? 2 : 1); ++kernels) {
            auto backward = [&](T* dx_, T* dw_, T* db_, const T* dy_, const T* dres, const T* saved, const float* m,
                                const float* r, const T* w_, const T* b_, bool centered, SavePolicy policy) {
                // the reference kernels take no dresidual: they are timed without one
                if (kernels == 0)
                    detail::norm_backward_cuda<T>(dx_, dw_, db_, dy_, dres, saved, m, r, w_, b_, centered, policy, M, N, 0);
                else
                    detail::norm_backward_reference_cuda<T>(dx_, dw_, db_, dy_, saved, m, r, w_, b_, centered, policy,
                                                            M, N, 0);
            };
            std::string suffix = kernels == 0 ? "" : " (reference)";
            for (bool centered : {true, false}) {
                std::string norm = std::string(centered ? "layer" : "rms") + suffix;
                float* m = centered ? device_ptr<float>(mean) : nullptr;
                T* bias = centered ? device_ptr<T>(b) : nullptr;
                add_row(norm, "forward", "-", time_ms([&] {
                            if (kernels == 0)
                                detail::norm_forward_cuda<T>(device_ptr<T>(y), nullptr, m, device_ptr<float>(rstd),
                                                             device_ptr<T>(x), nullptr, nullptr, device_ptr<T>(w), bias,
                                                             M, N, 1e-5, 0);
                            else
                                detail::norm_forward_reference_cuda<T>(device_ptr<T>(y), m, device_ptr<float>(rstd),
                                                                       device_ptr<T>(x), device_ptr<T>(w), bias, M, N,
                                                                       1e-5, 0);
                        }, 3, 20, hold),
                        2 * bytes);
                if (kernels == 0)  // x_hat into dx's array (free until the backward) beside y: 3 passes
                    add_row(norm, "forward", "normalized", time_ms([&] {
                                detail::norm_forward_cuda<T>(device_ptr<T>(y), device_ptr<T>(dx), m,
                                                             device_ptr<float>(rstd), device_ptr<T>(x), nullptr,
                                                             nullptr, device_ptr<T>(w), bias, M, N, 1e-5, 0);
                            }, 3, 20, hold),
                            3 * bytes);
                for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized}) {
                    const T* saved = policy == SavePolicy::Input ? device_ptr<T>(x) : device_ptr<T>(y);
                    add_row(norm, "backward", policy_name(policy), time_ms([&] {
                                backward(device_ptr<T>(dx), device_ptr<T>(dw), centered ? device_ptr<T>(db) : nullptr,
                                         device_ptr<T>(dy), nullptr, saved, policy == SavePolicy::Input ? m : nullptr,
                                         device_ptr<float>(rstd), device_ptr<T>(w), bias, centered, policy);
                            }, 3, 20, hold),
                            3 * bytes);
                }
                if (kernels != 0) continue;
                // The fused norm with a residual (layer_norm_fn): s = x + residual and y in one kernel (x
                // and the residual in, s and y out), and under Input the backward's dx plus the gradient
                // that reached s (dy, s and that gradient in, dx out), which is also the residual's.
                add_row(norm + " +residual", "forward", "-", time_ms([&] {
                            detail::norm_forward_cuda<T>(device_ptr<T>(y), nullptr, m, device_ptr<float>(rstd),
                                                         device_ptr<T>(x), device_ptr<T>(residual), device_ptr<T>(sum),
                                                         device_ptr<T>(w), bias, M, N, 1e-5, 0);
                        }, 3, 20, hold),
                        4 * bytes);
                add_row(norm + " +residual", "backward", "input", time_ms([&] {
                            backward(device_ptr<T>(dx), device_ptr<T>(dw), centered ? device_ptr<T>(db) : nullptr,
                                     device_ptr<T>(dy), device_ptr<T>(residual), device_ptr<T>(sum), m,
                                     device_ptr<float>(rstd), device_ptr<T>(w), bias, centered, SavePolicy::Input);
                        }, 3, 20, hold),
                        4 * bytes);
            }
        }
    }
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_norms: the norm kernels' effective bandwidth against a device-to-device copy"};
    bool quick = false, reference = false, hold = false;
    int64_t fixed_rows = 0;
    std::vector<int64_t> sizes = {768, 1024, 2048, 3000, 4096, 8192, 16384};
    std::vector<std::string> dtypes = {"bf16", "f32"};
    std::string csv, json;
    app.add_flag("--quick", quick, "M = 2^20 / N: a smoke test");
    app.add_flag("--reference", reference, "also time the plain reference kernels");
    app.add_flag("--hold", hold, "queue each case's runs behind a host wait, as the PyTorch scripts do");
    app.add_option("--rows", fixed_rows, "M rows at every N (default: 2^28 / N)")->check(CLI::Range(int64_t(1), int64_t(1) << 24));
    app.add_option("--n", sizes, "hidden sizes N")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    app.add_option("--dtype", dtypes, "dtypes")->check(CLI::IsMember({"bf16", "f32"}));
    app.add_option("--csv", csv, "write the rows as CSV here");
    app.add_option("--json", json, "write the rows as JSON here");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    if (!cuda_is_available()) {
        std::fprintf(stderr, "bench_norms: no CUDA GPU is visible\n");
        return 2;
    }
    try {
        const int64_t total = int64_t(1) << (quick ? 20 : 28);
        std::vector<Row> rows;
        for (const std::string& d : dtypes) {
            if (d == "bf16") bench_dtype<bf16>("bf16", total, fixed_rows, hold, sizes, reference, rows);
            else bench_dtype<float>("f32", total, fixed_rows, hold, sizes, reference, rows);
        }
        cudaDeviceProp prop{};
        CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
        if (fixed_rows > 0)
            std::printf("%s, M = %lld rows, median of 20 CUDA-event timings after 3 warm-ups\n", prop.name,
                        static_cast<long long>(fixed_rows));
        else
            std::printf("%s, M*N = 2^%d elements, median of 20 CUDA-event timings after 3 warm-ups\n", prop.name,
                        quick ? 20 : 28);
        std::printf("%-5s %-18s %-8s %-7s %6s %8s %9s %8s %7s\n", "dtype", "norm", "pass", "policy", "N", "M", "ms",
                    "GB/s", "% copy");
        for (const Row& r : rows)
            std::printf("%-5s %-18s %-8s %-7s %6lld %8lld %9.4f %8.1f %7.1f\n", r.dtype.c_str(), r.norm.c_str(),
                        r.pass.c_str(), r.policy.c_str(), static_cast<long long>(r.N), static_cast<long long>(r.M),
                        r.ms, r.gbps, r.pct_copy);
        if (!csv.empty()) {
            std::ofstream f(csv);
            f << "dtype,norm,pass,policy,N,M,ms,gbps,pct_copy\n";
            for (const Row& r : rows)
                f << r.dtype << "," << r.norm << "," << r.pass << "," << r.policy << "," << r.N << "," << r.M << ","
                  << r.ms << "," << r.gbps << "," << r.pct_copy << "\n";
        }
        if (!json.empty()) {
            nlohmann::json out = nlohmann::json::array();
            for (const Row& r : rows)
                out.push_back({{"dtype", r.dtype}, {"norm", r.norm}, {"pass", r.pass}, {"policy", r.policy},
                               {"N", r.N}, {"M", r.M}, {"ms", r.ms}, {"gbps", r.gbps}, {"pct_copy", r.pct_copy}});
            std::ofstream(json) << out.dump(1) << "\n";
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_norms: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
