// examples/train_gpt/memory_sweep.cpp: the report of --memory-sweep (examples/train_gpt/memory_sweep.h).
#include "memory_sweep.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <stdexcept>

#include "nn/formats/json_read.h"
#include "report.h"
#include "run_config.h"
#include "svg_chart.h"

using namespace normtape;

std::vector<SweepReference> read_sweep_references(const std::vector<std::string>& paths) {
    std::vector<SweepReference> refs;
    for (const std::string& path : paths) {
        std::ifstream f(path, std::ios::binary);
        const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        nlohmann::json j;
        std::string why;
        try {
            if (!detail::parse_json(text, j, why)) throw UsageError(why);
            refs.push_back({j.value("mode", "eager") == "compile" ? "torch.compile" : "PyTorch eager",
                            j.at("step_ms").get<double>(), j.at("step_peak_bytes").get<int64_t>()});
        } catch (const std::exception& e) {
            throw UsageError("--sweep-reference " + path + ": not a JSON file of scripts/bench_torch_gpt.py (" +
                             e.what() + ")");
        }
    }
    return refs;
}

void mark_pareto(std::vector<SweepPoint>& points) {
    for (SweepPoint& p : points) {
        p.pareto = true;
        for (const SweepPoint& q : points)
            if ((q.peak <= p.peak && q.step_ms < p.step_ms) || (q.peak < p.peak && q.step_ms <= p.step_ms))
                p.pareto = false;
    }
}

void report_sweep(const Args& a, const std::vector<SweepPoint>& points, const std::vector<SweepReference>& refs,
                  int64_t budget) {
    std::printf("memory sweep: %zu settings, %lld steps each (* the Pareto front: nothing both faster and smaller; "
                "> the planner's pick)\n",
                points.size(), static_cast<long long>(a.steps));
    std::printf("  %-52s %16s %16s %8s %9s %9s\n", "setting", "peak (bytes)", "predicted", "pred/meas", "step ms",
                "predicted");
    for (const SweepPoint& p : points)
        std::printf("%c%c%-52s %16s %16s %8.4f %9.2f %9.2f\n", p.pick ? '>' : ' ', p.pareto ? '*' : ' ',
                    p.label.c_str(), with_commas(p.peak).c_str(), with_commas(p.predicted_peak).c_str(),
                    static_cast<double>(p.predicted_peak) / static_cast<double>(std::max<int64_t>(p.peak, 1)), p.step_ms,
                    p.predicted_step_ms);
    for (const SweepReference& r : refs)
        std::printf("  %-52s %16s %16s %8s %9.2f\n", r.label.c_str(), with_commas(r.peak).c_str(), "-", "-", r.step_ms);

    if (!a.json.empty()) {
        nlohmann::json rows = nlohmann::json::array();
        for (const SweepPoint& p : points)
            rows.push_back({{"label", p.label},
                            {"policy", policy_name(p.settings.policy)},
                            {"recompute_activation", p.settings.recompute_activation},
                            {"fused_head_loss", p.settings.fused_head_loss},
                            {"checkpoint_every", p.settings.checkpoint_every},
                            {"offload", p.settings.offload},
                            {"micro_batch", p.settings.micro_batch},
                            {"predicted_peak_bytes", p.predicted_peak},
                            {"peak_allocated_bytes", p.peak},
                            {"predicted_step_ms", p.predicted_step_ms},
                            {"step_ms", p.step_ms},
                            {"pareto", p.pareto},
                            {"pick", p.pick}});
        nlohmann::json references = nlohmann::json::array();
        for (const SweepReference& r : refs)
            references.push_back({{"label", r.label}, {"step_ms", r.step_ms}, {"peak_allocated_bytes", r.peak}});
        const nlohmann::json j = {{"config",
                                   {{"arch", a.arch}, {"batch", a.batch}, {"seq", a.seq}, {"layers", a.layers},
                                    {"heads", a.heads}, {"embd", a.embd}, {"vocab", a.vocab}, {"dtype", a.dtype},
                                    {"device", a.device}, {"steps", a.steps}}},
                                  {"budget_bytes", budget},
                                  {"sweep", rows},
                                  {"references", references}};
        std::ofstream out(a.json);
        out << j.dump(1) << "\n";
        if (!out) throw std::runtime_error("--json " + a.json + ": cannot write the file");
    }

    ChartPanel panel;
    panel.title = "Step time against peak memory, " + std::to_string(points.size()) + " settings";
    panel.x_label = "peak allocated in a step (GiB)";
    panel.y_label = "step time (ms)";
    auto gib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 30); };
    ChartSeries all{"every setting", "#bbbbbb", {}, {}, false, true, {}};
    ChartSeries front{"Pareto front", "#1f77b4", {}, {}, false, false, {}};
    ChartSeries front_points{"", "#1f77b4", {}, {}, false, true, {}};
    ChartSeries pick{"planner's pick", "#d62728", {}, {}, false, true, {}};
    std::vector<const SweepPoint*> sorted;
    for (const SweepPoint& p : points) {
        all.x.push_back(gib(p.peak));
        all.y.push_back(p.step_ms);
        if (p.pareto) sorted.push_back(&p);
        if (p.pick) {
            pick.x.push_back(gib(p.peak));
            pick.y.push_back(p.step_ms);
            pick.labels.push_back(p.label);
        }
    }
    std::sort(sorted.begin(), sorted.end(), [](const SweepPoint* l, const SweepPoint* r) { return l->peak < r->peak; });
    for (const SweepPoint* p : sorted) {
        front.x.push_back(gib(p->peak));
        front.y.push_back(p->step_ms);
        front_points.x.push_back(gib(p->peak));
        front_points.y.push_back(p->step_ms);
        front_points.labels.push_back(p->label);
    }
    panel.series = {all, front, front_points};
    if (!pick.x.empty()) panel.series.push_back(pick);
    const char* colors[] = {"#2ca02c", "#9467bd"};
    for (size_t i = 0; i < refs.size(); ++i)
        panel.series.push_back(
            {refs[i].label, colors[i % 2], {gib(refs[i].peak)}, {refs[i].step_ms}, false, true, {refs[i].label}});
    if (budget > 0) panel.markers.push_back({gib(budget), "budget"});
    std::ofstream chart(a.chart);
    chart << render_svg({panel}, 900, 560);
    if (!chart) throw std::runtime_error("--chart " + a.chart + ": cannot write the file");
    std::printf("chart: %s\n", a.chart.c_str());
}

