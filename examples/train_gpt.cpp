// examples/train_gpt.cpp: the main job. Trains a byte-level pre-LN GPT on a UTF-8 text file (or
// on random tokens) and, with --policy both, trains it twice (same seed, same batches), once per
// norm save policy, then prints the memory each policy needed, side by side, with the saving the
// formula predicts. Runs on the cpu or a CUDA GPU (the default when one is visible).
//
// Dimensions: B batch (--batch), T sequence (--seq), C width (--embd), NH heads (--heads),
// L layers (--layers), V vocabulary (256 bytes; --vocab with --data random).
//
// Checkpoints: --save FILE writes the model, the AdamW state, the step, the batch generator's state
// and the run's config into one safetensors file (at the end, at --stop-at, and every
// --save-every steps); --resume FILE continues that run so that it trains exactly as the run that
// never stopped (bit for bit on the cpu). See Note [Resuming a run] below.
//
// Exit codes: 0 done; 1 a runtime error (with --detect-anomaly: the first op or backward node
// that produced a NaN or Inf, and the step), or measured saving != predicted saving; 2 bad
// flags, bad values, unreadable data or a checkpoint that cannot resume this run (one line on
// stderr).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <clocale>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>

#include "normtape.h"
#include "svg_chart.h"

using namespace normtape;
namespace fs = std::filesystem;

