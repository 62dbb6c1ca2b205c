// examples/train_gpt/report.cpp: train_gpt's report (examples/train_gpt/report.h): the side-by-side table, the JSON
// file and the chart's panels. Not here: the SVG writer (examples/train_gpt/svg_chart.cpp).
#include "report.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "saved_categories.h"
#include "svg_chart.h"

using namespace normtape;

namespace {

// Writes `text` to `path` (named by `flag` in messages); IOError with the system's reason.
void write_file(const char* flag, const std::string& path, const std::string& text) {
    auto fail = [&] { throw IOError(std::string(flag) + " " + path + ": cannot write: " + std::strerror(errno)); };
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) fail();
    bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
    int err = errno;
    if (std::fclose(f) != 0 && ok) fail();
    errno = err;
    if (!ok) fail();
}

}  // namespace

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

std::string micro_batches_of(const Args& a) {
    return micro_batch(a) < a.batch ? " (micro-batches of " + std::to_string(micro_batch(a)) + ")" : "";
}

void print_phase_times(const RunResult& r) {
    std::printf("[%-6s] median per step over %lld step%s: forward %.2f ms | backward %.2f ms | optimizer %.2f ms "
                "(%s)\n",
                policy_name(r.policy), static_cast<long long>(r.phase_median_steps),
                r.phase_median_steps == 1 ? "" : "s", r.phase_ms_median[0], r.phase_ms_median[1], r.phase_ms_median[2],
                r.phase_timing.c_str());
    if (r.phase_timing == "cuda events")  // where the host takes as long, the GPU waits for it
        std::printf("[%-6s] the host queued them in: forward %.2f ms | backward %.2f ms | optimizer %.2f ms\n",
                    policy_name(r.policy), r.host_ms_median[0], r.host_ms_median[1], r.host_ms_median[2]);
}

double bits_per_byte(const RunResult& r, double nats) { return nats / (std::log(2.0) * r.val_bytes_per_token); }

bool record_val_loss(RunResult& r, int64_t step, int64_t steps, double v) {
    r.val_steps.push_back(step);
    r.val_losses.push_back(v);
    const bool best = std::isfinite(v) && (std::isnan(r.best_val_loss) || v < r.best_val_loss);
    if (best) {
        r.best_val_loss = v;
        r.best_val_step = step;
    }
    char bpb[48] = "";
    if (std::isfinite(r.val_bytes_per_token)) std::snprintf(bpb, sizeof bpb, " (%.4f bits per byte)", bits_per_byte(r, v));
    std::printf("[%-6s] step %5lld/%lld | val loss %.4f%s%s\n", policy_name(r.policy), static_cast<long long>(step),
                static_cast<long long>(steps), v, bpb, best ? " (best)" : "");
    return best;
}

void print_optimizer_state(const RunResult& r, const Muon* muon) {
    std::printf("[%-6s] optimizer state: AdamW moments %s bytes, Muon momentum %s bytes, f32 masters %s bytes "
                "(predicted %s and %s: %s)\n",
                policy_name(r.policy), with_commas(r.adamw_moment_bytes).c_str(), with_commas(r.muon_momentum_bytes).c_str(),
                with_commas(r.master_bytes).c_str(), with_commas(r.predicted_adamw_moment_bytes).c_str(),
                with_commas(r.predicted_muon_momentum_bytes).c_str(),
                r.adamw_moment_bytes == r.predicted_adamw_moment_bytes &&
                        r.muon_momentum_bytes == r.predicted_muon_momentum_bytes
                    ? "= measured"
                    : "differs");
    if (!muon) return;
    int64_t as_adamw = 0;  // AdamW's m and v for the same matrices (stat_dtype each)
    for (const Tensor& p : muon->groups()[0].params)
        as_adamw += 2 * p.numel() * static_cast<int64_t>(element_size(stat_dtype(p.dtype())));
    std::printf("[%-6s] Muon keeps %s bytes of momentum for its matrices, where AdamW would keep %s bytes of "
                "moments: %.2f of AdamW's\n",
                policy_name(r.policy), with_commas(r.muon_momentum_bytes).c_str(), with_commas(as_adamw).c_str(),
                static_cast<double>(r.muon_momentum_bytes) / static_cast<double>(std::max<int64_t>(as_adamw, 1)));
}

void print_preset_reference(const Args& a, const std::vector<RunResult>& runs, int64_t predicted) {
    if (a.preset == "gpt2-medium-ish" && runs.size() >= 2 && micro_batch(a) == a.batch)
        std::printf("reference (PyTorch, same model in pure bf16, same GPU model, Apex memory-efficient LayerNorm): "
                    "peak 801.6 MiB lower, predicted 800 MiB; ours: predicted %.1f MiB, peak %.1f MiB lower\n",
                    static_cast<double>(predicted) / (1 << 20),
                    static_cast<double>(runs[0].peak_allocated_bytes - runs[1].peak_allocated_bytes) / (1 << 20));
}