int sweep(const Args& a, int64_t budget, const std::function<RunResult(const Args& run, SavePolicy policy)>& train) {
    const GPTConfig config = make_config(a, SavePolicy::Input);
    const std::vector<SweepReference> refs = read_sweep_references(a.sweep_reference);
    const StepCostModel costs = calibrate_step_costs(config, a.batch, a.seq);
    std::optional<MemoryBudgetPlan> plan;
    const StepOptimizer optimizer = settings_of(a, SavePolicy::Input).optimizer;
    if (budget > 0) {
        plan = plan_memory(config, budget, a.batch, a.seq, costs, optimizer);
        if (!plan->fits) throw UsageError("--memory-budget " + a.memory_budget + ": " + plan->advice);
    }
    std::vector<SweepPoint> points;
    for (const MemorySettings& s : memory_settings_grid(config, a.batch, optimizer)) {
        SweepPoint p{s, settings_label(s), predict_peak(config, s, a.batch, a.seq), 0,
                     predict_step_ms(config, s, a.batch, a.seq, costs), 0, false, false};
        if (budget > 0 && p.predicted_peak > budget) continue;
        Args run = a;
        set_settings(run, s);
        run.log_every = run.steps;  // the last step's line only
        run.sample = 0;
        std::printf("--- memory sweep %zu: %s\n", points.size() + 1, p.label.c_str());
        const RunResult r = train(run, s.policy);
        p.peak = r.peak_allocated_bytes;
        p.step_ms = r.step_ms_median;
        p.pick = plan && plan->fits && settings_label(plan->settings) == p.label;
        points.push_back(p);
    }
    mark_pareto(points);
    report_sweep(a, points, refs, budget);
    for (const SweepPoint& p : points)
        if (p.peak > p.predicted_peak) {
            std::fprintf(stderr, "train_gpt: the measured peak of %s, %lld bytes, exceeds its prediction %lld\n",
                         p.label.c_str(), static_cast<long long>(p.peak), static_cast<long long>(p.predicted_peak));
            return 1;
        }
    return 0;
}

void plan_budget(Args& a, int64_t budget) {
    const MemoryBudgetPlan plan = plan_memory(make_config(a, SavePolicy::Input), budget, a.batch, a.seq,
                                              settings_of(a, SavePolicy::Input).optimizer);
    if (!plan.fits) throw UsageError("--memory-budget " + a.memory_budget + ": " + plan.advice);
    set_settings(a, plan.settings);
    std::printf("memory plan for %s bytes (--memory-budget %s): %s; predicted peak %s bytes, predicted step %.1f ms\n",
                with_commas(budget).c_str(), a.memory_budget.c_str(), settings_label(plan.settings).c_str(),
                with_commas(plan.predicted_peak).c_str(), plan.predicted_step_ms);
}
