// examples/train_gpt/memory_sweep.h: the report of train_gpt --memory-sweep: every memory setting's
// predicted and measured peak and step time as a table on stdout, in the JSON file (--json) and
// as the Pareto front of step time against peak in the SVG chart (--chart), the planner's pick
// marked and PyTorch's steps (--sweep-reference) beside them; the sweep's loop and --memory-budget's
// plan. Not here: the training run (examples/train_gpt/train_gpt.cpp), the planner
// (nn/memory/memory_budget.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "normtape.h"
#include "report.h"
#include "train_args.h"

// One setting of the sweep, trained for --steps steps.
struct SweepPoint {
    normtape::MemorySettings settings;
    std::string label;              // settings_label
    int64_t predicted_peak = 0;     // predict_peak, bytes
    int64_t peak = 0;               // the highest peak_allocated_bytes of its steps, bytes
    double predicted_step_ms = 0;   // predict_step_ms
    double step_ms = 0;             // the median step's wall time, ms
    bool pareto = false;            // no other point is both faster and smaller
    bool pick = false;              // the planner's choice for --memory-budget
};

// A PyTorch step from scripts/bench_torch_gpt.py --json: "PyTorch eager" or "torch.compile", its
// forward+backward+optimizer median (ms) and its step's peak (max_memory_allocated, bytes).
struct SweepReference {
    std::string label;
    double step_ms = 0;
    int64_t peak = 0;
};

// Reads each file of --sweep-reference. Throws UsageError naming the file when it is not
// bench_torch_gpt.py's JSON.
std::vector<SweepReference> read_sweep_references(const std::vector<std::string>& paths);

// Marks the Pareto points of `points` (by measured peak and step time).
void mark_pareto(std::vector<SweepPoint>& points);

// The table on stdout, then --json and --chart (each when set; the chart's default name too).
// `budget`: the budget in bytes (0: none). Throws std::runtime_error when a file cannot be written.
void report_sweep(const Args& a, const std::vector<SweepPoint>& points, const std::vector<SweepReference>& refs,
                  int64_t budget);

// --memory-sweep: every setting of memory_settings_grid whose predicted peak fits `budget` (0:
// any), each run by train(its args, its policy) for --steps steps, then the report. Returns 1
// when a measured peak exceeds its prediction, else 0; throws UsageError with the planner's
// advice when no setting fits the budget, as --memory-budget alone does.
int sweep(const Args& a, int64_t budget,
          const std::function<RunResult(const Args& run, normtape::SavePolicy policy)>& train);

// --memory-budget: the planner's settings for `budget` bytes, printed, set into `a`. Throws
// UsageError with the planner's advice when nothing fits.
void plan_budget(Args& a, int64_t budget);