void print_table(const Args& a, const std::vector<RunResult>& runs, int64_t predicted) {
    const RunResult &in = runs[0], &out = runs[1];
    std::printf("\nNorm save policies side by side (%s norm, L=%lld, B=%lld%s, T=%lld, C=%lld, V=%lld, %s on %s)\n",
                a.norm.c_str(), static_cast<long long>(a.layers), static_cast<long long>(a.batch),
                micro_batches_of(a).c_str(), static_cast<long long>(a.seq), static_cast<long long>(a.embd),
                static_cast<long long>(a.vocab), a.dtype.c_str(), a.device.c_str());
    std::printf("%-34s %16s %16s %16s\n", "", "save input", "save output", "saving");
    auto row = [](const char* name, int64_t x, int64_t y) {
        std::printf("%-34s %16s %16s %16s\n", name, with_commas(x).c_str(), with_commas(y).c_str(),
                    with_commas(x - y).c_str());
    };
    const bool checkpointing = a.checkpoint == "blocks";
    row("saved activation bytes (tape)", in.saved_activation_bytes, out.saved_activation_bytes);
    row(("  of them on " + a.device).c_str(), in.saved_on_device_bytes, out.saved_on_device_bytes);
    if (checkpointing)
        std::printf("%-34s %16s %16s %16s  %s\n", "predicted saving, the norm inputs", "", "", with_commas(predicted).c_str(),
                    "not checked: with --checkpoint blocks the blocks keep only their inputs");
    else
        std::printf("%-34s %16s %16s %16s  %s\n", "predicted saving, the norm inputs", "", "", with_commas(predicted).c_str(),
                    predicted == in.saved_activation_bytes - out.saved_activation_bytes ? "= measured, to the byte"
                                                                                          : "!= measured");
    row("peak allocated bytes", in.peak_allocated_bytes, out.peak_allocated_bytes);
    if (a.device == "cuda") row("peak reserved bytes", in.peak_reserved_bytes, out.peak_reserved_bytes);
    double peak_ratio = static_cast<double>(in.peak_allocated_bytes - out.peak_allocated_bytes) / static_cast<double>(predicted);
    if (!checkpointing)
        std::printf("%-34s %16s %16s %15.2f%%\n", "peak saving / predicted saving", "", "", 100.0 * peak_ratio);
    std::printf("%-34s %16.4f %16.4f\n", "final loss (nats)", in.losses.back(), out.losses.back());
    if (!in.val_losses.empty() && !out.val_losses.empty())
        std::printf("%-34s %16.4f %16.4f\n", "best validation loss (nats)", in.best_val_loss, out.best_val_loss);
    std::printf("%-34s %16.1f %16.1f\n", "median step time (ms)", in.step_ms_median, out.step_ms_median);
    std::printf("%-34s %16.0f %16.0f\n", "tokens/s", in.tokens_per_s, out.tokens_per_s);
    double worst = 0;
    for (size_t i = 0; i < in.losses.size(); ++i)
        worst = std::max(worst, std::abs(in.losses[i] - out.losses[i]) / std::abs(in.losses[i]));
    std::printf("largest relative difference between the two loss curves: %.2e\n", worst);
    // --policy all: the normalized run, against the input run.
    for (size_t k = 2; k < runs.size(); ++k) {
        const RunResult& r = runs[k];
        double diff = 0;
        for (size_t i = 0; i < in.losses.size() && i < r.losses.size(); ++i)
            diff = std::max(diff, std::abs(in.losses[i] - r.losses[i]) / std::abs(in.losses[i]));
        const int64_t saving = in.saved_activation_bytes - r.saved_activation_bytes;
        std::printf("save %s: saved activation bytes %s (%s on %s; saving %s, %s), peak allocated bytes %s, final loss "
                    "%.4f, median step %.1f ms, largest relative difference from the input run's loss curve %.2e\n",
                    policy_name(r.policy), with_commas(r.saved_activation_bytes).c_str(),
                    with_commas(r.saved_on_device_bytes).c_str(), a.device.c_str(), with_commas(saving).c_str(),
                    checkpointing ? "not checked with --checkpoint blocks"
                    : predicted == saving ? "= predicted, to the byte"
                                          : "!= predicted",
                    with_commas(r.peak_allocated_bytes).c_str(), r.losses.back(), r.step_ms_median, diff);
    }
}

