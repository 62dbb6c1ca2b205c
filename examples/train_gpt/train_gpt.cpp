// examples/train_gpt/train_gpt.cpp: the main job. Trains a pre-LN GPT on the bytes of a text file, on the ids
// of token files (llm.c's shards, nanoGPT's uint16 files) or on random tokens (the data's last
// --val-fraction held out for the validation loss) and, with --policy
// both or all, trains it once per norm save policy (same seed, same batches), then prints the
// memory each policy needed, side by side, with the savings the formulas predict. Runs on the cpu
// or a CUDA GPU (the default when one is visible).
//
// Dimensions: B batch (--batch), T sequence (--seq), C width (--embd), NH heads (--heads),
// L layers (--layers), V vocabulary (256 bytes for text; --vocab with token files or --data random).
//
// Checkpoints: --save FILE writes the model, the optimizers' state, the step, the batch generator's state
// and the run's config into one safetensors file (at the end, at --stop-at, and every
// --save-every steps); --resume FILE continues that run so that it trains exactly as the run that
// never stopped (bit for bit on the cpu). See Note [Resuming a run] in examples/train_gpt/resume.h.
//
// Memory: after each run's first forward the saved-tensor report (core/saved_report.h) is taken
// and its bytes put by part of the model (examples/train_gpt/saved_categories.h) for the JSON and the chart;
// --memory-report prints it. --offload on keeps what the forward and the loss save in host memory (SaveOnCpu),
// --checkpoint blocks keeps only the blocks' inputs (checkpoint()); neither changes a result bit.
// --fused-loss on computes the loss without storing the logits (GPTConfig::fused_head_loss);
// --micro-batch N runs each step's batch as --batch / N forwards and backwards of N sequences,
// summing their gradients before one optimizer step (Note [Micro-batches]), so that a forward
// saves N sequences' tensors.
//
// Nothing is lost (examples/train_gpt/train_args.h): every value, the data and each output file are checked
// before the first step; a step whose loss or gradient norm is NaN or Inf stops the run
// (--on-nan) before anything is saved over a checkpoint; a checkpoint's tensors are checked
// (checksums, finite values) before the run resumes from it.
//
// Exit codes: 0 done; 2 the command line, the data or a checkpoint is wrong, found before training
// starts; 1 an error during the run (a non-finite loss or gradient, with the step; with
// --detect-anomaly the first op or backward node that produced a NaN or Inf), an output that
// cannot be written, or measured saving != predicted saving. Each error is one line on stderr.
//
// This file: the flags, their checks, and the training loop. The data is read in
// examples/train_gpt/train_data.h (its batches: Batcher, nn/data/data.h; the schedule: WarmupCosineLR,
// nn/optim/lr_scheduler.h), the checks of --resume in examples/train_gpt/resume.h, the timing of each step's
// forward, backward and optimizer in examples/train_gpt/phase_timer.h, the table, JSON and chart in
// examples/train_gpt/report.h, the saved bytes by category in examples/train_gpt/saved_categories.h, the step
// run or replayed as a CUDA graph in examples/train_gpt/step_runner.h, the model FLOPs and MFU in
// examples/train_gpt/model_flops.h.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../common/checkpoint_checks.h"
#include "memory_sweep.h"
#include "model_flops.h"
#include "normtape.h"
#include "optimizers.h"
#include "phase_timer.h"
#include "report.h"
#include "resume.h"
#include "run_config.h"
#include "saved_categories.h"
#include "step_runner.h"
#include "train_args.h"
#include "train_data.h"
#include "train_flags.h"

using namespace normtape;

