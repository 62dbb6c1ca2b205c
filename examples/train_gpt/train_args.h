// examples/train_gpt/train_args.h: train_gpt's settings: Args (CLI11 fills it from the flags in main,
// --preset and --resume complete it), the checks every value goes through whatever its source,
// the checks of the files the run will write, and UsageError, the error on which train_gpt exits
// with status 2. Not here: the flags' definitions and their syntax (examples/train_gpt/train_gpt.cpp).
#pragma once

#include <cstdint>
#include <limits>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

struct Args {
    std::string data;  // empty: kDefaultData (examples/train_gpt/train_data.h); "random": random tokens
    std::string data_format = "auto";  // "text", "llm.c", "raw": how --data is read (data_is_tokens)
    std::string tokenizer;  // a rank file (beside its .json) or a tokenizer.json that encodes a text --data
    bool vocab_given = false;  // --vocab was given (with --tokenizer, the default is the tokenizer's)
    int64_t steps = 300, batch = 16, seq = 64, layers = 2, heads = 4, embd = 128, vocab = 256;
    std::string arch = "gpt2";  // gpt_config's name (nn/model/gpt.h)
    int64_t kv_heads = 0;       // GPTConfig::n_kv_head (0: heads)
    std::string tie = "off";    // GPTConfig::tie_embeddings
    // norm: empty until main fills in the architecture's (layer for gpt2, else rms).
    std::string norm, policy = "both", device, dtype, preset, recompute_activation = "on";
    double lr = 3e-3;
    int64_t warmup = -1;                                          // warm-up steps (-1: 10% of steps)
    double min_lr = std::numeric_limits<double>::quiet_NaN();     // where the decay ends (NaN: lr / 10)
    double beta2 = 0.95;                                          // AdamW's (--optimizer adamw)
    std::string optimizer = "adamw";  // "adamw" or "muon" (examples/train_gpt/optimizers.h)
    double muon_lr = 0.02;            // Muon's rate at the schedule's peak (--optimizer muon)
    double dropout = 0.0;                                         // GPTConfig::dropout
    int64_t threads = 0;                                          // cpu threads (0: every core)
    int64_t sample = 0;                                           // bytes to sample after training
    uint64_t seed = 1337;
    int64_t log_every = 50;
    std::string json, save, chart = "train_gpt.svg";
    bool detect_anomaly = false;
    std::string on_nan = "stop";  // what a non-finite loss does: "stop" the run or "continue"
    std::string resume;           // checkpoint to continue from
    int64_t save_every = 0;       // also save every this many steps (0: only at the end)
    int64_t stop_at = 0;          // stop after this step of the --steps schedule (0: at --steps)
    double val_fraction = 0.1;    // the tail of the text held out for validation (0: none)
    int64_t eval_every = 0;       // evaluate every this many steps (0: after the last step only)
    int64_t eval_batches = 20;    // held-out batches per evaluation
    bool save_best = false;       // --save writes the checkpoint of the best validation loss instead
    // Memory settings of the run, not of the model (they change no result beyond rounding, and
    // micro_batch with dropout which elements are dropped, so --resume does not compare them;
    // Note [Resuming a run]): GPTConfig::offload, checkpoint_blocks and fused_head_loss, the
    // sequences of each forward and backward (micro_batch: the gradients of batch / micro_batch
    // micro-batches are summed before one optimizer step; 0: the whole batch), and the printing
    // of the saved-tensor report after each run's first forward.
    std::string offload = "off", checkpoint = "none", fused_loss = "off";
    int64_t checkpoint_every = 1;  // with checkpoint "blocks": GPTConfig::checkpoint_every
    int64_t micro_batch = 0;
    bool memory_report = false;
    // --memory-budget: "" (none), "auto" (memory_available_bytes of the device) or a size ("6GiB");
    // the planner (nn/memory/memory_budget.h) then sets the memory settings above and the policy.
    // --memory-sweep: every setting of memory_settings_grid (within the budget, if one is given)
    // trained for a few steps instead of one run, timed and measured.
    std::string memory_budget;
    bool memory_sweep = false;
    std::vector<std::string> sweep_reference;  // bench_torch_gpt.py JSON files drawn beside the sweep
    // Several processes (core/distributed.h; mpirun, srun or torchrun): --batch is each rank's, the
    // step's batch is world_size times it. --shard-optimizer on keeps each rank's part of the
    // optimizers' state only (ZeRO-1, nn/parallel/data_parallel.h); --check-replicas compares every
    // parameter across ranks after each step (always on in debug builds).
    std::string shard_optimizer = "off";
    bool check_replicas = false;
    // "on": each step after the first two replays a CUDA graph of the step (Note [The step as a
    // CUDA graph], examples/train_gpt/step_runner.h).
    std::string cuda_graph = "off";
    int world_size = 1, rank = 0;  // the process group's, set by main
    int device_index = 0;          // this process's GPU: Device::cuda(device_index)
    // The config keys ("heads", "lr") whose values --resume took from the checkpoint: messages name
    // the checkpoint, not a flag, as their source.
    std::set<std::string> from_checkpoint;
};

// Thrown for a bad flag, value, input file or checkpoint found before training starts; main
// prints it on one line and exits 2.
struct UsageError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// How a value of `a` is named in messages: "--heads 3", or "--resume ck.safetensors: the
// checkpoint's heads 3" when --resume took it from the checkpoint. `key` is the flag without its
// dashes ("heads", "log-every").
std::string describe(const Args& a, const std::string& key, const std::string& value);

// The schedule's warm-up steps and final rate: --warmup and --min-lr, or their defaults (10% of
// --steps, at least 1; --lr / 10).
int64_t warmup_steps(const Args& a);
double min_lr(const Args& a);

// The sequences of one forward and backward: --micro-batch, or --batch without it (0). A checked
// `a` (check_args) has batch a multiple of it.
int64_t micro_batch(const Args& a);

// The bytes of --memory-budget SIZE: an integer or decimal count with an optional unit B, KB, MB,
// GB (powers of 1000), KiB, MiB, GiB (powers of 1024); "auto" gives -1. Throws UsageError naming
// --memory-budget, the value and the forms it takes.
int64_t parse_budget(const std::string& text);

// Checks every value of `a` once --preset and --resume have filled in what the flags left out:
// the ranges and choices that --help lists, and the values that must go together (--embd
// divisible by --heads, --batch a multiple of --micro-batch, --warmup below --steps, --min-lr at
// most --lr, --vocab only with --data random, --save-every with --save, one policy with --resume,
// --stop-at and --save-every, --stop-at <= --steps, --eval-every and --save-best only with
// held-out text, --save-best with --save and without --save-every). Throws UsageError naming the
// value's source (describe()), what was expected and what was found.
void check_args(const Args& a);

// Checks, before the first step, that the run can write its outputs (--save, --json, --chart):
// each is a file name (not a directory; --save an existing regular file or a new one, and its
// temporary file, normtape::safetensors_temp_path, absent or a regular file it may write)
// in a directory that exists and that this process may write into (after symbolic links, which
// the writes follow); none is an input of the run (`inputs`; --resume, which only --save may name:
// it continues the checkpoint); no two name the same file. Throws UsageError naming the flag, the
// path and the reason.
struct RunInput {
    std::string named;  // how the run was told of it, for the message: "--data PATTERN (FILE)"
    std::string file;
};
void check_outputs(const Args& a, const std::vector<RunInput>& inputs);