void print_saved_bytes(const Args& a, const std::vector<RunResult>& runs) {
    for (const RunResult& r : runs)
        std::printf("[%-6s] saved activation bytes (tape) after the first forward: %s, %s of them on %s; median step "
                    "time %.1f ms\n",
                    policy_name(r.policy), with_commas(r.saved_activation_bytes).c_str(),
                    with_commas(r.saved_on_device_bytes).c_str(), a.device.c_str(), r.step_ms_median);
}

bool print_saved_prediction(const Args& a, const std::vector<RunResult>& runs) {
    const char* what = a.checkpoint == "blocks" ? "checkpointed blocks: " : "";
    const char* formula = a.checkpoint == "blocks" ? "L block inputs + what the ops outside the blocks save"
                                                   : "predicted_saved_bytes, every tensor the graph saves";
    bool ok = true;
    for (const RunResult& r : runs) {
        const int64_t predicted = r.predicted_saved_bytes;
        if (a.offload == "on") {
            std::printf("[%-6s] %ssaved activation bytes %s, %s of them on %s (the prediction, %s, is checked with "
                        "--offload off)\n",
                        policy_name(r.policy), what, with_commas(r.saved_activation_bytes).c_str(),
                        with_commas(r.saved_on_device_bytes).c_str(), a.device.c_str(), with_commas(predicted).c_str());
            continue;
        }
        const bool equal = r.saved_activation_bytes == predicted;
        ok = ok && equal;
        std::printf("[%-6s] %ssaved activation bytes %s, predicted %s (%s), %s\n", policy_name(r.policy), what,
                    with_commas(r.saved_activation_bytes).c_str(), with_commas(predicted).c_str(), formula,
                    equal ? "= measured, to the byte" : "!= measured");
    }
    return ok;
}

void print_recompute(const Args& a, const std::vector<RunResult>& runs, int64_t predicted) {
    if (a.checkpoint == "blocks" && a.recompute_activation == "on") {
        std::printf("activation recompute: not measured with --checkpoint blocks (the blocks keep only their inputs, so it "
                    "changes no byte saved by the forward)\n");
        return;
    }
    if (predicted == 0) return;
    for (const RunResult& r : runs)
        std::printf("[%-6s] activation recompute: saved activation bytes %s lower, predicted %s (L * B*T*H elements), "
                    "%s\n",
                    policy_name(r.policy), with_commas(r.recompute_saving_bytes).c_str(),
                    with_commas(predicted).c_str(),
                    r.recompute_saving_bytes == predicted ? "= measured, to the byte" : "!= measured");
}

namespace {
// The event of the highest allocated bytes in `trace` (the first of equals), or nullptr.
const MemoryEvent* peak_event(const std::vector<MemoryEvent>& trace) {
    auto peak = std::max_element(trace.begin(), trace.end(), [](const MemoryEvent& x, const MemoryEvent& y) {
        return x.allocated_bytes < y.allocated_bytes;
    });
    return peak == trace.end() ? nullptr : &*peak;
}
}  // namespace

std::string step_peak(const std::vector<MemoryEvent>& trace) {
    const MemoryEvent* peak = peak_event(trace);
    if (!peak) return "";
    const std::string where = peak->scope && !peak->scope->empty() ? *peak->scope : "outside the modules";
    return mib(peak->allocated_bytes) + " in " + (peak->backward ? "backward, " : "forward, ") +
           (peak->node ? std::string(peak->node) + " (" + where + ")" : where);
}