namespace {

struct Args {
    std::string data;  // empty: the project's own documentation and sources; "random": random tokens
    int64_t steps = 300, batch = 16, seq = 64, layers = 2, heads = 4, embd = 128, vocab = 256;
    std::string norm = "layer", policy = "both", device, dtype, preset;
    double lr = 3e-3;
    uint64_t seed = 1337;
    int64_t log_every = 50;
    std::string json, save, chart = "train_gpt.svg";
    bool detect_anomaly = false;
    std::string resume;      // checkpoint to continue from
    int64_t save_every = 0;  // also save every this many steps (0: only at the end)
    int64_t stop_at = 0;     // stop after this step of the --steps schedule (0: at --steps)
};

// Thrown for a bad flag value found after parsing; main prints it and exits 2.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UsageError("cannot read data file " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The default corpus: the project's README, docs and sources, found from the source tree, so
// that the demo runs offline on real text.
std::string default_corpus(std::string* description) {
    fs::path root = NORMTAPE_SOURCE_DIR;
    std::vector<fs::path> files;
    if (fs::exists(root / "README.md")) files.push_back(root / "README.md");
    for (const char* dir : {"docs", "core", "ops", "nn", "examples", "tests"}) {
        if (!fs::is_directory(root / dir)) continue;
        std::vector<fs::path> in_dir;
        for (const auto& e : fs::directory_iterator(root / dir))
            if (e.is_regular_file()) in_dir.push_back(e.path());
        std::sort(in_dir.begin(), in_dir.end());
        files.insert(files.end(), in_dir.begin(), in_dir.end());
    }
    std::string text;
    for (const fs::path& p : files) text += read_file(p.string());
    *description = "the project's README, docs and sources (" + std::to_string(files.size()) + " files in " +
                   root.string() + ")";
    return text;
}

// Random windows of the text: idx = text[s : s + T], targets = text[s + 1 : s + T + 1]; with an
// empty text, random tokens in [0, V). Batches are made on the host and copied to `device`.
class Batcher {
public:
    Batcher(const std::string& text, int64_t B, int64_t T, int64_t V, uint64_t seed, Device device)
        : text_(text), B_(B), T_(T), V_(V), rng_(seed), device_(device) {}
    // The generator's state (the standard text form of std::mt19937_64): where the run is in the
    // data, since every batch's windows are drawn from it.
    std::string state() const {
        std::ostringstream ss;
        ss << rng_;
        return ss.str();
    }
    // Throws UsageError when `s` is not a state written by state().
    void set_state(const std::string& s) {
        std::istringstream ss(s);
        std::mt19937_64 rng;
        ss >> rng;
        if (ss.fail()) throw UsageError("the checkpoint's batch generator state is malformed");
        rng_ = rng;
    }
    void next(Tensor* idx, Tensor* targets) {
        std::vector<int64_t> x(B_ * T_), y(B_ * T_);
        for (int64_t b = 0; b < B_; ++b) {
            if (text_.empty()) {
                for (int64_t t = 0; t < T_; ++t) {
                    x[b * T_ + t] = static_cast<int64_t>(rng_() % static_cast<uint64_t>(V_));
                    y[b * T_ + t] = static_cast<int64_t>(rng_() % static_cast<uint64_t>(V_));
                }
                continue;
            }
            uint64_t s = rng_() % (text_.size() - static_cast<uint64_t>(T_));
            for (int64_t t = 0; t < T_; ++t) {
                x[b * T_ + t] = static_cast<unsigned char>(text_[s + t]);
                y[b * T_ + t] = static_cast<unsigned char>(text_[s + t + 1]);
            }
        }
        TensorOptions opts = TensorOptions().device(device_);
        *idx = from_vector(x, {B_, T_}, opts);
        *targets = from_vector(y, {B_, T_}, opts);
    }

private:
    const std::string& text_;
    int64_t B_, T_, V_;
    std::mt19937_64 rng_;
    Device device_;
};

struct RunResult {
    SavePolicy policy;
    int64_t first_step = 0;  // > 0 when resumed: losses and step_ms start there
    int64_t saved_activation_bytes = 0, peak_allocated_bytes = 0, peak_reserved_bytes = 0;
    std::vector<double> losses, step_ms;
    double step_ms_median = 0, tokens_per_s = 0;
    std::vector<MemoryEvent> memory_trace;  // allocator events of one step (step 2)
    int64_t forward_allocs = 0;             // allocations of that step's forward
};

Device device_of(const Args& a) { return a.device == "cuda" ? Device::CUDA : Device::CPU; }
DType dtype_of(const Args& a) { return a.dtype == "bf16" ? DType::BF16 : DType::F32; }

GPTConfig make_config(const Args& a, SavePolicy policy) {
    GPTConfig c;
    c.vocab_size = a.vocab;
    c.block_size = a.seq;
    c.n_layer = a.layers;
    c.n_head = a.heads;
    c.n_embd = a.embd;
    c.norm = a.norm == "layer" ? NormKind::Layer : NormKind::RMS;
    c.policy = policy;
    c.dtype = dtype_of(a);
    c.device = device_of(a);
    return c;
}

// Linear warm-up over the first 10% of steps, then cosine decay to lr / 10.
double lr_at(const Args& a, int64_t step) {
    int64_t warmup = std::max<int64_t>(1, a.steps / 10);
    if (step < warmup) return a.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
    double progress = static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, a.steps - warmup));
    return a.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

// Note [Resuming a run]
// A resumed run trains bit for bit as the run that never stopped (on the cpu; CUDA kernels that
// sum with atomics are not bit-reproducible run to run) because everything that decides a step is
// restored from the checkpoint:
//  - the parameters, and AdamW's moments, step count and f32 master copies of bf16 parameters
//    (save_checkpoint / load_checkpoint with the optimizer, nn/checkpoint.h);
//  - the learning rate: lr_at() is a function of the step and --steps, so the step is saved and
//    --steps is part of the config (--stop-at ends a run early without changing its schedule);
//  - the batches: Batcher draws every window from its own std::mt19937_64, so that generator's
//    state is the position in the data; it is saved in the standard text form of the engine;
//  - the data: its size and FNV-1a hash are saved, and a resume on other data is refused.
// The global generator (manual_seed) only initializes weights, which the checkpoint replaces;
// nothing in a training step draws from it (no dropout). The run's config (data, steps, batch,
// seq, model, norm, policy, dtype, lr, seed) is saved as JSON in the metadata entry
// "train_gpt.config"; on --resume a flag left out takes the saved value and a flag given with
// another value is refused, naming both. The device is not part of it (a run may move to another
// device; bit for bit only on the same one). A checkpoint holds one run, so --resume, --stop-at
// and --save-every need --policy input or output.

