// examples/bench/bench_dry_run.cpp: what a prediction costs against what it predicts: the time of a
// training step of a GPT on the cpu (gpt_step, nn/train/gpt_step.h), of the same step as a dry run
// (core/dry_run.h), and of predict_peak (nn/memory/memory_plan.h), which builds the model and
// dry-runs two steps. The planner tries each setting through predict_peak, so its cost against a
// real step says how many settings a plan can afford.
//
// The model: train_gpt's gpt2-medium-ish preset (L = 12, C = 1024, NH = 16, V = 32768) with
// --batch B and --seq T (default the preset's 16 and 1024), in f32 on the cpu, AdamW, the
// default memory settings (Input, activation recompute). Timed with the steady clock:
//   real     one gpt_step run for real, after one more before it (--real-steps of them, the median)
//   dry      one gpt_step inside a dry run, after one before it (--repeat, the median)
//   predict  predict_peak(config, settings, B, T) (--repeat, the median)
// The ratios dry / real and predict / real are printed last; --json writes them with the times.
//
//   bench_dry_run [--batch N] [--seq N] [--layers N] [--real-steps N] [--repeat N] [--json FILE]
// Exit status: 0 done, 2 a bad flag, 1 an error while measuring.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "normtape.h"

using namespace normtape;

namespace {

double median_ms(int runs, const std::function<void()>& fn) {
    std::vector<double> ms;
    for (int i = 0; i < runs; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// Times `steps` steps of gpt_step on the model of `c`, after one untimed, in or out of a dry run.
double step_ms(const GPTConfig& c, int64_t B, int64_t T, int steps) {
    GPT model(c);
    GPTOptimizers optimizers = GPTOptimizers::make(gpt_param_groups(model, StepOptimizer::AdamW));
    const Tensor idx = zeros({B, T}, TensorOptions().dtype(DType::I64)), targets = idx;
    gpt_step(model, optimizers, nullptr, idx, targets, 0);
    return median_ms(steps, [&] { gpt_step(model, optimizers, nullptr, idx, targets, 0); });
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"bench_dry_run: the cost of a dry run and of predict_peak against a real step on the cpu"};
    int64_t batch = 16, seq = 1024, layers = 12;
    int real_steps = 1, repeat = 5;
    std::string json_path;
    app.add_option("--batch", batch, "rows B")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    app.add_option("--seq", seq, "positions T")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
    app.add_option("--layers", layers, "layers L")->check(CLI::Range(int64_t(1), int64_t(1) << 16));
    app.add_option("--real-steps", real_steps, "real steps timed")->check(CLI::Range(1, 1000));
    app.add_option("--repeat", repeat, "dry runs timed")->check(CLI::Range(1, 1000));
    app.add_option("--json", json_path, "write the results here");
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;
    }
    try {
        GPTConfig c = gpt_config("gpt2");
        c.n_layer = layers;
        c.n_embd = 1024;
        c.n_head = 16;
        c.vocab_size = 32768;
        c.block_size = std::max<int64_t>(seq, 1024);
        const MemorySettings settings = MemorySettings{};
        const GPTConfig model_config = with_settings(c, settings);
        std::printf("bench_dry_run: L %lld C 1024 NH 16 V 32768, B %lld T %lld, f32 on the cpu (%d threads)\n",
                    static_cast<long long>(layers), static_cast<long long>(batch), static_cast<long long>(seq),
                    get_num_threads());
        int64_t peak = 0;
        const double predict = median_ms(repeat, [&] { peak = predict_peak(c, settings, batch, seq); });
        double dry = 0;
        dry_run(Device::CPU, [&] { dry = step_ms(model_config, batch, seq, repeat); });
        std::printf("  dry      %10.2f ms a step (median of %d)\n", dry, repeat);
        std::printf("  predict  %10.2f ms (predict_peak: the model and two steps; peak %lld bytes)\n", predict,
                    static_cast<long long>(peak));
        std::fflush(stdout);
        const double real = step_ms(model_config, batch, seq, real_steps);
        std::printf("  real     %10.2f ms a step (median of %d)\n", real, real_steps);
        std::printf("dry / real %.5f, predict / real %.5f\n", dry / real, predict / real);
        if (!json_path.empty()) {
            nlohmann::json j = {{"batch", batch},       {"seq", seq},   {"layers", layers},
                                {"threads", get_num_threads()},    {"real_ms", real}, {"dry_ms", dry},
                                {"predict_ms", predict}, {"predicted_peak_bytes", peak},
                                {"dry_over_real", dry / real}, {"predict_over_real", predict / real}};
            std::ofstream(json_path) << j.dump(2) << "\n";
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_dry_run: %s\n", e.what());
        return 1;
    }
    return 0;
}