void write_chart(const Args& a, const std::vector<RunResult>& runs) {
    ChartPanel loss{"Training and validation loss", "step", "loss (nats)", {}, {}};
    ChartPanel mem{"Allocated memory during one training step", "tensors allocated so far in the step", "allocated MiB",
                   {}, {}};
    // The held-out loss in bits per byte, comparable across vocabularies (not for a token file's ids).
    ChartPanel bpb{"Held-out loss in bits per byte", "step", "bits per byte", {}, {}};
    const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c"};  // by SavePolicy: input, output, normalized
    for (size_t k = 0; k < runs.size(); ++k) {
        const RunResult& r = runs[k];
        std::string name = std::string("save ") + policy_name(r.policy);
        const char* color = colors[static_cast<int>(r.policy)];
        ChartSeries ls{name, color, {}, {}, r.policy != SavePolicy::Input};
        for (size_t i = 0; i < r.losses.size(); ++i) {
            if (!std::isfinite(r.losses[i])) continue;
            ls.x.push_back(static_cast<double>(r.first_step + static_cast<int64_t>(i) + 1));
            ls.y.push_back(r.losses[i]);
        }
        loss.series.push_back(ls);
        if (!r.val_losses.empty()) {  // validation: the same color, dashed
            ChartSeries vs{name + " (validation)", color, {}, {}, true};
            for (size_t i = 0; i < r.val_losses.size(); ++i) {
                if (!std::isfinite(r.val_losses[i])) continue;
                vs.x.push_back(static_cast<double>(r.val_steps[i]));
                vs.y.push_back(r.val_losses[i]);
            }
            loss.series.push_back(vs);
            if (std::isfinite(r.val_bytes_per_token)) {
                for (double& y : vs.y) y = bits_per_byte(r, y);
                vs.name = name;
                bpb.series.push_back(vs);
            }
        }
        if (r.nonfinite_step > 0)
            loss.markers.push_back({static_cast<double>(r.nonfinite_step), name + ": loss non-finite from here"});
        ChartSeries ms{name, color, {}, {}, false};
        for (const MemoryEvent& e : r.memory_trace) {
            ms.x.push_back(static_cast<double>(e.num_allocs));
            ms.y.push_back(static_cast<double>(e.allocated_bytes) / (1 << 20));
        }
        mem.series.push_back(ms);
        if (const MemoryEvent* peak = peak_event(r.memory_trace))  // where the step's peak is (core/named_scope.h)
            mem.markers.push_back({static_cast<double>(peak->num_allocs), name + " peak: " + step_peak(r.memory_trace)});
    }
    mem.markers.push_back({static_cast<double>(runs[0].forward_allocs), "forward | backward"});
    // One stacked bar per run: what its first forward saved, by category.
    BarPanel saved{"Saved for backward after the first forward", "saved MiB", {}, {}, {}};
    const char* category_colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728", "#8c564b", "#7f7f7f"};
    static_assert(std::size(category_colors) == kSavedCategories.size());
    for (size_t c = 0; c < kSavedCategories.size(); ++c) {
        saved.categories.push_back(kSavedCategories[c]);
        saved.colors.push_back(category_colors[c]);
    }
    for (const RunResult& r : runs) {
        ChartBar bar{std::string("save ") + policy_name(r.policy), {}};
        for (const auto& [name, bytes] : saved_bytes_by_category(r.saved_report))
            bar.values.push_back(static_cast<double>(bytes) / (1 << 20));
        saved.bars.push_back(bar);
    }
    std::vector<Panel> panels = {loss};
    if (!bpb.series.empty()) panels.push_back(bpb);
    panels.insert(panels.end(), {mem, saved});
    write_file("--chart", a.chart, render_svg(panels));
    std::printf("chart: %s\n", a.chart.c_str());
}