uint64_t fnv1a64(const std::string& s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    return h;
}

std::string hex(uint64_t v) {
    char buf[20];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

// The config that identifies a run, saved in its checkpoints.
nlohmann::json run_config(const Args& a, SavePolicy policy, const std::string& text) {
    return {{"data", a.data},     {"data_bytes", text.size()}, {"data_fnv1a64", hex(fnv1a64(text))},
            {"steps", a.steps},   {"batch", a.batch},          {"seq", a.seq},
            {"layers", a.layers}, {"heads", a.heads},          {"embd", a.embd},
            {"vocab", a.vocab},   {"norm", a.norm},            {"policy", policy_name(policy)},
            {"dtype", a.dtype},   {"lr", a.lr},                {"seed", a.seed}};
}

// A train_gpt checkpoint read for --resume: its tensors (dropped once loaded), metadata, config
// and step.
struct ResumeState {
    std::string path;
    NamedTensors tensors;
    std::map<std::string, std::string> metadata;
    nlohmann::json config;
    int64_t step = 0;
};

ResumeState read_resume(const std::string& path) {
    ResumeState r;
    r.path = path;
    try {
        r.tensors = load_safetensors(path, &r.metadata);
    } catch (const IOError& e) {
        throw UsageError(std::string("--resume: ") + e.what());
    } catch (const FormatError& e) {
        throw UsageError(std::string("--resume: ") + e.what());
    }
    const std::string not_ours = "--resume " + path + ": not a train_gpt checkpoint with training state (one written by "
                                 "train_gpt --save)";
    for (const char* key : {"train_gpt.config", "train_gpt.step", "train_gpt.batcher", "optimizer"})
        if (r.metadata.count(key) == 0) throw UsageError(not_ours + ": no \"" + key + "\" metadata");
    r.config = nlohmann::json::parse(r.metadata["train_gpt.config"], nullptr, /*allow_exceptions=*/false);
    const std::string& step = r.metadata["train_gpt.step"];
    if (!r.config.is_object() || step.empty() || step.size() > 18 ||
        step.find_first_not_of("0123456789") != std::string::npos)
        throw UsageError(not_ours + ": malformed train_gpt.config or train_gpt.step");
    r.step = std::stoll(step);
    return r;
}

// Fills the flags the user left out from the checkpoint's config and refuses those given with
// another value (Note [Resuming a run]).
void apply_resume_config(const CLI::App& app, Args& a, const ResumeState& r) {
    auto take = [&](const char* flag, auto& field) {
        using T = std::decay_t<decltype(field)>;
        const char* key = flag + 2;
        T saved;
        try {
            saved = r.config.at(key).get<T>();
        } catch (const nlohmann::json::exception&) {
            throw UsageError("--resume " + r.path + ": the checkpoint's config has no valid \"" + key + "\"");
        }
        if (app.count(flag) == 0) field = saved;
        else if (field != saved)
            throw UsageError("--resume " + r.path + ": the checkpoint's run has " + flag + " " + nlohmann::json(saved).dump() +
                             ", this one asks for " + nlohmann::json(field).dump() +
                             " (a resumed run must be the same run: leave the flag out to take the checkpoint's)");
    };
    if (app.count("--policy") && a.policy == "both")
        throw UsageError("--resume continues one run: give --policy input or output (the checkpoint's is " +
                         r.config.value("policy", std::string("?")) + "), not both");
    take("--steps", a.steps);
    take("--batch", a.batch);
    take("--seq", a.seq);
    take("--layers", a.layers);
    take("--heads", a.heads);
    take("--embd", a.embd);
    take("--vocab", a.vocab);
    take("--norm", a.norm);
    take("--policy", a.policy);
    take("--dtype", a.dtype);
    take("--lr", a.lr);
    take("--seed", a.seed);
    // --data may name the same bytes by another path: run() compares the bytes' size and hash.
    if (app.count("--data") == 0) take("--data", a.data);
}

std::string mib(int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
    return buf;
}

std::string with_commas(int64_t v) {
    std::string s = std::to_string(v < 0 ? -v : v), out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (i && (s.size() - i) % 3 == 0) out += ',';
        out += s[i];
    }
    return v < 0 ? "-" + out : out;
}

