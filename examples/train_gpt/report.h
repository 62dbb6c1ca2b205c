// examples/train_gpt/report.h: train_gpt's results: RunResult, what one training run measured, and the
// report made of them: the two policies side by side on stdout, the JSON file (--json) and the
// SVG chart (--chart), with the number formats they share. Not here: the measuring
// (examples/train_gpt/train_gpt.cpp), the drawing of the chart (examples/train_gpt/svg_chart.h).
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "normtape.h"
#include "train_args.h"

struct RunResult {
    normtape::SavePolicy policy;
    int64_t first_step = 0;     // > 0 when resumed: losses and step_ms start there
    int64_t nonfinite_step = 0;  // the first step (from 1) whose loss or gradient norm was NaN or Inf; 0: none
    std::string nonfinite_what;  // "the loss is nan", "the gradient norm is inf"
    int64_t saved_activation_bytes = 0, peak_allocated_bytes = 0, peak_reserved_bytes = 0;
    // After the first forward (of the first micro-batch, with --micro-batch): the saved-tensor
    // report (its total is saved_activation_bytes), and the bytes of it held on the run's device
    // (with --offload on, on a GPU, nearly all of it is on the host instead).
    normtape::SavedTensorsReport saved_report;
    int64_t saved_on_device_bytes = 0;
    // What the first forward saves by nn/model/gpt.h's formula: predicted_checkpoint_saved_bytes() of the
    // run's config with --checkpoint blocks, else predicted_saved_bytes(), at B = micro_batch(a).
    int64_t predicted_saved_bytes = 0;
    // The step's peak by predict_peak (nn/memory/memory_plan.h, the step dry-run) for the run's
    // settings, bytes: peak_allocated_bytes to the byte, except under offload on CUDA (a bound).
    int64_t predicted_peak_bytes = 0;
    // The optimizers' state (examples/train_gpt/optimizers.h), bytes, measured from their tensors
    // and predicted (step_memory's adamw_moments and muon_momentum): AdamW's moments, Muon's
    // momentum buffers (0 with --optimizer adamw), the f32 masters of bf16 parameters.
    int64_t adamw_moment_bytes = 0, muon_momentum_bytes = 0, master_bytes = 0;
    int64_t predicted_adamw_moment_bytes = 0, predicted_muon_momentum_bytes = 0;
    // With --recompute-activation on: saved_activation_bytes of the first (micro-)batch with it off,
    // minus with it on (0 when off).
    int64_t recompute_saving_bytes = 0;
    std::vector<double> losses, step_ms;
    double step_ms_median = 0, tokens_per_s = 0;
    // The model FLOPs of one step (Note [Model FLOPs], examples/train_gpt/model_flops.h), and the
    // model FLOPs utilization at the median step time: their rate over the dense bf16 peak of
    // every process's GPU (NaN where the run is not bf16 on a GPU of the table, or on the cpu).
    double model_flops_per_step = 0, mfu = std::numeric_limits<double>::quiet_NaN();
    double train_seconds = 0;  // the steps' own time, summed (evaluations and checkpoints not counted)
    // Per step: forward (the loss), backward, optimizer (gradient clipping, AdamW, zero_grad), in ms,
    // the micro-batches' forwards and backwards each summed (examples/train_gpt/phase_timer.h); their
    // medians over the steps after the first two (all steps when there are no more than two), and
    // how many steps that is.
    std::vector<std::array<double, 3>> phase_ms;
    std::array<double, 3> phase_ms_median{};
    // The host's time to queue each phase (PhaseTimer::host_read), and its medians as above.
    std::vector<std::array<double, 3>> host_ms;
    std::array<double, 3> host_ms_median{};
    int64_t phase_median_steps = 0;
    std::string phase_timing;  // PhaseTimer::method(): "cuda events", "host clock", ...
    std::vector<normtape::MemoryEvent> memory_trace;  // allocator events of one step (step 2)
    int64_t forward_allocs = 0;  // allocations of that step's forward (of its first micro-batch)
    // Validation (examples/train_gpt/train_data.h): the steps evaluated after and their held-out losses; the
    // best loss (NaN: none yet) and its step. A resumed run starts from the checkpoint's best.
    std::vector<int64_t> val_steps;
    std::vector<double> val_losses;
    double best_val_loss = std::numeric_limits<double>::quiet_NaN();
    int64_t best_val_step = 0;
    // The held-out part's bytes per token (bytes_per_token, examples/train_gpt/train_data.h; NaN
    // for a token file): its losses in bits per byte are val_losses / (ln 2 * this).
    double val_bytes_per_token = std::numeric_limits<double>::quiet_NaN();
};

// What each memory mechanism is predicted to save, in bytes (nn/model/gpt.h), in the forward of one
// micro-batch (the whole batch without --micro-batch): the norm policy (Output or Normalized over
// Input) and activation recompute (0 when off, and with --checkpoint blocks, where it is not
// measured: the blocks keep only their inputs).
struct Predicted {
    int64_t norm_policy = 0, recompute = 0;
};