namespace {

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

// saved_bytes() after a forward of (idx, targets) with the MLPs' activation recompute off, the graph
// dropped before it returns: what the run would save without it. The dropout stream is set back,
// so the run draws the masks it draws without this measurement.
int64_t saved_bytes_without_recompute(GPT& model, const Tensor& idx, const Tensor& targets) {
    struct Restore {  // the flags and the stream go back even if the forward throws
        GPT& m;
        PhiloxState stream = philox_state();
        ~Restore() {
            for (auto& block : m.h) block->mlp->recompute_activation = true;
            set_philox_state(stream);
        }
    } restore{model};
    for (auto& block : model.h) block->mlp->recompute_activation = false;
    Tensor loss = model.loss(idx, targets);
    return saved_bytes();
}

// Rows [k * micro, (k + 1) * micro) of a [B, T] batch `t`, in storage of their own; `t` itself
// when micro is B (Note [Micro-batches]).
Tensor micro_rows(const Tensor& t, int64_t k, int64_t micro) {
    return micro == t.size(0) ? t : t.narrow(0, k * micro, micro).clone();
}

// One run of one policy; with `sample`, --sample bytes drawn from the trained model are printed.
// Note [Training on several processes]
// With world_size W > 1 (mpirun -np W, srun, torchrun: core/distributed.h) every rank builds the
// same model, draws the same batch of W * B rows (--batch B is each rank's) and trains on its rows
// [rank B, (rank + 1) B), with DataParallel (nn/parallel/data_parallel.h) averaging the gradients: the
// step is the one-process step on the W B rows, up to the order of the sums. The loss printed is
// the mean over the ranks, and so is the held-out loss (each rank scores its rows of the same
// batches of W B rows); rank 0 alone prints and writes files. A checkpoint holds the whole state as a one-process run's, with
// the batch of W B rows: a resumed run on W' ranks trains W B / W' rows on each.

RunResult train(const Args& a, const TrainData& data, SavePolicy policy, ResumeState* resume, bool sample,
                ProcessGroup& group) {
    using clock = std::chrono::steady_clock;
    const Device dev = device_of(a);
    manual_seed(a.seed);
    GPT model(make_config(a, policy));
    // Note [The optimizers]. With ZeRO-1 they are made over this rank's shards once DataParallel
    // exists (below); the whole state is made only to resume, and freed once scattered.
    const bool sharded = a.world_size > 1 && a.shard_optimizer == "on";
    Optimizers optimizer;
    std::optional<Optimizers> whole;
    if (!sharded) optimizer = make_optimizers(a, model);
    DataSplit split = split_data(a, data.tokens);
    const double val_bytes_per_token = bytes_per_token(data, split.val);  // the held-out loss in bits per byte
    const int64_t global_batch = a.batch * a.world_size;  // Note [Training on several processes]
    Batcher batcher(std::move(split.train), global_batch, a.seq, a.vocab, a.seed, dev);
    // The held-out batches: the same ones at every evaluation (Note [Held-out loss] in train_data.h).
    std::optional<Batcher> val;
    if (!split.val.empty()) val.emplace(std::move(split.val), global_batch, a.seq, a.vocab, a.seed + 1, dev);
    const std::string val_start = val ? val->state() : "";
    const WarmupCosineLR schedule = lr_schedule(a);
    RunResult r;
    r.val_bytes_per_token = val_bytes_per_token;
    int64_t start = 0;
    if (resume) {  // Note [Resuming a run]
        Optimizers& loaded = sharded ? whole.emplace(make_optimizers(a, model)) : optimizer;
        try {
            load_checkpoint(resume->path, resume->tensors, resume->metadata, model, loaded.adamw.get(),
                            loaded.muon.get());
        } catch (const Error& e) {  // the file cannot resume this run: found before training, as a flag
            throw UsageError(std::string("--resume: ") + e.what());
        }
        resume->tensors.clear();  // copied into the model and the optimizer: free the host copies
        // Every step of a run is one optimizer step (a skipped one is not counted, and stops the run).
        if (loaded.step_count() != resume->step || (loaded.muon && loaded.muon->step_count() != resume->step))
            throw UsageError("--resume " + resume->path + ": the checkpoint's training step (train_gpt.step " +
                             std::to_string(resume->step) + ") differs from its optimizer's step count (\"step\": " +
                             std::to_string(loaded.step_count()) +
                             (loaded.muon ? ", Muon's " + std::to_string(loaded.muon->step_count()) : "") +
                             " in its optimizers' metadata): expected them equal, as every run saves them "
                             "(the file was modified?)");
        try {
            batcher.set_state(resume->metadata.at("train_gpt.batcher"));
        } catch (const Error& e) {
            throw UsageError(std::string("--resume: the checkpoint's train_gpt.batcher: ") + e.what());
        }
        start = resume->step;
        unsigned long long seed = 0, offset = 0;
        const std::string& stream = resume->metadata["train_gpt.philox"];
        if (std::sscanf(stream.c_str(), "%llu %llu", &seed, &offset) == 2) set_philox_state({seed, offset});
        else if (a.dropout > 0) throw UsageError("--resume: the checkpoint has no dropout stream (train_gpt.philox)");
        if (auto best = resume->metadata.find("train_gpt.best_val"); best != resume->metadata.end()) {
            double loss = 0;
            long long at = 0;
            if (std::sscanf(best->second.c_str(), "%lf at step %lld", &loss, &at) == 2) {
                r.best_val_loss = loss;
                r.best_val_step = at;
            }
        }
        std::printf("resumed from %s at step %lld\n", resume->path.c_str(), static_cast<long long>(start));
    }
    std::unique_ptr<DataParallel> dp;  // Note [Training on several processes]
    if (a.world_size > 1) {
        DataParallelOptions options;
        options.shard_optimizer_state = a.shard_optimizer == "on";
        options.check_replicas = options.check_replicas || a.check_replicas;
        GPTParamGroups groups = optimizer_groups(a, model);
        dp = std::make_unique<DataParallel>(group, model.parameters(), groups.adamw, groups.muon, options);
        if (sharded) {  // each rank's part of the state; a resumed run's comes from the whole
            optimizer = make_optimizers(a, model, {dp->adamw_groups(), dp->muon_groups()});
            if (whole) dp->scatter_state(whole->adamw.get(), whole->muon.get(), optimizer.adamw.get(), optimizer.muon.get());
            whole.reset();
        }
    }
    const int64_t end = a.stop_at > 0 ? a.stop_at : a.steps;
    auto save = [&](int64_t steps_done) {
        if (r.nonfinite_step > 0) {  // a checkpoint of a diverged model would replace a good one
            std::printf("checkpoint: %s not written at step %lld: %s at step %lld\n", a.save.c_str(),
                        static_cast<long long>(steps_done), r.nonfinite_what.c_str(),
                        static_cast<long long>(r.nonfinite_step));
            return;
        }
        std::optional<Optimizers> gathered;  // ZeRO-1: every rank's part, gathered for rank 0 to write
        if (sharded) {
            if (a.rank == 0) gathered.emplace(make_optimizers(a, model));
            dp->gather_state(optimizer.adamw.get(), optimizer.muon.get(), gathered ? gathered->adamw.get() : nullptr,
                             gathered ? gathered->muon.get() : nullptr);
        }
        if (a.rank != 0) return;
        Args config = a;
        config.batch = global_batch;  // the step's rows, whatever the ranks
        std::map<std::string, std::string> metadata = {
            {"format", "normtape-gpt"},
            {"policy", policy_name(policy)},
            {"train_gpt.config", run_config(config, policy, data).dump()},
            {"train_gpt.step", std::to_string(steps_done)},
            {"train_gpt.batcher", batcher.state()},
            {"train_gpt.philox", std::to_string(philox_state().seed) + " " + std::to_string(philox_state().offset)}};
        if (!std::isnan(r.best_val_loss)) {  // so that a resumed --save-best run replaces only a better one
            char best[64];
            std::snprintf(best, sizeof best, "%.17g at step %lld", r.best_val_loss,
                          static_cast<long long>(r.best_val_step));
            metadata["train_gpt.best_val"] = best;
        }
        const Optimizers& o = gathered ? *gathered : optimizer;
        save_checkpoint(a.save, model, metadata, o.adamw.get(), o.muon.get());
        std::printf("checkpoint: %s (step %lld)\n", a.save.c_str(), static_cast<long long>(steps_done));
    };

    r.policy = policy;
    r.first_step = start;
    const int64_t micro = micro_batch(a), n_micro = a.batch / micro;  // Note [Micro-batches]
    r.predicted_saved_bytes = a.checkpoint == "blocks"
                                  ? predicted_checkpoint_every_saved_bytes(model.config(), micro, a.seq)
                                  : predicted_saved_bytes(model.config(), micro, a.seq);
    const StepMemory parts = step_memory(make_config(a, policy), settings_of(a, policy), a.batch, a.seq);
    r.predicted_peak_bytes = parts.peak;
    r.adamw_moment_bytes = optimizer.adamw_moment_bytes();
    r.muon_momentum_bytes = optimizer.muon_momentum_bytes();
    r.master_bytes = optimizer.master_bytes();
    r.predicted_adamw_moment_bytes = parts.adamw_moments;
    r.predicted_muon_momentum_bytes = parts.muon_momentum;
    const int64_t trace_step = std::min<int64_t>(start + 1, end - 1);
    PhaseTimer phases(dev, n_micro);
    r.phase_timing = phases.method();
    StepRunner runner(dev, a.cuda_graph == "on", start);  // Note [The step as a CUDA graph]
    for (int64_t step = start; step < end; ++step) {
        auto [idx, targets] = batcher.next();  // the whole batch, micro-batches or not
        if (a.world_size > 1) {  // this rank's rows
            idx = idx.narrow(0, a.rank * a.batch, a.batch).clone();
            targets = targets.narrow(0, a.rank * a.batch, a.batch).clone();
        }
        // activation recompute's saving, measured on the first (micro-)batch before the step's peak
        // is reset (not with checkpointed blocks, which keep only their inputs either way).
        if (step == start && recompute_saving_measured(a))
            r.recompute_saving_bytes =
                saved_bytes_without_recompute(model, micro_rows(idx, 0, micro), micro_rows(targets, 0, micro));
        synchronize(dev);
        reset_peak_memory_stats(dev);
        int64_t allocs_at_start = memory_stats(dev).num_allocs;
        double ms = 0, grad_norm = 0;
        std::vector<Tensor> losses;  // each micro-batch's loss, detached, read after the step
        try {
            MemoryTraceScope trace(dev, step == trace_step ? &r.memory_trace : nullptr);
            auto t0 = clock::now();
            phases.mark_start();
            GPTStepHooks hooks;
            hooks.after_forward = [&](int64_t k, const Tensor&) {
                phases.mark_forward_done(k);
                if (step == trace_step && k == 0) r.forward_allocs = memory_stats(dev).num_allocs - allocs_at_start;
                if (step == start && k == 0) {  // one micro-batch's graph is alive
                    r.saved_report = saved_tensors_report();  // a walk over the nodes: no data is read
                    r.saved_activation_bytes = r.saved_report.total_bytes;  // saved_bytes(), to the byte
                    r.saved_on_device_bytes = r.saved_report.bytes_on(dev);
                    if (recompute_saving_measured(a)) r.recompute_saving_bytes -= r.saved_activation_bytes;
                }
            };
            hooks.after_backward = [&](int64_t k) { phases.mark_backward_done(k); };
            optimizer.set_lr(schedule.lr(step));
            // A non-finite gradient would make the weights NaN: with --on-nan stop, the update is
            // skipped (on the device, which knows the norm) and the step not counted.
            const bool skip_nonfinite = a.on_nan != "continue";
            const bool replayed = runner.replayed(step);
            // Note [Micro-batches]; the norm stays on the device: no wait
            Tensor norm = runner.run(step, model, optimizer, dp.get(), std::move(idx), std::move(targets), micro,
                                     skip_nonfinite, &losses, hooks);
            if (!replayed) phases.mark_optimizer_done();
            synchronize(dev);
            ms = std::chrono::duration<double, std::milli>(clock::now() - t0).count();
            grad_norm = norm.item<double>();
            if (!std::isfinite(grad_norm) && skip_nonfinite) optimizer.set_step_count(optimizer.step_count() - 1);
            if (!replayed) {  // the step is done: reading its events waits for nothing
                r.phase_ms.push_back(phases.read());
                r.host_ms.push_back(phases.host_read());
            }
        } catch (const AnomalyError& e) {  // say when, beside what and where
            throw AnomalyError(std::string(e.what()) + " (at step " + std::to_string(step + 1) + " of the " +
                               policy_name(policy) + " run)");
        }
        if (step == trace_step)
            for (MemoryEvent& e : r.memory_trace) e.num_allocs -= allocs_at_start;
        if (step == start && a.memory_report) print_memory_report(policy_name(policy), r.saved_report, dev);
        MemoryStats m = memory_stats(dev);
        r.peak_allocated_bytes = std::max(r.peak_allocated_bytes, m.peak_allocated_bytes);
        r.peak_reserved_bytes = std::max(r.peak_reserved_bytes, m.peak_reserved_bytes);
        double loss_sum = 0;  // the micro-batches' mean, in double; the step's loss as an f32
        for (const Tensor& loss : losses) loss_sum += loss.item<double>();
        if (a.world_size > 1) {  // the ranks' mean
            Tensor sum = full({1}, loss_sum, TensorOptions().dtype(DType::F64).device(dev));
            group.all_reduce(sum);
            loss_sum = sum.item<double>() / a.world_size;
        }
        r.losses.push_back(static_cast<float>(loss_sum / static_cast<double>(n_micro)));
        r.step_ms.push_back(ms);
        const bool save_now = !a.save.empty() && !a.save_best &&
                              (step + 1 == end || (a.save_every > 0 && (step + 1) % a.save_every == 0));
        if (r.nonfinite_step == 0) {  // the first step that breaks the model, if any
            std::string what;
            auto str = [](double v) { return std::isnan(v) ? std::string("nan") : std::to_string(v); };  // not "-nan"
            if (!std::isfinite(r.losses.back())) what = "the loss is " + str(r.losses.back());
            else if (!std::isfinite(grad_norm)) what = "the gradient norm is " + str(grad_norm);
            else if (std::string p = save_now ? nonfinite_parameter(model) : ""; !p.empty())
                what = "parameter " + p + " holds a NaN or Inf after the update";
            if (!what.empty()) {
                r.nonfinite_step = step + 1;
                r.nonfinite_what = what;
            }
        }
        const bool stop = r.nonfinite_step == step + 1 && a.on_nan == "stop";
        if (step % a.log_every == 0 || step == end - 1 || r.nonfinite_step == step + 1)
            std::printf("[%-6s] step %5lld/%lld | loss %.4f | %8.0f tok/s | allocated %s | peak %s\n",
                        policy_name(policy), static_cast<long long>(step + 1), static_cast<long long>(a.steps),
                        r.losses.back(), static_cast<double>(global_batch * a.seq) / (ms / 1000.0),
                        mib(m.allocated_bytes).c_str(), mib(m.peak_allocated_bytes).c_str());
        if (val && !stop && (step + 1 == end || (a.eval_every > 0 && (step + 1) % a.eval_every == 0))) {
            double v = evaluate(model, *val, val_start, a.eval_batches, a.rank, a.world_size);
            if (a.world_size > 1) {  // the ranks' mean: every rank then takes the same decisions on it
                Tensor sum = full({1}, v, TensorOptions().dtype(DType::F64).device(dev));
                group.all_reduce(sum);
                v = sum.item<double>() / a.world_size;
            }
            const bool best = record_val_loss(r, step + 1, a.steps, v);
            if (best && a.save_best && r.nonfinite_step == 0) save(step + 1);
        }
        if (save_now || (stop && !a.save.empty())) save(step + 1);  // after a non-finite step: says it did not
        if (stop) break;
    }
    r.step_ms_median = median(r.step_ms);
    for (double ms : r.step_ms) r.train_seconds += ms / 1000;
    // Phase medians leave out the first two steps (the first allocates the caches, the second
    // records the memory trace) unless there are no others.
    const size_t skip = r.phase_ms.size() > 2 ? 2 : 0;
    for (int k = 0; k < 3; ++k) {
        std::vector<double> v;
        std::vector<double> h;
        for (size_t i = skip; i < r.phase_ms.size(); ++i) v.push_back(r.phase_ms[i][k]), h.push_back(r.host_ms[i][k]);
        r.phase_ms_median[k] = median(v);
        r.host_ms_median[k] = median(h);
    }
    r.phase_median_steps = static_cast<int64_t>(r.phase_ms.size() - skip);
    print_phase_times(r);
    std::printf("[%-6s] peak allocated in a step %s bytes, predicted %s (predict_peak): %.4f of the prediction\n",
                policy_name(policy), with_commas(r.peak_allocated_bytes).c_str(),
                with_commas(r.predicted_peak_bytes).c_str(),
                static_cast<double>(r.peak_allocated_bytes) / static_cast<double>(std::max<int64_t>(r.predicted_peak_bytes, 1)));
    print_optimizer_state(r, optimizer.muon.get());
    if (!r.val_losses.empty())
        std::printf("[%-6s] validation: best loss %.4f at step %lld (%zu evaluation%s of %lld held-out batches)\n",
                    policy_name(policy), r.best_val_loss, static_cast<long long>(r.best_val_step),
                    r.val_losses.size(), r.val_losses.size() == 1 ? "" : "s", static_cast<long long>(a.eval_batches));
    r.tokens_per_s = static_cast<double>(global_batch * a.seq) / (r.step_ms_median / 1000.0);
    report_model_flops(model, a.seq, global_batch * a.seq, dev, a.dtype == "bf16", a.world_size, r);
    std::printf("[%-6s] trained %zu steps in %.1f s (the steps' own time: evaluations and checkpoints not counted)\n",
                policy_name(policy), r.step_ms.size(), r.train_seconds);
    if (sample && a.sample > 0 && r.nonfinite_step == 0) print_sample(model, policy, a.sample, a.seed, data.tokenizer.get());
    if (output_policy_fallbacks() > 0 && r.nonfinite_step == 0)
        std::printf("note: %lld norm calls under the output policy saved their input (a |weight| < %g)\n",
                    static_cast<long long>(output_policy_fallbacks()), kOutputPolicyMinWeight);
    return r;
}

int run(const Args& a_in, ResumeState* resume, ProcessGroup& group) {
    Args a = a_in;
    const int64_t budget = a.memory_budget.empty()      ? 0
                           : a.memory_budget == "auto" ? memory_available_bytes(device_of(a))
                                                       : parse_budget(a.memory_budget);
    const TrainData data = load_data(a);
    if (resume) check_resume_data(*resume, data);
    if (data.tokenizer && !a.vocab_given) a.vocab = data.tokenizer->vocab_size();
    check_outputs(a, run_inputs(a, data));
    if (a.threads > 0) set_num_threads(static_cast<int>(a.threads));
    int64_t params = num_parameters(make_config(a, SavePolicy::Input));
    std::printf("train_gpt: %s norm, L=%lld NH=%lld C=%lld V=%lld, %s parameters; B=%lld%s T=%lld, %lld steps, lr %g, "
                "%s on %s\n",
                a.norm.c_str(), static_cast<long long>(a.layers), static_cast<long long>(a.heads),
                static_cast<long long>(a.embd), static_cast<long long>(a.vocab), with_commas(params).c_str(),
                static_cast<long long>(a.batch), micro_batches_of(a).c_str(), static_cast<long long>(a.seq),
                static_cast<long long>(a.steps), a.lr, a.dtype.c_str(),
                a.device == "cpu" ? ("cpu (" + std::to_string(get_num_threads()) + " threads)").c_str()
                                  : a.device.c_str());
    if (data_is_tokens(a) || data.tokenizer)
        std::printf("data: %s, %s tokens in %s bytes%s\n", data.description.c_str(),
                    with_commas(static_cast<int64_t>(data.tokens.size())).c_str(),
                    with_commas(static_cast<int64_t>(data.bytes)).c_str(), data.token_cache.c_str());
    else
        std::printf("data: %s, %s bytes\n", data.description.c_str(), with_commas(static_cast<int64_t>(data.bytes)).c_str());
    if (a.world_size > 1)
        std::printf("data parallel: %d processes (%s), %lld rows each, %lld a step; optimizer state %s\n", a.world_size,
                    group.launcher().c_str(), static_cast<long long>(a.batch),
                    static_cast<long long>(a.batch * a.world_size),
                    a.shard_optimizer == "on" ? "sharded (ZeRO-1)" : "on every process");

    if (a.memory_sweep)
        return sweep(a, budget, [&](const Args& run, SavePolicy policy) {
            return train(run, data, policy, nullptr, false, group);
        });
    if (budget > 0) plan_budget(a, budget);

    std::vector<SavePolicy> policies;  // both: input, output; all: the three
    const bool several = a.policy == "both" || a.policy == "all";
    if (several || a.policy == "input") policies.push_back(SavePolicy::Input);
    if (several || a.policy == "output") policies.push_back(SavePolicy::Output);
    if (a.policy == "all" || a.policy == "normalized") policies.push_back(SavePolicy::Normalized);
    std::vector<RunResult> runs;
    for (SavePolicy p : policies) {
        runs.push_back(train(a, data, p, resume, p == policies.back(), group));
        if (runs.back().nonfinite_step > 0 && a.on_nan == "stop") break;
    }

    // What one forward saves: a micro-batch's (Note [Micro-batches]).
    const GPTConfig config = make_config(a, SavePolicy::Input);
    const int64_t micro = micro_batch(a);
    const Predicted predicted{predicted_saving_bytes(config, micro, a.seq),
                              recompute_saving_measured(a) ? predicted_recompute_saving_bytes(config, micro, a.seq) : 0};
    print_preset_reference(a, runs, predicted.norm_policy);
    print_recompute(a, runs, predicted.recompute);
    if (runs.size() < 2) print_saved_bytes(a, runs);  // with two or more, the table shows them
    const bool saved_ok = print_saved_prediction(a, runs);
    if (a.rank == 0) {  // Note [Training on several processes]: one writer
        if (!a.json.empty()) write_json(a, runs, predicted, data.description, params);
        write_chart(a, runs);
    }
    const RunResult& last = runs.back();
    if (last.nonfinite_step > 0 && a.on_nan == "stop") {
        std::fprintf(stderr,
                     "train_gpt: error: %s at step %lld of the %s run: the run stopped, saving no checkpoint after "
                     "it (--detect-anomaly names the first op that makes a NaN or Inf; --on-nan continue trains on)\n",
                     last.nonfinite_what.c_str(), static_cast<long long>(last.nonfinite_step),
                     policy_name(last.policy));
        return 1;
    }
    // Activation recompute saves its prediction in every run, every run saves its predicted bytes, and Output
    // and Normalized each save theirs over Input (when the blocks save more than their inputs), to
    // the byte.
    if (!saved_ok) {
        std::fprintf(stderr, "train_gpt: the saved bytes of a run differ from the prediction\n");
        return 1;
    }
    for (const RunResult& r : runs)
        if (r.recompute_saving_bytes != predicted.recompute) {
            std::fprintf(stderr, "train_gpt: measured saving of activation recompute in the %s run differs from the prediction\n",
                         policy_name(r.policy));
            return 1;
        }
    if (budget > 0) {
        const int64_t peak = runs.back().peak_allocated_bytes;
        std::printf("memory budget %s bytes: measured peak %s bytes (%s)\n", with_commas(budget).c_str(),
                    with_commas(peak).c_str(), peak <= budget ? "within it" : "OVER IT");
        if (peak > budget) {
            std::fprintf(stderr, "train_gpt: the measured peak exceeds --memory-budget %s\n", a.memory_budget.c_str());
            return 1;
        }
    }
    if (runs.size() < 2) return 0;
    print_table(a, runs, predicted.norm_policy);
    if (a.checkpoint == "blocks") return 0;
    for (size_t k = 1; k < runs.size(); ++k)
        if (runs[0].saved_activation_bytes - runs[k].saved_activation_bytes != predicted.norm_policy) {
            std::fprintf(stderr, "train_gpt: measured saving of the %s run differs from the prediction\n",
                         policy_name(runs[k].policy));
            return 1;
        }
    return 0;
}

// A run that ran out of host or GPU memory (`what`: the allocator's message): one line naming the
// sizes that set the memory, and exit status 1.
int out_of_memory(const Args& a, const char* what) {
    std::fprintf(stderr, "train_gpt: error: %s, for B=%lld%s T=%lld C=%lld L=%lld V=%lld: try a smaller --batch or "
                 "--micro-batch, --seq or model\n",
                 what, static_cast<long long>(a.batch), micro_batches_of(a).c_str(), static_cast<long long>(a.seq),
                 static_cast<long long>(a.embd), static_cast<long long>(a.layers), static_cast<long long>(a.vocab));
    return 1;
}

// A rank that stops on an error ends the whole job (ProcessGroup::abort) rather than leave the
// others waiting for it in a collective until their timeout; returns `code`.
int end_job(ProcessGroup& group, int code) {
    group.abort(code);
    return code;
}

}  // namespace

