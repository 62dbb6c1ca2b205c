// examples/train_gpt/resume.cpp: --resume (examples/train_gpt/resume.h): the run's config, reading a checkpoint and
// checking that the resumed run is the checkpoint's. Not here: the restoring itself
// (examples/train_gpt/train_gpt.cpp).
#include "resume.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <limits>
#include <type_traits>

#include "../common/checkpoint_checks.h"
#include "../common/checksums.h"
#include "nn/formats/json_read.h"
#include "train_data.h"

using namespace normtape;

nlohmann::json run_config(const Args& a, SavePolicy policy, const TrainData& data) {
    // The data file's absolute path, so that a run can be resumed from another directory.
    std::string path =
        a.data == "random" ? a.data : std::filesystem::absolute(data_file(a)).lexically_normal().string();
    return {{"data", path},       {"data_bytes", data.bytes}, {"data_fnv1a64", hex(data.fnv1a64)},
            {"data-format", a.data_format},
            {"tokenizer", a.tokenizer.empty() ? "" : std::filesystem::absolute(a.tokenizer).lexically_normal().string()},
            {"tokenizer_fnv1a64", data.tokenizer ? hex(data.tokenizer_fnv1a64) : ""},
            {"steps", a.steps},   {"batch", a.batch},          {"seq", a.seq},
            {"arch", a.arch},     {"kv-heads", a.kv_heads},    {"tie", a.tie},
            {"layers", a.layers}, {"heads", a.heads},          {"embd", a.embd},
            {"vocab", a.vocab},   {"norm", a.norm},            {"policy", policy_name(policy)},
            {"dtype", a.dtype},   {"lr", a.lr},                {"seed", a.seed},
            {"val-fraction", a.val_fraction}, {"warmup", warmup_steps(a)}, {"min-lr", min_lr(a)},
            {"beta2", a.beta2},   {"dropout", a.dropout},          {"optimizer", a.optimizer},
            {"muon-lr", a.muon_lr}};
}

ResumeState read_resume(const std::string& path) {
    ResumeState r;
    r.path = path;
    try {
        bool checksummed = false;
        r.tensors = load_safetensors(path, &r.metadata, &checksummed);
        if (!checksummed) warn_unverified("train_gpt", "--resume " + path);
    } catch (const IOError& e) {
        throw UsageError(std::string("--resume: ") + e.what());
    } catch (const FormatError& e) {
        throw UsageError(std::string("--resume: ") + e.what());
    }
    const std::string not_ours = "--resume " + path + ": not a train_gpt checkpoint with training state (one written by "
                                 "train_gpt --save)";
    for (const char* key : {"train_gpt.config", "train_gpt.step", "train_gpt.batcher", "optimizer"})
        if (r.metadata.count(key) == 0) throw UsageError(not_ours + ": no \"" + key + "\" metadata");
    std::string why;
    if (!detail::parse_json(r.metadata["train_gpt.config"], r.config, why))
        throw UsageError(not_ours + ": malformed train_gpt.config: " + why);
    const std::string& step = r.metadata["train_gpt.step"];
    if (!r.config.is_object() || step.empty() || step.size() > 18 ||
        step.find_first_not_of("0123456789") != std::string::npos)
        throw UsageError(not_ours + ": malformed train_gpt.config or train_gpt.step");
    r.step = std::stoll(step);
    return r;
}

