// examples/train_gpt/train_args.cpp: the checks of train_gpt's settings and output files
// (examples/train_gpt/train_args.h).
#include "train_args.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "../common/checkpoint_checks.h"
#include "normtape.h"
#include "train_data.h"

namespace fs = std::filesystem;

namespace {

[[noreturn]] void fail(const Args& a, const std::string& key, const std::string& value, const std::string& expected) {
    throw UsageError(describe(a, key, value) + ": expected " + expected);
}

struct IntRange {
    const char* key;
    int64_t Args::*field;
    int64_t lo, hi;
    const char* what;
};

// The integer settings and their ranges; 0 also means "off" for save-every and stop-at.
const IntRange kIntRanges[] = {
    {"steps", &Args::steps, 1, int64_t{1} << 40, "training steps"},
    {"batch", &Args::batch, 1, int64_t{1} << 20, "sequences per batch"},
    {"micro-batch", &Args::micro_batch, 0, int64_t{1} << 20, "sequences per micro-batch (0: --batch)"},
    {"checkpoint-every", &Args::checkpoint_every, 1, 1024, "blocks per checkpointed block"},
    {"seq", &Args::seq, 1, kMaxSeq, "a sequence length"},
    {"layers", &Args::layers, 1, kMaxLayers, "transformer blocks"},
    {"heads", &Args::heads, 1, kMaxHeads, "attention heads"},
    {"kv-heads", &Args::kv_heads, 0, kMaxHeads, "key/value heads (0: --heads)"},
    {"embd", &Args::embd, 1, kMaxEmbd, "an embedding width"},
    {"vocab", &Args::vocab, 2, kMaxVocab, "a vocabulary size"},
    {"log-every", &Args::log_every, 1, int64_t{1} << 40, "steps between progress lines"},
    {"save-every", &Args::save_every, 0, int64_t{1} << 40, "steps between checkpoints (0: only at the end)"},
    {"stop-at", &Args::stop_at, 0, int64_t{1} << 40, "the step to stop after (0: --steps)"},
    {"eval-every", &Args::eval_every, 0, int64_t{1} << 40, "steps between evaluations (0: after the last step)"},
    {"eval-batches", &Args::eval_batches, 1, int64_t{1} << 20, "held-out batches per evaluation"},
    {"threads", &Args::threads, 0, 1024, "cpu threads (0: every core)"},
    {"sample", &Args::sample, 0, int64_t{1} << 20, "bytes to sample"},
};

void check_choice(const Args& a, const std::string& key, const std::string& value,
                  std::initializer_list<const char*> choices) {
    std::string list;
    for (const char* c : choices) {
        if (value == c) return;
        list += std::string(list.empty() ? "" : " or ") + (*c ? c : "none");
    }
    fail(a, key, "\"" + value + "\"", list);
}

// The file that writing `path` changes: symbolic links followed, as the writers do.
fs::path written_file(const std::string& path) {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(fs::absolute(path), ec);
    return ec ? fs::absolute(path).lexically_normal() : p;
}

std::string format_real(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

bool same_file(const fs::path& a, const std::string& b) {
    std::error_code ec;
    return !b.empty() && (a == written_file(b) || fs::equivalent(a, b, ec));
}

// What `mode` is, for messages about a file in the way: "a directory", "a FIFO", ...
const char* kind_of(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    return "not a regular file";
}

// A checkpoint is written to a temporary file first and renamed over --save (Note [Atomic
// checkpoint writes] in nn/formats/safetensors_write.cpp): the save opens that file, never through a
// symbolic link, and only a regular file that this process may write. Throws UsageError, `what`
// naming --save, when something else is in the way there, which would fail the save after the run.
void check_save_temp(const std::string& what, const std::string& save) {
    std::string tmp;
    try {
        tmp = normtape::safetensors_temp_path(save);
    } catch (const normtape::IOError& e) {
        throw UsageError(what + ": " + e.what());
    }
    const std::string named = what + ": " + tmp + ", the temporary file a checkpoint is written to before it is renamed over " +
                              save + ", ";
    struct stat st;
    if (::lstat(tmp.c_str(), &st) != 0) {
        if (errno == ENOENT) return;  // the save creates it, in a directory checked writable
        throw UsageError(named + "cannot be examined: " + std::strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        throw UsageError(named + "is " + kind_of(st.st_mode) + ", expected a regular file or nothing (remove it)");
    if (::access(tmp.c_str(), W_OK) != 0) throw UsageError(named + "cannot be written: " + std::strerror(errno));
}

}  // namespace

std::string describe(const Args& a, const std::string& key, const std::string& value) {
    if (a.from_checkpoint.count(key)) return "--resume " + a.resume + ": the checkpoint's " + key + " " + value;
    return "--" + key + " " + value;
}

int64_t warmup_steps(const Args& a) { return a.warmup >= 0 ? a.warmup : std::max<int64_t>(1, a.steps / 10); }

double min_lr(const Args& a) { return std::isnan(a.min_lr) ? a.lr / 10 : a.min_lr; }

int64_t micro_batch(const Args& a) { return a.micro_batch > 0 ? a.micro_batch : a.batch; }

int64_t parse_budget(const std::string& text) {
    if (text == "auto") return -1;
    const auto bad = [&] {
        return UsageError("--memory-budget " + (text.empty() ? "\"\"" : text) +
                          ": expected auto or a size: a number of bytes with an optional unit B, KB, MB, GB, KiB, MiB "
                          "or GiB (6GiB, 512MiB, 2.5e9)");
    };
    size_t end = 0;
    double value = 0;
    try {
        value = std::stod(text, &end);
    } catch (const std::exception&) {
        throw bad();
    }
    const std::string unit = text.substr(end);
    double scale = 0;
    for (auto [name, factor] : std::initializer_list<std::pair<const char*, double>>{
             {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0},
             {"GiB", 1073741824.0}})
        if (unit == name) scale = factor;
    const double bytes = value * scale;
    if (scale == 0 || !std::isfinite(bytes) || bytes < 1 || bytes > 9e18) throw bad();
    return static_cast<int64_t>(bytes);
}

void check_args(const Args& a) {
    for (const IntRange& r : kIntRanges) {
        int64_t v = a.*r.field;
        if (v < r.lo || v > r.hi)
            fail(a, r.key, std::to_string(v),
                 std::string(r.what) + " from " + std::to_string(r.lo) + " to " + std::to_string(r.hi));
    }
    if (!(std::isfinite(a.lr) && a.lr > 0 && a.lr <= 1e6))
        fail(a, "lr", format_real(a.lr), "a learning rate > 0 and <= 1e6");
    if (a.warmup != -1 && (a.warmup < 0 || a.warmup >= a.steps))
        fail(a, "warmup", std::to_string(a.warmup), "warm-up steps from 0 to --steps - 1 = " + std::to_string(a.steps - 1));
    if (!std::isnan(a.min_lr) && !(a.min_lr >= 0 && a.min_lr <= a.lr))
        fail(a, "min-lr", format_real(a.min_lr), "a learning rate from 0 to --lr = " + format_real(a.lr));
    if (!(a.beta2 >= 0 && a.beta2 < 1)) fail(a, "beta2", format_real(a.beta2), "a decay from 0 to 1 (exclusive)");
    if (!(std::isfinite(a.muon_lr) && a.muon_lr > 0 && a.muon_lr <= 1e6))
        fail(a, "muon-lr", format_real(a.muon_lr), "a learning rate > 0 and <= 1e6");
    if (!(a.dropout >= 0 && a.dropout < 1))
        fail(a, "dropout", format_real(a.dropout), "a probability from 0 to 1 (exclusive)");
    check_choice(a, "data-format", a.data_format, {"auto", "text", "llm.c", "raw"});
    check_choice(a, "arch", a.arch, {"gpt2", "nanochat", "llama"});
    check_choice(a, "optimizer", a.optimizer, {"adamw", "muon"});
    check_choice(a, "tie", a.tie, {"on", "off"});
    check_choice(a, "norm", a.norm, {"layer", "rms"});
    check_choice(a, "policy", a.policy, {"input", "output", "normalized", "both", "all"});
    check_choice(a, "recompute-activation", a.recompute_activation, {"on", "off"});
    check_choice(a, "device", a.device, {"cpu", "cuda"});
    check_choice(a, "dtype", a.dtype, {"f32", "bf16"});
    check_choice(a, "preset", a.preset, {"", "gpt2-medium-ish"});
    check_choice(a, "on-nan", a.on_nan, {"stop", "continue"});
    check_choice(a, "offload", a.offload, {"on", "off"});
    check_choice(a, "shard-optimizer", a.shard_optimizer, {"on", "off"});
    check_choice(a, "checkpoint", a.checkpoint, {"none", "blocks"});
    check_choice(a, "fused-loss", a.fused_loss, {"on", "off"});
    check_choice(a, "cuda-graph", a.cuda_graph, {"on", "off"});
    if (a.cuda_graph == "on") {  // Note [The step as a CUDA graph]
        auto refuse = [&](const std::string& what, const std::string& why) {
            throw UsageError("--cuda-graph on: " + what + " cannot be captured (" + why + ")");
        };
        if (a.dropout > 0) refuse(describe(a, "dropout", format_real(a.dropout)), "every replay would draw the same masks");
        if (a.offload == "on") refuse("--offload on", "its copies to the host run on another stream");
        if (a.fused_loss == "on") refuse("--fused-loss on", "it counts its targets on the host");
        if (a.detect_anomaly) refuse("--detect-anomaly", "it reads every op's output on the host");
        if (a.memory_sweep || !a.memory_budget.empty())
            refuse(a.memory_sweep ? "--memory-sweep" : "--memory-budget", "its settings may include offload");
        if (a.device != "cuda") refuse("--device " + a.device, "a CUDA graph runs on a GPU");
    }
    if (!a.memory_budget.empty()) parse_budget(a.memory_budget);
    if (!a.sweep_reference.empty() && !a.memory_sweep) throw UsageError("--sweep-reference needs --memory-sweep");
    if (a.checkpoint_every != 1 && a.checkpoint != "blocks")
        throw UsageError(describe(a, "checkpoint-every", std::to_string(a.checkpoint_every)) +
                         " needs --checkpoint blocks");
    if ((!a.memory_budget.empty() || a.memory_sweep) && (!a.resume.empty() || !a.save.empty()))
        throw UsageError(std::string(a.memory_sweep ? "--memory-sweep" : "--memory-budget") +
                         " trains runs of its own choosing: leave out --save and --resume");
    if (a.data != "random" && !data_is_tokens(a) && a.tokenizer.empty() && a.vocab != 256)
        throw UsageError(describe(a, "vocab", std::to_string(a.vocab)) +
                         " needs --data random, a token file or --tokenizer (text is read as 256 byte values)");
    if (!a.tokenizer.empty() && (a.data == "random" || data_is_tokens(a)))
        throw UsageError("--tokenizer encodes a text --data: " +
                         std::string(a.data == "random" ? "--data random has none" : "a token file holds ids already"));
    if (a.data == "random" && a.data_format != "auto")
        throw UsageError("--data-format " + a.data_format + " reads a file: --data random has none");
    if (data_is_tokens(a) && a.sample > 0)
        throw UsageError("--sample prints text: a token file's ids have no tokenizer to decode them (train on a text "
                         "with --tokenizer to sample)");
    if (a.embd % a.heads != 0)
        throw UsageError(describe(a, "embd", std::to_string(a.embd)) + " is not divisible by " +
                         describe(a, "heads", std::to_string(a.heads)));
    if (a.micro_batch > 0 && a.batch % a.micro_batch != 0)
        throw UsageError(describe(a, "batch", std::to_string(a.batch)) + " is not a multiple of " +
                         describe(a, "micro-batch", std::to_string(a.micro_batch)) +
                         " (each step runs --batch / --micro-batch micro-batches of equal size)");
    if (a.kv_heads > 0 && a.heads % a.kv_heads != 0)
        throw UsageError(describe(a, "heads", std::to_string(a.heads)) + " is not divisible by " +
                         describe(a, "kv-heads", std::to_string(a.kv_heads)));
    if (a.arch != "gpt2" && (a.embd / a.heads) % 2 != 0)
        throw UsageError("--arch " + a.arch + " rotates pairs of each head's values: the head size --embd / --heads = " +
                         std::to_string(a.embd / a.heads) + " must be even");
    if (a.save_every > 0 && a.save.empty()) throw UsageError("--save-every needs --save FILE");
    if ((!a.resume.empty() || a.save_every > 0 || a.stop_at > 0) && (a.policy == "both" || a.policy == "all"))
        throw UsageError("--resume, --stop-at and --save-every follow one run: give --policy input, output or normalized");
    if (!(std::isfinite(a.val_fraction) && a.val_fraction >= 0 && a.val_fraction <= 0.5))
        fail(a, "val-fraction", format_real(a.val_fraction), "a fraction of the text from 0 to 0.5");
    const bool held_out = a.data != "random" && a.val_fraction > 0;
    if (!held_out && (a.eval_every > 0 || a.save_best))
        throw UsageError(std::string(a.eval_every > 0 ? "--eval-every" : "--save-best") +
                         " needs held-out text: --data FILE (not random) and --val-fraction > 0");
    if (a.save_best && a.save.empty()) throw UsageError("--save-best needs --save FILE");
    if (a.save_best && a.save_every > 0)
        throw UsageError("--save-best and --save-every choose when --save writes: give one of them");
    if (a.stop_at > a.steps)
        throw UsageError("--stop-at " + std::to_string(a.stop_at) + " is past " +
                         describe(a, "steps", std::to_string(a.steps)));
}

void check_outputs(const Args& a, const std::vector<RunInput>& inputs) {
    struct Output {
        const char* flag;
        const std::string& path;
    };
    const Output outputs[] = {{"--save", a.save}, {"--json", a.json}, {"--chart", a.chart}};
    std::vector<std::pair<const Output*, fs::path>> checked;
    for (const Output& out : outputs) {
        if (out.path.empty()) continue;  // not asked for (the flags refuse an empty name)
        const bool is_save = out.flag == std::string_view("--save");
        const std::string what = std::string(out.flag) + " " + out.path;
        const fs::path file = written_file(out.path);
        std::error_code ec;
        const fs::file_status st = fs::status(file, ec);
        if (fs::is_directory(st)) throw UsageError(what + ": is a directory, expected a file name");
        // A checkpoint replaces its file by a rename: only a regular file may be replaced that way.
        if (is_save && fs::exists(st) && !fs::is_regular_file(st))
            throw UsageError(what + ": is not a regular file (a checkpoint replaces its file)");
        const fs::path dir = file.parent_path();
        if (!fs::exists(dir, ec)) throw UsageError(what + ": the directory " + dir.string() + " does not exist");
        if (!fs::is_directory(dir, ec)) throw UsageError(what + ": " + dir.string() + " is not a directory");
        if (::access(dir.c_str(), W_OK | X_OK) != 0)
            throw UsageError(what + ": cannot write into the directory " + dir.string() + ": " + std::strerror(errno));
        if (!is_save && fs::exists(st) && ::access(file.c_str(), W_OK) != 0)
            throw UsageError(what + ": cannot write the file: " + std::strerror(errno));
        if (is_save) check_save_temp(what, out.path);
        for (const RunInput& input : inputs)
            if (same_file(file, input.file)) throw UsageError(what + ": is a file the run reads (" + input.named + ")");
        if (!is_save && same_file(file, a.resume))
            throw UsageError(what + ": is the checkpoint the run resumes (--resume " + a.resume + ")");
        for (const auto& [other, other_file] : checked)
            if (other_file == file)
                throw UsageError(what + ": is also " + other->flag + " " + other->path + "; give each its own file");
        checked.emplace_back(&out, file);
    }
}