// Records the device allocator's events into `trace` for its lifetime (stops even if the step
// throws).
class MemoryTraceScope {
public:
    MemoryTraceScope(Device device, std::vector<MemoryEvent>* trace) : device_(device), active_(trace != nullptr) {
        if (active_) set_memory_trace(device_, trace);
    }
    ~MemoryTraceScope() {
        if (active_) set_memory_trace(device_, nullptr);
    }
    MemoryTraceScope(const MemoryTraceScope&) = delete;
    MemoryTraceScope& operator=(const MemoryTraceScope&) = delete;

private:
    Device device_;
    bool active_;
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

RunResult train(const Args& a, const std::string& text, SavePolicy policy, ResumeState* resume) {
    using clock = std::chrono::steady_clock;
    const Device dev = device_of(a);
    manual_seed(a.seed);
    GPT model(make_config(a, policy));
    std::vector<ParamGroup> groups(2);  // weight decay for matrices only (GPT-2 / nanoGPT)
    groups[0].weight_decay = 0.1;
    groups[1].weight_decay = 0.0;
    for (const Tensor& p : model.parameters()) groups[p.dim() >= 2 ? 0 : 1].params.push_back(p);
    AdamWOptions opt;
    opt.lr = a.lr;
    opt.beta2 = 0.95;
    AdamW optimizer(groups, opt);
    Batcher batcher(text, a.batch, a.seq, a.vocab, a.seed, dev);
    int64_t start = 0;
    if (resume) {  // Note [Resuming a run]
        load_checkpoint(resume->path, resume->tensors, resume->metadata, model, &optimizer);
        resume->tensors.clear();  // copied into the model and the optimizer: free the host copies
        batcher.set_state(resume->metadata.at("train_gpt.batcher"));
        start = resume->step;
        std::printf("resumed from %s at step %lld\n", resume->path.c_str(), static_cast<long long>(start));
    }
    const int64_t end = a.stop_at > 0 ? a.stop_at : a.steps;
    auto save = [&](int64_t steps_done) {
        save_checkpoint(a.save, model,
                        {{"format", "normtape-gpt"}, {"policy", policy_name(policy)},
                         {"train_gpt.config", run_config(a, policy, text).dump()},
                         {"train_gpt.step", std::to_string(steps_done)}, {"train_gpt.batcher", batcher.state()}},
                        &optimizer);
        std::printf("checkpoint: %s (step %lld)\n", a.save.c_str(), static_cast<long long>(steps_done));
        std::fflush(stdout);
    };

    RunResult r;
    r.policy = policy;
    r.first_step = start;
    const int64_t trace_step = std::min<int64_t>(start + 1, end - 1);
    for (int64_t step = start; step < end; ++step) {
        Tensor idx, targets;
        batcher.next(&idx, &targets);
        synchronize(dev);
        reset_peak_memory_stats(dev);
        int64_t allocs_at_start = memory_stats(dev).num_allocs;
        double ms = 0;
        Tensor loss;
        try {
            MemoryTraceScope trace(dev, step == trace_step ? &r.memory_trace : nullptr);
            auto t0 = clock::now();
            loss = model.loss(idx, targets);
            if (step == trace_step) r.forward_allocs = memory_stats(dev).num_allocs - allocs_at_start;
            if (step == start) r.saved_activation_bytes = saved_bytes();
            loss.backward();
            clip_grad_norm_(model.parameters(), 1.0);
            optimizer.set_lr(lr_at(a, step));
            optimizer.step();
            optimizer.zero_grad();
            synchronize(dev);
            ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
        } catch (const AnomalyError& e) {  // say when, beside what and where
            throw AnomalyError(std::string(e.what()) + " (at step " + std::to_string(step + 1) + " of the " +
                               policy_name(policy) + " run)");
        }
        if (step == trace_step)
            for (MemoryEvent& e : r.memory_trace) e.num_allocs -= allocs_at_start;
        MemoryStats m = memory_stats(dev);
        r.peak_allocated_bytes = std::max(r.peak_allocated_bytes, m.peak_allocated_bytes);
        r.peak_reserved_bytes = std::max(r.peak_reserved_bytes, m.peak_reserved_bytes);
        r.losses.push_back(loss.item<float>());
        r.step_ms.push_back(ms);
        if (step % a.log_every == 0 || step == end - 1) {
            std::printf("[%-6s] step %5lld/%lld | loss %.4f | %8.0f tok/s | allocated %s | peak %s\n",
                        policy_name(policy), static_cast<long long>(step + 1), static_cast<long long>(a.steps),
                        r.losses.back(), static_cast<double>(a.batch * a.seq) / (ms / 1000.0),
                        mib(m.allocated_bytes).c_str(), mib(m.peak_allocated_bytes).c_str());
            std::fflush(stdout);
        }
        if (!a.save.empty() && a.save_every > 0 && (step + 1) % a.save_every == 0 && step + 1 < end) save(step + 1);
    }
    r.step_ms_median = median(r.step_ms);
    r.tokens_per_s = static_cast<double>(a.batch * a.seq) / (r.step_ms_median / 1000.0);
    if (output_policy_fallbacks() > 0)
        std::printf("note: %lld norm calls under the output policy saved their input (a |weight| < %g)\n",
                    static_cast<long long>(output_policy_fallbacks()), kOutputPolicyMinWeight);
    if (!a.save.empty()) save(end);
    return r;
}

void print_table(const Args& a, const std::vector<RunResult>& runs, int64_t predicted) {
    const RunResult &in = runs[0], &out = runs[1];
    std::printf("\nNorm save policies side by side (%s norm, L=%lld, B=%lld, T=%lld, C=%lld, V=%lld, %s on %s)\n",
                a.norm.c_str(), static_cast<long long>(a.layers), static_cast<long long>(a.batch),
                static_cast<long long>(a.seq), static_cast<long long>(a.embd), static_cast<long long>(a.vocab),
                a.dtype.c_str(), a.device.c_str());
    std::printf("%-34s %16s %16s %16s\n", "", "save input", "save output", "saving");
    auto row = [](const char* name, int64_t x, int64_t y) {
        std::printf("%-34s %16s %16s %16s\n", name, with_commas(x).c_str(), with_commas(y).c_str(),
                    with_commas(x - y).c_str());
    };
    row("saved activation bytes (tape)", in.saved_activation_bytes, out.saved_activation_bytes);
    std::printf("%-34s %16s %16s %16s  %s\n", "predicted saving, (2L+1) norms", "", "", with_commas(predicted).c_str(),
                predicted == in.saved_activation_bytes - out.saved_activation_bytes ? "= measured, to the byte"
                                                                                      : "!= measured");
    row("peak allocated bytes", in.peak_allocated_bytes, out.peak_allocated_bytes);
    if (a.device == "cuda") row("peak reserved bytes", in.peak_reserved_bytes, out.peak_reserved_bytes);
    double peak_ratio = static_cast<double>(in.peak_allocated_bytes - out.peak_allocated_bytes) / static_cast<double>(predicted);
    std::printf("%-34s %16s %16s %15.2f%%\n", "peak saving / predicted saving", "", "", 100.0 * peak_ratio);
    std::printf("%-34s %16.4f %16.4f\n", "final loss (nats)", in.losses.back(), out.losses.back());
    std::printf("%-34s %16.1f %16.1f\n", "median step time (ms)", in.step_ms_median, out.step_ms_median);
    std::printf("%-34s %16.0f %16.0f\n", "tokens/s", in.tokens_per_s, out.tokens_per_s);
    double worst = 0;
    for (size_t i = 0; i < in.losses.size(); ++i)
        worst = std::max(worst, std::abs(in.losses[i] - out.losses[i]) / std::abs(in.losses[i]));
    std::printf("largest relative difference between the two loss curves: %.2e\n", worst);
}

void write_chart(const Args& a, const std::vector<RunResult>& runs) {
    ChartPanel loss{"Training loss", "step", "loss (nats)", {}, {}};
    ChartPanel mem{"Allocated memory during one training step", "tensors allocated so far in the step", "allocated MiB",
                   {}, {}};
    const char* colors[] = {"#1f77b4", "#d62728"};
    for (size_t k = 0; k < runs.size(); ++k) {
        const RunResult& r = runs[k];
        std::string name = std::string("save ") + policy_name(r.policy);
        ChartSeries ls{name, colors[r.policy == SavePolicy::Output], {}, {}, r.policy == SavePolicy::Output};
        for (size_t i = 0; i < r.losses.size(); ++i) {
            ls.x.push_back(static_cast<double>(i + 1));
            ls.y.push_back(r.losses[i]);
        }
        loss.series.push_back(ls);
        ChartSeries ms{name, colors[r.policy == SavePolicy::Output], {}, {}, false};
        for (const MemoryEvent& e : r.memory_trace) {
            ms.x.push_back(static_cast<double>(e.num_allocs));
            ms.y.push_back(static_cast<double>(e.allocated_bytes) / (1 << 20));
        }
        mem.series.push_back(ms);
    }
    mem.markers.push_back({static_cast<double>(runs[0].forward_allocs), "forward | backward"});
    std::ofstream f(a.chart);
    if (!f) throw IOError("--chart: cannot open " + a.chart + " for writing");
    f << render_svg({loss, mem});
    std::printf("chart: %s\n", a.chart.c_str());
}

void write_json(const Args& a, const std::vector<RunResult>& runs, int64_t predicted, const std::string& data_desc,
                int64_t params) {
    nlohmann::json j;
    j["config"] = {{"data", data_desc}, {"steps", a.steps}, {"batch", a.batch}, {"seq", a.seq}, {"layers", a.layers},
                   {"heads", a.heads}, {"embd", a.embd}, {"vocab", a.vocab}, {"norm", a.norm}, {"policy", a.policy},
                   {"lr", a.lr}, {"seed", a.seed}, {"device", a.device}, {"dtype", a.dtype}, {"preset", a.preset},
                   {"parameters", params}, {"resume", a.resume}, {"stop_at", a.stop_at}};
    j["predicted_saving_bytes"] = predicted;
    if (runs.size() == 2) j["measured_saving_bytes"] = runs[0].saved_activation_bytes - runs[1].saved_activation_bytes;
    j["runs"] = nlohmann::json::array();
    for (const RunResult& r : runs)
        j["runs"].push_back({{"policy", policy_name(r.policy)}, {"norm", a.norm}, {"first_step", r.first_step},
                             {"saved_activation_bytes", r.saved_activation_bytes},
                             {"peak_allocated_bytes", r.peak_allocated_bytes},
                             {"peak_reserved_bytes", r.peak_reserved_bytes}, {"losses", r.losses},
                             {"step_ms_median", r.step_ms_median}, {"tokens_per_s", r.tokens_per_s}});
    std::ofstream f(a.json);
    if (!f) throw IOError("--json: cannot open " + a.json + " for writing");
    f << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

int run(const Args& a, ResumeState* resume) {
    std::string desc;
    std::string text;
    if (a.data == "random") desc = "random tokens in [0, " + std::to_string(a.vocab) + ")";
    else if (a.data.empty()) text = default_corpus(&desc);
    else text = read_file(desc = a.data);
    if (a.data != "random" && static_cast<int64_t>(text.size()) < a.seq + 2)
        throw UsageError("data " + desc + " has " + std::to_string(text.size()) + " bytes; --seq " +
                         std::to_string(a.seq) + " needs at least " + std::to_string(a.seq + 2));
    if (resume) {
        uint64_t want_bytes = resume->config.value("data_bytes", uint64_t{0});
        std::string want_hash = resume->config.value("data_fnv1a64", std::string());
        if (want_bytes != text.size() || want_hash != hex(fnv1a64(text)))
            throw UsageError("--resume " + resume->path + ": the data (" + desc + ", " + std::to_string(text.size()) +
                             " bytes, FNV-1a " + hex(fnv1a64(text)) + ") is not the checkpoint's run's (" +
                             std::to_string(want_bytes) + " bytes, FNV-1a " + want_hash + ")");
    }
    int64_t params = num_parameters(make_config(a, SavePolicy::Input));
    std::printf("train_gpt: %s norm, L=%lld NH=%lld C=%lld V=%lld, %s parameters; B=%lld T=%lld, %lld steps, lr %g, "
                "%s on %s\n",
                a.norm.c_str(), static_cast<long long>(a.layers), static_cast<long long>(a.heads),
                static_cast<long long>(a.embd), static_cast<long long>(a.vocab), with_commas(params).c_str(),
                static_cast<long long>(a.batch), static_cast<long long>(a.seq), static_cast<long long>(a.steps), a.lr,
                a.dtype.c_str(), a.device.c_str());
    std::printf("data: %s, %s bytes\n", desc.c_str(), with_commas(static_cast<int64_t>(text.size())).c_str());

    std::vector<SavePolicy> policies;
    if (a.policy != "output") policies.push_back(SavePolicy::Input);
    if (a.policy != "input") policies.push_back(SavePolicy::Output);
    std::vector<RunResult> runs;
    for (SavePolicy p : policies) runs.push_back(train(a, text, p, resume));

    int64_t predicted = predicted_saving_bytes(make_config(a, SavePolicy::Input), a.batch, a.seq);
    if (a.preset == "gpt2-medium-ish" && runs.size() == 2)
        std::printf("reference (PyTorch, same model in pure bf16, same GPU model, Apex memory-efficient LayerNorm): "
                    "peak 801.6 MiB lower, predicted 800 MiB; ours: predicted %.1f MiB, peak %.1f MiB lower\n",
                    static_cast<double>(predicted) / (1 << 20),
                    static_cast<double>(runs[0].peak_allocated_bytes - runs[1].peak_allocated_bytes) / (1 << 20));
    if (!a.json.empty()) write_json(a, runs, predicted, desc, params);
    if (runs.size() < 2) return 0;
    print_table(a, runs, predicted);
    write_chart(a, runs);
    if (runs[0].saved_activation_bytes - runs[1].saved_activation_bytes != predicted) {
        std::fprintf(stderr, "train_gpt: measured saving differs from the prediction\n");
        return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Args a;
    CLI::App app{"train_gpt: train a byte-level pre-LN GPT and compare the memory of the two norm save policies"};
    app.add_option("--data", a.data, "UTF-8 text file, or 'random' for random tokens (default: the project's README and sources)");
    app.add_option("--steps", a.steps, "training steps per policy")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    app.add_option("--batch", a.batch, "sequences per batch (B)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    app.add_option("--seq", a.seq, "sequence length (T)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
    app.add_option("--layers", a.layers, "transformer blocks (L)")->check(CLI::Range(int64_t{1}, int64_t{1024}));
    app.add_option("--heads", a.heads, "attention heads (NH)")->check(CLI::Range(int64_t{1}, int64_t{1024}));
    app.add_option("--embd", a.embd, "embedding width (C), divisible by --heads")->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
    app.add_option("--norm", a.norm, "layer or rms")->check(CLI::IsMember({"layer", "rms"}));
    app.add_option("--policy", a.policy, "input, output or both")->check(CLI::IsMember({"input", "output", "both"}));
    app.add_option("--lr", a.lr, "peak learning rate")->check(CLI::Range(1e-12, 1e6));
    app.add_option("--seed", a.seed, "seed for initialization and batches");
    app.add_option("--device", a.device, "cpu or cuda (default: cuda when a GPU is visible)")->check(CLI::IsMember({"cpu", "cuda"}));
    app.add_option("--dtype", a.dtype, "f32 or bf16 (default: bf16 on cuda, f32 on cpu)")->check(CLI::IsMember({"f32", "bf16"}));
    app.add_option("--vocab", a.vocab, "vocabulary size with --data random (otherwise 256 bytes)")->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
    app.add_option("--preset", a.preset, "gpt2-medium-ish: V=32768 T=1024 C=1024 NH=16 L=12 B=16 on random tokens")
        ->check(CLI::IsMember({"gpt2-medium-ish"}));
    app.add_option("--log-every", a.log_every, "steps between progress lines")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    app.add_option("--json", a.json, "write the results as JSON to this file");
    app.add_option("--save", a.save,
                   "write a checkpoint (safetensors: model, optimizer, step, data position, config) to this file at the "
                   "end (with --policy both: the output run's)");
    app.add_option("--save-every", a.save_every, "with --save, also write the checkpoint every N steps")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    app.add_option("--stop-at", a.stop_at,
                   "stop after this step; the learning-rate schedule still spans --steps, so --resume continues it")
        ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
    app.add_option("--resume", a.resume,
                   "continue the run saved in this checkpoint (flags left out take its values; others must match)");
    app.add_option("--chart", a.chart, "SVG chart of loss and memory (with --policy both)");
    app.add_flag("--detect-anomaly", a.detect_anomaly,
                 "stop at the first NaN or Inf that an op or a backward node produces, naming it (slow: checks every "
                 "output; on cuda copies each to the host)");
    try {
        app.parse(argc, argv);
        std::optional<ResumeState> resume;
        if (!a.resume.empty()) {
            if (!a.preset.empty()) throw UsageError("--resume takes the model from the checkpoint: leave out --preset");
            resume = read_resume(a.resume);
            apply_resume_config(app, a, *resume);
        }
        if (a.preset == "gpt2-medium-ish") {  // explicit flags win over the preset
            auto set = [&](const char* flag, int64_t& field, int64_t value) {
                if (app.count(flag) == 0) field = value;
            };
            set("--vocab", a.vocab, 32768);
            set("--seq", a.seq, 1024);
            set("--embd", a.embd, 1024);
            set("--heads", a.heads, 16);
            set("--layers", a.layers, 12);
            set("--batch", a.batch, 16);
            if (app.count("--data") == 0) a.data = "random";
        }
        if (a.device.empty()) a.device = cuda_is_available() ? "cuda" : "cpu";
        if (a.device == "cuda" && !cuda_is_available())
            throw UsageError(cuda_is_built() ? "--device cuda: no CUDA GPU is visible"
                                             : "--device cuda: this build of normtape has no CUDA backend");
        if (a.dtype.empty()) a.dtype = a.device == "cuda" ? "bf16" : "f32";
        if (a.data != "random" && a.vocab != 256)
            throw UsageError("--vocab " + std::to_string(a.vocab) + " needs --data random (text is read as 256 byte values)");
        if (a.embd % a.heads != 0)
            throw UsageError("--embd " + std::to_string(a.embd) + " is not divisible by --heads " + std::to_string(a.heads));
        if (a.save_every > 0 && a.save.empty()) throw UsageError("--save-every needs --save FILE");
        if ((resume || a.save_every > 0 || a.stop_at > 0) && a.policy == "both")
            throw UsageError("--resume, --stop-at and --save-every follow one run: give --policy input or output");
        if (a.stop_at > a.steps)
            throw UsageError("--stop-at " + std::to_string(a.stop_at) + " is past --steps " + std::to_string(a.steps));
        if (resume && resume->step >= (a.stop_at > 0 ? a.stop_at : a.steps))
            throw UsageError("--resume " + a.resume + ": the checkpoint is at step " + std::to_string(resume->step) +
                             ", nothing is left to train up to step " +
                             std::to_string(a.stop_at > 0 ? a.stop_at : a.steps));
        set_detect_anomaly(a.detect_anomaly);
        return run(a, resume ? &*resume : nullptr);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "train_gpt: %s (see --help)\n", e.what());
        return 2;
    } catch (const UsageError& e) {
        std::fprintf(stderr, "train_gpt: %s\n", e.what());
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
        return 1;
    }
}