int main(int argc, char** argv) {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // every line reaches a log as it is printed
    std::unique_ptr<ProcessGroup> group;  // Note [Training on several processes]
    try {
        group = std::make_unique<ProcessGroup>();
    } catch (const Error& e) {
        std::fprintf(stderr, "train_gpt: %s\n", e.what());
        return 2;
    }
    if (group->rank() != 0 && !std::freopen("/dev/null", "w", stdout)) return 1;  // rank 0 prints
    Args a;
    a.world_size = group->world_size();
    a.rank = group->rank();
    a.device_index = group->device_index();
    CLI::App app{"train_gpt: train a pre-LN GPT on bytes or tokens and compare the memory of the norm save policies"};
    app.option_defaults()->always_capture_default()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    add_flags(app, a);
    try {
        app.parse(argc, argv);
        std::optional<ResumeState> resume;
        if (!a.resume.empty()) {
            if (!a.preset.empty()) throw UsageError("--resume takes the model from the checkpoint: leave out --preset");
            resume = read_resume(a.resume);
            a.batch *= a.world_size;  // a --batch given is each rank's; the checkpoint's is the step's
            apply_resume_config(app, a, *resume);
            if (a.batch % a.world_size != 0)  // the checkpoint's batch is the step's, over every rank
                throw UsageError("--resume " + a.resume + ": the checkpoint's batch of " + std::to_string(a.batch) +
                                 " rows does not divide among " + std::to_string(a.world_size) + " processes");
            a.batch /= a.world_size;
        }
        apply_preset(app, a);
        // With --tokenizer, --vocab defaults to the tokenizer's size unless given (by the flag, a
        // checkpoint or a preset).
        a.vocab_given = a.vocab_given || app.count("--vocab") > 0 || !a.preset.empty();
        if (a.optimizer == "muon" && app.count("--beta2"))
            throw UsageError("--beta2 is the adamw run's: --optimizer muon gives AdamW nanochat's betas (0.8, 0.95); "
                             "leave it out");
        if (a.optimizer == "adamw" && app.count("--muon-lr"))
            throw UsageError("--muon-lr is Muon's: it needs --optimizer muon");
        if (app.count("--memory-budget")) parse_budget(a.memory_budget);  // "" too, which is no size
        if (!a.memory_budget.empty() || a.memory_sweep) {  // the planner or the sweep sets these
            for (const char* flag : {"--policy", "--recompute-activation", "--fused-loss", "--checkpoint",
                                     "--checkpoint-every", "--offload", "--micro-batch"})
                if (app.count(flag))
                    throw UsageError(std::string(a.memory_sweep ? "--memory-sweep" : "--memory-budget") +
                                     " chooses " + flag + ": leave it out");
            a.policy = "input";  // replaced by the plan's, or each setting's
        }
        if (a.device.empty()) a.device = cuda_is_available() ? "cuda" : "cpu";
        if (a.dtype.empty()) a.dtype = a.device == "cuda" ? "bf16" : "f32";
        if (a.norm.empty()) a.norm = a.arch == "gpt2" ? "layer" : "rms";
        check_args(a);
        if (a.device == "cuda" && !cuda_is_available())
            throw UsageError(cuda_is_built() ? "--device cuda: no CUDA GPU is visible"
                                             : "--device cuda: this build of normtape has no CUDA backend");
        if (resume)  // before the model is built from the checkpoint's config
            if (std::string why = model_larger_than_file(make_config(a, SavePolicy::Input), resume->tensors); !why.empty())
                throw UsageError("--resume " + a.resume + ": " + why);
        if (resume && resume->step >= (a.stop_at > 0 ? a.stop_at : a.steps))
            throw UsageError("--resume " + a.resume + ": the checkpoint is at step " + std::to_string(resume->step) +
                             ", nothing is left to train up to step " +
                             std::to_string(a.stop_at > 0 ? a.stop_at : a.steps));
        if (a.world_size > 1 && (a.memory_sweep || !a.memory_budget.empty()))
            throw UsageError(std::string(a.memory_sweep ? "--memory-sweep" : "--memory-budget") +
                             " plans one process's memory: run it without mpirun, srun or torchrun");
        if (a.world_size > 1 && a.cuda_graph == "on")
            throw UsageError("--cuda-graph on: several processes cannot be captured (their collectives)");
        if (a.world_size == 1 && a.shard_optimizer == "on")
            throw UsageError("--shard-optimizer on shards the state across processes: start several (mpirun -np N)");
        set_detect_anomaly(a.detect_anomaly);
        return run(a, resume ? &*resume : nullptr, *group);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "train_gpt: %s (see --help)\n", e.what());
        return end_job(*group, 2);
    } catch (const UsageError& e) {
        std::fprintf(stderr, "train_gpt: %s\n", e.what());
        return end_job(*group, 2);
    } catch (const OutOfMemoryError& e) {
        return end_job(*group, out_of_memory(a, e.what()));
    } catch (const std::bad_alloc&) {
        return end_job(*group, out_of_memory(a, "out of host memory (std::bad_alloc)"));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "train_gpt: error: %s\n", e.what());
        return end_job(*group, 1);
    }
}