void apply_resume_config(const CLI::App& app, Args& a, const ResumeState& r) {
    auto take = [&](const char* flag, auto& field) {
        using T = std::decay_t<decltype(field)>;
        const char* key = flag + 2;
        const nlohmann::json saved = r.config.value(key, nlohmann::json());
        bool typed = false;
        if constexpr (std::is_same_v<T, std::string>) typed = saved.is_string();
        else if constexpr (std::is_same_v<T, double>) typed = saved.is_number();
        else if constexpr (std::is_same_v<T, uint64_t>) typed = saved.is_number_unsigned();
        else typed = saved.is_number_integer() && (!saved.is_number_unsigned() || saved.get<uint64_t>() <= INT64_MAX);
        if (!typed)
            throw UsageError("--resume " + r.path + ": the checkpoint's config has " +
                             (saved.is_null() ? "no \"" + std::string(key) + "\"" : key + (" " + detail::json_excerpt(saved))) +
                             ", expected " + (std::is_same_v<T, std::string> ? "a string"
                                              : std::is_same_v<T, double> ? "a number"
                                              : std::is_same_v<T, uint64_t> ? "an integer from 0 to 2^64 - 1"
                                                                            : "an integer"));
        if (app.count(flag) == 0) {
            field = saved.get<T>();
            a.from_checkpoint.insert(key);
        } else if (field != saved.get<T>()) {
            throw UsageError("--resume " + r.path + ": the checkpoint's run has " + flag + " " + detail::json_excerpt(saved) +
                             ", this one asks for " + detail::json_excerpt(nlohmann::json(field)) +
                             " (a resumed run must be the same run: leave the flag out to take the checkpoint's)");
        }
    };
    if (app.count("--policy") && (a.policy == "both" || a.policy == "all"))
        throw UsageError("--resume continues one run: give --policy input, output or normalized (the checkpoint's is " +
                         detail::json_excerpt(r.config.value("policy", nlohmann::json())) + "), not " + a.policy);
    take("--steps", a.steps);
    take("--batch", a.batch);
    take("--seq", a.seq);
    take("--layers", a.layers);
    take("--heads", a.heads);
    take("--embd", a.embd);
    take("--vocab", a.vocab);
    a.vocab_given = true;  // the checkpoint's model's
    take("--norm", a.norm);
    take("--policy", a.policy);
    take("--dtype", a.dtype);
    take("--lr", a.lr);
    take("--seed", a.seed);
    // A checkpoint without "val-fraction" trained on the whole text.
    if (r.config.contains("val-fraction")) {
        take("--val-fraction", a.val_fraction);
    } else if (app.count("--val-fraction") == 0) {
        a.val_fraction = 0;
        a.from_checkpoint.insert("val-fraction");
    } else if (a.val_fraction != 0) {
        throw UsageError("--resume " + r.path + ": the checkpoint's run held nothing out, this one asks for "
                         "--val-fraction " + nlohmann::json(a.val_fraction).dump() +
                         " (leave the flag out to take the checkpoint's)");
    }
    // Checkpoints written before these flags existed trained with their defaults then: the
    // default schedule, beta2 0.95, no dropout, GPT-2's architecture untied, AdamW.
    auto take_since = [&](const char* flag, auto& field, auto old) {
        if (r.config.contains(flag + 2)) return take(flag, field);
        if (app.count(flag))
            throw UsageError("--resume " + r.path + ": the checkpoint's config has no \"" + (flag + 2) +
                             "\" (its run used the default): leave " + flag + " out");
        field = old;
        a.from_checkpoint.insert(flag + 2);
    };
    take_since("--warmup", a.warmup, int64_t{-1});
    take_since("--min-lr", a.min_lr, std::numeric_limits<double>::quiet_NaN());
    take_since("--beta2", a.beta2, 0.95);
    take_since("--dropout", a.dropout, 0.0);
    take_since("--arch", a.arch, std::string("gpt2"));
    take_since("--kv-heads", a.kv_heads, int64_t{0});
    take_since("--tie", a.tie, std::string("off"));
    take_since("--optimizer", a.optimizer, std::string("adamw"));
    take_since("--muon-lr", a.muon_lr, 0.02);
    // Before --data-format a file was read as text, whatever its name.
    take_since("--data-format", a.data_format, std::string(r.config.value("data", "") == "random" ? "auto" : "text"));
    // --data may name the same bytes by another path: check_resume_data compares the bytes' size
    // and hash.
    if (app.count("--data") == 0) take("--data", a.data);
    if (app.count("--tokenizer") == 0 && r.config.contains("tokenizer")) take("--tokenizer", a.tokenizer);
}

void check_resume_data(const ResumeState& r, const TrainData& data) {
    const nlohmann::json bytes = r.config.value("data_bytes", nlohmann::json()),
                         hash = r.config.value("data_fnv1a64", nlohmann::json());
    if (!bytes.is_number_unsigned() || !hash.is_string())
        throw UsageError("--resume " + r.path + ": the checkpoint's config has data_bytes " + detail::json_excerpt(bytes) +
                         " and data_fnv1a64 " + detail::json_excerpt(hash) + ", expected an integer and a string");
    const uint64_t want_bytes = bytes.get<uint64_t>();
    const std::string want_hash = hash.get<std::string>();
    const std::string tokenizer_hash = data.tokenizer ? hex(data.tokenizer_fnv1a64) : "";
    if (const std::string want = r.config.value("tokenizer_fnv1a64", std::string()); want != tokenizer_hash)
        throw UsageError("--resume " + r.path + ": the tokenizer (" + (tokenizer_hash.empty() ? "none" : tokenizer_hash) +
                         ", FNV-1a of its rank file and JSON) is not the checkpoint's run's (" +
                         (want.empty() ? "none" : want) + ")");
    if (want_bytes != data.bytes || want_hash != hex(data.fnv1a64))
        throw UsageError("--resume " + r.path + ": the data (" + data.description + ", " + std::to_string(data.bytes) +
                         " bytes, FNV-1a " + hex(data.fnv1a64) + ") is not the checkpoint's run's (" +
                         std::to_string(want_bytes) + " bytes, FNV-1a " + want_hash + ")");
}