void write_json(const Args& a, const std::vector<RunResult>& runs, const Predicted& predicted,
                const std::string& data_desc, int64_t params) {
    nlohmann::json j;
    j["config"] = {{"data", data_desc}, {"steps", a.steps}, {"batch", a.batch}, {"seq", a.seq}, {"layers", a.layers},
                   {"heads", a.heads}, {"embd", a.embd}, {"vocab", a.vocab}, {"norm", a.norm}, {"policy", a.policy},
                   {"recompute_activation", a.recompute_activation == "on"}, {"lr", a.lr}, {"seed", a.seed},
                   {"device", a.device}, {"dtype", a.dtype}, {"preset", a.preset}, {"parameters", params},
                   {"resume", a.resume}, {"stop_at", a.stop_at}, {"on_nan", a.on_nan}, {"optimizer", a.optimizer},
                   {"val_fraction", a.val_fraction}, {"eval_every", a.eval_every},
                   {"eval_batches", a.eval_batches}, {"save_best", a.save_best}, {"offload", a.offload == "on"},
                   {"checkpoint", a.checkpoint}, {"micro_batch", micro_batch(a)},
                   {"fused_loss", a.fused_loss == "on"}, {"processes", a.world_size},
                   {"shard_optimizer", a.shard_optimizer == "on"}, {"cuda_graph", a.cuda_graph == "on"}};  // batch: each process's rows
    j["predicted_saving_bytes"] = predicted.norm_policy;
    j["predicted_recompute_saving_bytes"] = predicted.recompute;
    if (runs.size() == 2) j["measured_saving_bytes"] = runs[0].saved_activation_bytes - runs[1].saved_activation_bytes;
    j["runs"] = nlohmann::json::array();
    for (const RunResult& r : runs) {
        nlohmann::json run = {{"policy", policy_name(r.policy)}, {"norm", a.norm}, {"first_step", r.first_step},
                              {"nonfinite_step", r.nonfinite_step},
                              {"saved_activation_bytes", r.saved_activation_bytes},
                              {"recompute_saving_bytes", r.recompute_saving_bytes},
                              {"peak_allocated_bytes", r.peak_allocated_bytes},
                              {"predicted_peak_bytes", r.predicted_peak_bytes},
                              {"peak_reserved_bytes", r.peak_reserved_bytes}, {"losses", r.losses},
                              {"step_ms_median", r.step_ms_median}, {"tokens_per_s", r.tokens_per_s},
                              {"model_flops_per_step", r.model_flops_per_step},
                              {"mfu", std::isnan(r.mfu) ? nlohmann::json() : nlohmann::json(r.mfu)},
                              {"train_seconds", r.train_seconds},
                              {"forward_ms", r.phase_ms_median[0]}, {"backward_ms", r.phase_ms_median[1]},
                              {"optimizer_ms", r.phase_ms_median[2]}, {"phase_median_steps", r.phase_median_steps},
                              {"host_forward_ms", r.host_ms_median[0]}, {"host_backward_ms", r.host_ms_median[1]},
                              {"host_optimizer_ms", r.host_ms_median[2]},
                              {"phase_timing", r.phase_timing}, {"val_steps", r.val_steps},
                              {"val_losses", r.val_losses}, {"best_val_loss", r.best_val_loss},
                              {"best_val_step", r.best_val_step}};
        // The held-out losses in bits per byte, where the data's bytes per token are known.
        if (std::isfinite(r.val_bytes_per_token)) {
            std::vector<double> bpb;
            for (double v : r.val_losses) bpb.push_back(bits_per_byte(r, v));
            run["val_bytes_per_token"] = r.val_bytes_per_token;
            run["val_bpb"] = bpb;
            run["best_val_bpb"] = std::isnan(r.best_val_loss) ? nlohmann::json()
                                                              : nlohmann::json(bits_per_byte(r, r.best_val_loss));
        }
        run["saved_bytes_on_device"] = r.saved_on_device_bytes;
        run["step_peak"] = step_peak(r.memory_trace);
        run["predicted_saved_bytes"] = r.predicted_saved_bytes;
        run["optimizer_state"] = {{"adamw_moment_bytes", r.adamw_moment_bytes},
                                  {"muon_momentum_bytes", r.muon_momentum_bytes},
                                  {"master_bytes", r.master_bytes},
                                  {"predicted_adamw_moment_bytes", r.predicted_adamw_moment_bytes},
                                  {"predicted_muon_momentum_bytes", r.predicted_muon_momentum_bytes}};
        run["saved_bytes_by_category"] = nlohmann::json::object();
        for (const auto& [name, bytes] : saved_bytes_by_category(r.saved_report))
            run["saved_bytes_by_category"][name] = bytes;
        run["saved_tensors_report"] = nlohmann::json::parse(r.saved_report.json(-1));
        if (&r != &runs[0] && runs[0].policy == SavePolicy::Input)
            run["measured_saving_bytes"] = runs[0].saved_activation_bytes - r.saved_activation_bytes;
        j["runs"].push_back(run);
    }
    write_file("--json", a.json, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

// x * 0 sums to 0 for finite x, to NaN when one x is NaN or Inf.
std::string nonfinite_parameter(const Module& model) {
    NoGradGuard no_grad;
    for (const auto& [name, p] : model.named_parameters())
        if (!std::isfinite(sum(scale(p, 0.0)).to(DType::F32).item<float>())) return name;
    return "";
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    size_t n = v.size();
    return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

void print_sample(GPT& model, SavePolicy policy, int64_t tokens, uint64_t seed, const Tokenizer* tokenizer) {
    model.eval();
    SamplingOptions options;
    options.temperature = 0.8;
    options.top_k = 200;
    options.seed = seed;
    std::printf("[%-6s] a sample of %lld %s (temperature 0.8, top-k 200):\n", policy_name(policy),
                static_cast<long long>(tokens), tokenizer ? "tokens" : "bytes");
    std::vector<int64_t> prompt = {'\n'};
    if (tokenizer) prompt.assign(1, tokenizer->encode_ordinary("\n").at(0));
    generate(model, prompt, tokens, options, [&](int64_t token) {
        if (!tokenizer) {
            std::putchar(static_cast<int>(token));
        } else if (token < tokenizer->vocab_size()) {
            try {
                const std::string bytes = tokenizer->decode({static_cast<uint32_t>(token)});
                std::fwrite(bytes.data(), 1, bytes.size(), stdout);
            } catch (const Error&) {  // no token: nothing to print
            }
        }
    });
    std::printf("\n");
    model.train();
}
