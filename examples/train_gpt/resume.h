// examples/train_gpt/resume.h: what lets a train_gpt run resume: the config that identifies a run (saved in
// its checkpoints), reading a checkpoint for --resume, and the checks that the resumed run is the
// same run (its flags, its data). Not here: saving and restoring the model, optimizer and batcher,
// which the training loop does (examples/train_gpt/train_gpt.cpp).
//
// Note [Resuming a run]
// A resumed run trains bit for bit as the run that never stopped (on the cpu, and on CUDA on the
// same GPU model: the CUDA reductions have a fixed order, but the fast norm backward's depends on
// how many blocks fit on the GPU) because everything that decides a step is restored from the
// checkpoint:
//  - the parameters, and AdamW's moments, step count and f32 master copies of bf16 parameters
//    (save_checkpoint / load_checkpoint with the optimizer, nn/formats/checkpoint.h);
//  - the learning rate: the schedule (nn/optim/lr_scheduler.h) is a function of the step and --steps,
//    so the step is saved and --steps is part of the config (--stop-at ends a run early without
//    changing its schedule);
//  - the batches: Batcher (nn/data/data.h) draws every window from its own std::mt19937_64, so that generator's
//    state is the position in the data; it is saved in the standard text form of the engine;
//  - the data: its absolute path, size and FNV-1a hash are saved, and a resume on other data is
//    refused (--data may name the same bytes elsewhere).
//  - the dropout masks: they come from the dropout stream (core/philox.h), whose seed and offset
//    are saved ("train_gpt.philox") and set again.
// The global generator (manual_seed) only initializes weights, which the checkpoint replaces.
// The run's config (data, steps, batch, seq, model, norm, policy, dtype, lr, warmup, min-lr, beta2,
// dropout, seed, val-fraction) is saved as JSON in the metadata entry
// "train_gpt.config"; on --resume a flag left out takes the saved value and a flag given with
// another value is refused, naming both. Values taken from the checkpoint then go through the
// same checks as flags (check_args), and messages name the checkpoint as their source. The device is not part of it (a run may move to another
// device; bit for bit only on the same one), nor are the settings that change no result bit:
// what is saved for backward and where (--recompute-activation, --offload, --checkpoint), --threads and
// --memory-report; nor those that change results only in their rounding or, with --dropout, in
// which elements are dropped: --fused-loss (the logits made again in backward) and --micro-batch
// (the gradients summed in another order, the masks drawn per micro-batch: Note [Micro-batches]
// in examples/train_gpt/train_gpt.cpp). A resumed run may choose them anew; it trains bit for bit
// as the run that never stopped when it keeps these two as they were. A checkpoint holds one run,
// so --resume, --stop-at and --save-every need --policy input, output or normalized.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "normtape.h"
#include "train_args.h"
#include "train_data.h"

namespace CLI {
class App;
}

// The config that identifies a run, saved in its checkpoints: the flags above (--data as an
// absolute path) and the size and FNV-1a hash of the bytes `data` was read from.
nlohmann::json run_config(const Args& a, normtape::SavePolicy policy, const TrainData& data);

// A train_gpt checkpoint read for --resume: its tensors (dropped once loaded), metadata, config
// and step.
struct ResumeState {
    std::string path;
    normtape::NamedTensors tensors;
    std::map<std::string, std::string> metadata;
    nlohmann::json config;
    int64_t step = 0;
};

// Reads `path`, verifying its checksums (a file without them is read with a warning on stderr).
// Throws UsageError, naming --resume and the file, when it cannot be read, is not a valid
// safetensors file, fails a checksum, or is not a train_gpt checkpoint with training state
// (metadata "train_gpt.config", "train_gpt.step", "train_gpt.batcher" and "optimizer", well
// formed).
ResumeState read_resume(const std::string& path);

// Fills the flags the user left out (app.count(flag) == 0) from the checkpoint's config, noting
// them in a.from_checkpoint, and refuses those given with another value, throwing UsageError
// naming both, or naming the entry when the config lacks it or holds another type (Note [Resuming
// a run]). The values' ranges are check_args's.
// --data is taken only when left out: the same bytes may have another path (check_resume_data).
void apply_resume_config(const CLI::App& app, Args& a, const ResumeState& r);

// Throws UsageError when `data` is not the data of the checkpoint's run: bytes of another size or
// FNV-1a hash.
void check_resume_data(const ResumeState& r, const TrainData& data);