// "1.50 MiB"
std::string mib(int64_t bytes);
// "-1,234,567"
std::string with_commas(int64_t v);
// " (micro-batches of 4)" with --micro-batch 4 below --batch, else "": what follows "B=16" where
// a message names the batch ("B=16 (micro-batches of 4) T=64").
std::string micro_batches_of(const Args& a);

// One line: the run's median forward, backward and optimizer time per step (ms), the steps they
// cover and how they were timed.
void print_phase_times(const RunResult& r);
// With --preset gpt2-medium-ish, two runs or more and no micro-batches: PyTorch's figures for the
// same model and batch beside ours (the input and output runs).
void print_preset_reference(const Args& a, const std::vector<RunResult>& runs, int64_t predicted);
// The two runs (input, then output policy) side by side: saved activation bytes (and those on the
// run's device), the predicted saving and whether it equals the measured one (with --checkpoint
// blocks: not checked, the blocks keep only their inputs), peak bytes, final loss, step time,
// tokens/s, and the largest relative difference between the loss curves.
void print_table(const Args& a, const std::vector<RunResult>& runs, int64_t predicted);
// With activation recompute on, one line per run: its measured saving beside the prediction (with
// --checkpoint blocks, one line saying it is not measured).
void print_recompute(const Args& a, const std::vector<RunResult>& runs, int64_t predicted);
// One line per run: saved activation bytes, those on the run's device, the median step time.
void print_saved_bytes(const Args& a, const std::vector<RunResult>& runs);
// One line per run: its saved bytes beside its predicted_saved_bytes (nn/model/gpt.h's
// predicted_saved_bytes, or predicted_checkpoint_saved_bytes with --checkpoint blocks) and whether
// they are equal (with --offload on, the prediction is not checked: the line says so). Returns
// false when one differs.
bool print_saved_prediction(const Args& a, const std::vector<RunResult>& runs);
// Where the highest point of a step's memory trace is: "1.50 MiB in backward, LayerNormBackward
// (h.0.ln_1)" or "... in forward, h.1.mlp.c_fc"; "" for an empty trace.
std::string step_peak(const std::vector<normtape::MemoryEvent>& trace);
// Writes a.chart: the loss of each run per step (its finite values; a marker where it became
// non-finite), the allocated bytes during one step with each run's peak marked and named
// (step_peak), and the saved bytes after the first forward by category
// (examples/train_gpt/saved_categories.h), a stacked bar per run. Throws normtape::IOError naming the file
// and the reason when it cannot be written.
void write_chart(const Args& a, const std::vector<RunResult>& runs);
// Writes a.json: the config (`data_desc` for the data, `params` parameters; micro_batch is
// micro_batch(a), fused_loss and offload booleans), the predicted savings
// (predicted_saving_bytes: the norm policy's; predicted_recompute_saving_bytes), with two runs
// the measured norm-policy saving, and each run's figures, measured savings (measured_saving_bytes
// against the input run, for the runs after it; recompute_saving_bytes), saved bytes on the
// device, by category and the whole saved-tensor report, and losses (null where non-finite). Throws normtape::IOError naming the file and the reason when it cannot be written.
void write_json(const Args& a, const std::vector<RunResult>& runs, const Predicted& predicted,
                const std::string& data_desc, int64_t params);

// Records the held-out loss `v` (nats per token) after step `step` of `steps` in r (val_steps,
// val_losses, the best), and prints it, in bits per byte too where r.val_bytes_per_token is known.
// Returns whether it is the best so far.
bool record_val_loss(RunResult& r, int64_t step, int64_t steps, double v);
// `nats` per token in bits per byte of the held-out part: nats / (ln 2 * r.val_bytes_per_token).
double bits_per_byte(const RunResult& r, double nats);
// Two lines: the optimizer state measured beside its prediction (AdamW's moments, Muon's momentum,
// the f32 masters, in bytes) and, with `muon`, Muon's momentum beside the moments AdamW would keep
// for the same matrices.
void print_optimizer_state(const RunResult& r, const normtape::Muon* muon);
// The name of the first parameter of `model` that holds a NaN or Inf, "" when all are finite.
std::string nonfinite_parameter(const normtape::Module& model);
// The median of v (the mean of the middle two for an even count; 0 for none).
double median(std::vector<double> v);
// Prints `tokens` tokens sampled from `model` after a newline (nn/model/generate.h; nanoGPT's
// sample.py settings: temperature 0.8, top-k 200), seeded with `seed`: bytes, or decoded by
// `tokenizer` (an id that is no token of it prints nothing). The model is left in training mode.
void print_sample(normtape::GPT& model, normtape::SavePolicy policy, int64_t tokens, uint64_t seed,
                  const normtape::Tokenizer* tokenizer);
