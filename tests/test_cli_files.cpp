// tests/test_cli_files.cpp: train_gpt never loses work: its outputs are checked before the first
// step; a diverging run stops before it saves over a good checkpoint; a checkpoint's config goes
// through the flags' checks; a damaged checkpoint is refused (exit 2) or loads to the same state;
// a save killed at any moment leaves one good checkpoint and no orphan. The command line itself:
// tests/test_cli.cpp.
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;
namespace fs = std::filesystem;

namespace {

const std::string kTiny = "--data random --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --device cpu";

// Rewrites the train_gpt checkpoint `from` into `to` after `edit` changed its tensors or config.
using Edit = std::function<void(NamedTensors&, nlohmann::json&)>;
void rewrite(const std::string& from, const std::string& to, const Edit& edit) {
    std::map<std::string, std::string> meta;
    NamedTensors tensors = load_safetensors(from, &meta);
    nlohmann::json config = nlohmann::json::parse(meta.at("train_gpt.config"));
    edit(tensors, config);
    meta["train_gpt.config"] = config.dump();
    save_safetensors(to, tensors, meta);
}

// Whether every floating-point value of the safetensors file `path` is finite.
bool all_finite(const std::string& path) {
    for (const auto& [name, t] : load_safetensors(path))
        if (t.dtype() == DType::F32)
            for (float v : t.to_vector<float>())
                if (!std::isfinite(v)) return false;
    return true;
}

}  // namespace

TEST_SUITE("train_gpt") {

TEST_CASE("train_gpt: every output is checked before the first step, and inputs are never overwritten") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("outputs");
    const std::string data = dir / "data.txt", ck = dir / "ck.safetensors";
    write_bytes(data, std::string(300, 'x') + "the data\n");
    const std::string run = kTiny + " --data " + data + " --steps 2 --policy input";
    REQUIRE(run_train_gpt(dir, run + " --save " + ck + " --stop-at 1").code == 0);
    const std::string data_bytes = slurp(data), ck_bytes = slurp(ck);
    fs::create_symlink(data, dir / "link_to_data.txt");
    write_bytes(dir / "a_file", "not a directory");
    REQUIRE(mkfifo((dir / "fifo").c_str(), 0600) == 0);
    struct Case {
        std::string args, says;
    };
    for (const Case& c : {
             Case{run + " --save " + (dir / "missing/ck.safetensors"), "missing does not exist"},
             Case{run + " --json " + (dir / "missing/run.json"), "missing does not exist"},
             Case{run + " --chart " + (dir / "missing/chart.svg"), "missing does not exist"},
             Case{run + " --json " + (dir / "a_file/run.json"), "a_file is not a directory"},
             Case{run + " --json " + dir.path.string(), "is a directory, expected a file name"},
             Case{run + " --save " + (dir / "fifo"), "is not a regular file"},
             Case{run + " --json " + data, "is a file the run reads (--data "},
             Case{run + " --chart " + data, "is a file the run reads (--data "},
             Case{run + " --save " + data, "is a file the run reads (--data "},
             Case{run + " --json " + (dir / "./link_to_data.txt"), "is a file the run reads (--data "},
             // A file a --data pattern matches.
             Case{kTiny + " --data '" + dir.path.string() + "/*.txt' --steps 2 --json " + data, "is a file the run reads (--data "},
             Case{"--resume " + ck + " --json " + ck, "is the checkpoint the run resumes"},
             Case{"--resume " + ck + " --chart " + ck, "is the checkpoint the run resumes"},
             Case{run + " --json " + (dir / "same") + " --chart " + (dir / "same"), "is also --json"},
         }) {
        CAPTURE(c.args);
        check_refused(run_train_gpt(dir, c.args), {c.says});
    }
    if (geteuid() != 0) {  // root writes into read-only directories
        fs::create_directory(dir / "read_only");
        fs::permissions(dir / "read_only", fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
        check_refused(run_train_gpt(dir, run + " --json " + (dir / "read_only/run.json")), {"cannot write into"});
    }
    CHECK(slurp(data) == data_bytes);
    CHECK(slurp(ck) == ck_bytes);
    // --save may name the checkpoint it resumes: the run goes on from it.
    RunResult on = run_train_gpt(dir, "--resume " + ck + " --save " + ck);
    CAPTURE(on.err);
    CHECK(on.code == 0);
    CHECK(slurp(ck) != ck_bytes);
}

TEST_CASE("train_gpt: a diverging run stops at its first non-finite loss, exit 1, keeping the good checkpoint") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("diverge");
    // lr 1e4 diverges within a few steps; a checkpoint is due after every step.
    const std::string diverging = kTiny + " --policy output --steps 30 --lr 1e4 --save-every 1 --log-every 1";
    RunResult r = run_train_gpt(dir, diverging + " --save " + (dir / "ck.safetensors") + " --json " +
                                         (dir / "run.json") + " --chart " + (dir / "run.svg"));
    CAPTURE(r.out);
    CAPTURE(r.err);
    CHECK(r.code == 1);
    CHECK(lines(r.err) == 1);
    for (const char* s : {"at step ", "of the output run: the run stopped", "--detect-anomaly", "--on-nan continue"})
        CHECK(r.err.find(s) != std::string::npos);
    CHECK(r.out.find("|weight|") == std::string::npos);  // the note on small norm weights is not the cause
    CHECK(r.out.find("not written") != std::string::npos);
    // The checkpoint on disk is the last good one: it loads, and every value in it is finite.
    REQUIRE(fs::exists(dir / "ck.safetensors"));
    CHECK(all_finite(dir / "ck.safetensors"));
    RunResult resumed = run_train_gpt(dir, "--resume " + (dir / "ck.safetensors") + " --stop-at 30 --on-nan continue");
    CHECK(resumed.out.find("resumed from") != std::string::npos);
    // The report keeps the run: the losses up to the stop (null where non-finite), and a chart that
    // draws the finite part and marks where the loss stopped being finite.
    nlohmann::json j = nlohmann::json::parse(slurp(dir / "run.json"));
    const nlohmann::json& run = j["runs"][0];
    int64_t bad = run["nonfinite_step"].get<int64_t>();
    CHECK(bad > 1);
    REQUIRE(run["losses"].size() == static_cast<size_t>(bad));
    CHECK(run["losses"].back().is_null());
    CHECK(run["losses"][0].is_number());
    std::string svg = slurp(dir / "run.svg");
    CHECK(svg.find("loss non-finite from here") != std::string::npos);
    CHECK(svg.find("nan") == std::string::npos);
    CHECK(svg.find("inf") == std::string::npos);

    // --on-nan continue trains to the end, as before, and still saves no non-finite checkpoint.
    RunResult cont = run_train_gpt(dir, diverging + " --on-nan continue --save " + (dir / "ck2.safetensors"));
    CAPTURE(cont.err);
    CHECK(cont.code == 0);
    CHECK(cont.out.find("step    30/30") != std::string::npos);
    CHECK(cont.out.find("not written at step 30") != std::string::npos);
    CHECK(all_finite(dir / "ck2.safetensors"));
}

TEST_CASE("train_gpt: a checkpoint's config and tensors are checked as flags are, exit 2 naming the checkpoint") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("forged");
    const std::string ck = dir / "ck.safetensors", forged = dir / "forged.safetensors";
    write_bytes(dir / "data.txt", std::string(300, 'y') + "the data\n");
    // Saved with a relative data path, from `dir`.
    REQUIRE(run_train_gpt(dir, "--data data.txt --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --device cpu "
                               "--policy input --steps 4 --stop-at 2 --save " + ck).code == 0);
    struct Case {
        Edit edit;
        std::string says;
    };
    auto set = [](const char* key, nlohmann::json value) -> Edit {
        return [=](NamedTensors&, nlohmann::json& j) { j[key] = value; };
    };
    const std::string of = "--resume " + forged + ": the checkpoint's ";
    for (const Case& c : {
             Case{set("dtype", "f16"), of + "dtype \"f16\": expected f32 or bf16"},
             Case{set("norm", "batch"), of + "norm \"batch\": expected layer or rms"},
             Case{set("heads", 3), of + "heads 3"},
             Case{set("batch", 10000000), of + "batch 10000000: expected"},
             Case{set("lr", -1), of + "lr -1: expected a learning rate > 0"},
             Case{set("seed", -1), "config has seed -1, expected an integer from 0 to 2^64 - 1"},
             Case{set("steps", "many"), "config has steps \"many\", expected an integer"},
             Case{set("data_bytes", "x"), "config has data_bytes \"x\" and data_fnv1a64"},
             Case{set("val-fraction", 0.9), of + "val-fraction 0.9: expected a fraction of the text from 0 to 0.5"},
             Case{[](NamedTensors& t, nlohmann::json&) {
                      for (auto& [name, x] : t)
                          if (name == "h.0.ln_1.weight") x.data_ptr<float>()[3] = std::nanf("");
                  },
                  "parameter h.0.ln_1.weight holds a non-finite value (nan) at flat index 3"},
         }) {
        rewrite(ck, forged, c.edit);
        RunResult r = run_train_gpt(dir, "--resume " + forged);
        CAPTURE(c.says);
        check_refused(r, {c.says});
    }
    // The held-out fraction is part of the run; a checkpoint without one trained on the whole text.
    check_refused(run_train_gpt(dir, "--resume " + ck + " --val-fraction 0.2"),
                  {"the checkpoint's run has --val-fraction 0.1, this one asks for 0.2"});
    rewrite(ck, forged, [](NamedTensors&, nlohmann::json& j) { j.erase("val-fraction"); });
    check_refused(run_train_gpt(dir, "--resume " + forged + " --val-fraction 0.1"),
                  {"the checkpoint's run held nothing out, this one asks for --val-fraction 0.1"});
    RunResult whole = run_train_gpt(dir, "--resume " + forged);
    CAPTURE(whole.err);
    CHECK(whole.code == 0);
    CHECK(whole.out.find("val loss") == std::string::npos);
    // The saved data path is absolute: the run resumes from another directory.
    TempDir elsewhere("forged_elsewhere");
    RunResult moved = run_train_gpt(elsewhere, "--resume " + ck);
    CAPTURE(moved.err);
    CHECK(moved.code == 0);
    // A relative one (as older checkpoints hold) that does not resolve from here says what to do.
    rewrite(ck, forged, set("data", "data.txt"));
    check_refused(run_train_gpt(elsewhere, "--resume " + forged),
                  {"the checkpoint's data data.txt: cannot read the data file", "give --data FILE"});
    RunResult given = run_train_gpt(elsewhere, "--resume " + forged + " --data " + (dir / "data.txt"));
    CAPTURE(given.err);
    CHECK(given.code == 0);
}

TEST_CASE("train_gpt: --resume takes --optimizer from the checkpoint, refuses another, and adamw from an older one") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("resume_optimizer");
    const std::string muon_ck = dir / "muon.safetensors", adamw_ck = dir / "adamw.safetensors",
                      old_ck = dir / "old.safetensors", json = dir / "run.json";
    const std::string run = kTiny + " --policy input --steps 4 --stop-at 2 --save ";
    RunResult saved = run_train_gpt(dir, run + muon_ck + " --optimizer muon");
    CAPTURE(saved.err);
    REQUIRE(saved.code == 0);
    saved = run_train_gpt(dir, run + adamw_ck);  // adamw by default
    REQUIRE(saved.code == 0);
    // The run's optimizer is in the checkpoint's config; its state under each optimizer's key.
    for (const auto& [ck, optimizer] : {std::pair{muon_ck, "muon"}, std::pair{adamw_ck, "adamw"}}) {
        CAPTURE(ck);
        std::map<std::string, std::string> meta;
        load_safetensors(ck, &meta);
        CHECK(nlohmann::json::parse(meta.at("train_gpt.config"))["optimizer"] == optimizer);
        CHECK(meta.count("optimizer") == 1);
        CHECK(meta.count("optimizer.muon") == (std::string(optimizer) == "muon" ? 1u : 0u));
    }
    // Another optimizer than the checkpoint's: refused, naming both.
    check_refused(run_train_gpt(dir, "--resume " + muon_ck + " --optimizer adamw"),
                  {"--resume " + muon_ck + ": the checkpoint's run has --optimizer \"muon\", this one asks for \"adamw\""});
    check_refused(run_train_gpt(dir, "--resume " + adamw_ck + " --optimizer muon"),
                  {"the checkpoint's run has --optimizer \"adamw\", this one asks for \"muon\""});
    // Muon's step count is checked against the run's as AdamW's is.
    {
        std::map<std::string, std::string> meta;
        NamedTensors tensors = load_safetensors(muon_ck, &meta);
        nlohmann::json entry = nlohmann::json::parse(meta.at("optimizer.muon"));
        REQUIRE(entry["step"] == 2);
        entry["step"] = 1;
        meta["optimizer.muon"] = entry.dump();
        const std::string forged = dir / "muon_step.safetensors";
        save_safetensors(forged, tensors, meta);
        check_refused(run_train_gpt(dir, "--resume " + forged),
                      {"the checkpoint's training step (train_gpt.step 2) differs from its optimizer's step count "
                       "(\"step\": 2, Muon's 1 in its optimizers' metadata)"});
    }
    // The same one given or left out: it resumes with it.
    for (const std::string flag : {"", " --optimizer muon"}) {
        CAPTURE(flag);
        RunResult r = run_train_gpt(dir, "--resume " + muon_ck + flag + " --json " + json);
        CAPTURE(r.err);
        REQUIRE(r.code == 0);
        CHECK(r.out.find("resumed from") != std::string::npos);
        CHECK(r.out.find("Muon keeps") != std::string::npos);
        CHECK(nlohmann::json::parse(slurp(json))["runs"][0]["optimizer_state"]["muon_momentum_bytes"].get<int64_t>() > 0);
    }
    RunResult r = run_train_gpt(dir, "--resume " + adamw_ck + " --json " + json);
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("Muon keeps") == std::string::npos);
    CHECK(nlohmann::json::parse(slurp(json))["runs"][0]["optimizer_state"]["muon_momentum_bytes"] == 0);
    // A checkpoint written before --optimizer existed trained with AdamW: it resumes so, and the
    // flag, which its run could not give, is refused.
    rewrite(adamw_ck, old_ck, [](NamedTensors&, nlohmann::json& j) { j.erase("optimizer"); });
    r = run_train_gpt(dir, "--resume " + old_ck + " --json " + json + " --save " + (dir / "again.safetensors"));
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("Muon keeps") == std::string::npos);
    CHECK(nlohmann::json::parse(slurp(json))["runs"][0]["optimizer_state"]["muon_momentum_bytes"] == 0);
    {
        std::map<std::string, std::string> meta;
        load_safetensors(dir / "again.safetensors", &meta);
        CHECK(nlohmann::json::parse(meta.at("train_gpt.config"))["optimizer"] == "adamw");
    }
    for (const char* optimizer : {"muon", "adamw"}) {
        CAPTURE(optimizer);
        check_refused(run_train_gpt(dir, "--resume " + old_ck + " --optimizer " + optimizer),
                      {"the checkpoint's config has no \"optimizer\" (its run used the default): leave --optimizer out"});
    }
    // A checkpoint of random tokens written before --data-format existed resumes as one of random
    // tokens (the format of a file it never read is auto).
    rewrite(adamw_ck, old_ck, [](NamedTensors&, nlohmann::json& j) { j.erase("data-format"); });
    r = run_train_gpt(dir, "--resume " + old_ck);
    CAPTURE(r.err);
    CHECK(r.code == 0);
}

TEST_CASE("train_gpt: a data file that cannot be read whole is refused before training, exit 2, with the bytes read") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
#if defined(__SANITIZE_ADDRESS__)
    SKIP_TEST("the read is made to fail by a cap on the address space, which AddressSanitizer cannot start under");
#endif
    TempDir dir("unreadable_data");
    const std::string big = dir / "big.txt";
    write_bytes(big, "");
    fs::resize_file(big, uint64_t{8} << 30);  // 8 GiB of zeros, sparse: no disk is used
    // Under a 4 GiB address space the 8 GiB cannot be held: the read must fail, not stop short.
    RunResult r = run_train_gpt(dir, "--data " + big + " --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --device cpu "
                                "--policy input --steps 1", address_space_limit(4));
    check_refused(r, {"--data " + big + ": cannot read the data file: read ", " of its 8589934592 bytes: ",
                      "Cannot allocate memory"});
}

TEST_CASE("train_gpt: something in the way of --save's temporary file is refused before the first step, exit 2") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("save_tmp");
    fs::create_directory(dir / "real");
    fs::create_symlink("real/ck.safetensors", dir / "link.safetensors");
    struct Case {
        std::string save, tmp;  // the flag's file, and where a save writes first (through the link)
        std::function<void(const std::string&)> make;
        std::string says;
    };
    const std::string ck = dir / "ck.safetensors";
    for (const Case& c : {
             Case{ck, ck + ".tmp", [](const std::string& t) { fs::create_directory(t); }, "is a directory"},
             Case{ck, ck + ".tmp", [](const std::string& t) { REQUIRE(mkfifo(t.c_str(), 0600) == 0); }, "is a FIFO"},
             Case{ck, ck + ".tmp", [&](const std::string& t) { fs::create_symlink(dir / "nowhere", t); },
                  "is a symbolic link"},
             Case{dir / "link.safetensors", dir / "real/ck.safetensors.tmp",
                  [](const std::string& t) { fs::create_directory(t); }, "is a directory"},
         }) {
        CAPTURE(c.save);
        CAPTURE(c.says);
        c.make(c.tmp);
        check_refused(run_train_gpt(dir, kTiny + " --policy input --steps 2 --save " + c.save),
                      {"--save " + c.save + ": " + c.tmp + ", the temporary file a checkpoint is written to", c.says,
                       "expected a regular file or nothing"});
        CHECK(!fs::exists(dir / "ck.safetensors"));
        CHECK(!fs::exists(dir / "real/ck.safetensors"));
        fs::remove(c.tmp);
    }
    // A regular file there (a killed save's) is no obstacle: the save takes it over.
    write_bytes(ck + ".tmp", "left by a killed save");
    RunResult r = run_train_gpt(dir, kTiny + " --policy input --steps 2 --save " + ck);
    CAPTURE(r.err);
    CHECK(r.code == 0);
    CHECK(fs::exists(ck));
    CHECK(!fs::exists(ck + ".tmp"));
}

TEST_CASE("train_gpt: a checkpoint's second moments and steps are checked at load, exit 2 naming the value") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("forged_state");
    const std::string ck = dir / "ck.safetensors", forged = dir / "forged.safetensors";
    REQUIRE(run_train_gpt(dir, kTiny + " --policy input --steps 40 --stop-at 10 --save " + ck).code == 0);
    // `ck` with one value of tensor `name` set to `value`, or metadata `key` set to `text`; saved
    // again, so its checksums hold.
    auto forge = [&](const std::string& name, int64_t index, float value, const std::string& key = "",
                     const std::string& text = "") {
        std::map<std::string, std::string> meta;
        NamedTensors tensors = load_safetensors(ck, &meta);
        for (auto& [n, t] : tensors)
            if (n == name) t.data_ptr<float>()[index] = value;
        if (!key.empty()) meta[key] = text;
        save_safetensors(forged, tensors, meta);
    };
    const std::string of = "--resume: load_checkpoint: " + forged + ": optimizer state ";
    forge("optimizer.exp_avg_sq.h.0.ln_1.weight", 3, -1.0f);
    check_refused(run_train_gpt(dir, "--resume " + forged),
                  {of + "optimizer.exp_avg_sq.h.0.ln_1.weight holds a negative value (-1) at flat index 3 of [16] f32",
                   "expected AdamW's second moment, a mean of squares, >= 0"});
    forge("optimizer.exp_avg.wte.weight", 7, std::numeric_limits<float>::infinity());
    check_refused(run_train_gpt(dir, "--resume " + forged),
                  {of + "optimizer.exp_avg.wte.weight holds a non-finite value (inf) at flat index 7"});
    forge("", 0, 0, "train_gpt.step", "9");
    check_refused(run_train_gpt(dir, "--resume " + forged),
                  {"--resume " + forged + ": the checkpoint's training step (train_gpt.step 9) differs from its "
                   "optimizer's step count (\"step\": 10 in its optimizers' metadata)"});
    // A negative first moment is a value AdamW makes: it resumes.
    forge("optimizer.exp_avg.h.0.ln_1.weight", 3, -1.0f);
    RunResult r = run_train_gpt(dir, "--resume " + forged + " --stop-at 11");
    CAPTURE(r.err);
    CHECK(r.code == 0);
}

TEST_CASE("train_gpt: a checkpoint's config that describes a model larger than its file is refused, exit 2") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("forged_size");
    const std::string ck = dir / "ck.safetensors", forged = dir / "forged.safetensors";
    REQUIRE(run_train_gpt(dir, kTiny + " --policy input --steps 4 --stop-at 2 --save " + ck).code == 0);
    // Each size in its range, but 5.2e10 parameters (206 GB) where the file holds 11,632.
    rewrite(ck, forged, [](NamedTensors&, nlohmann::json& j) { j["embd"] = 65536; });
    check_refused(run_train_gpt(dir, "--resume " + forged, address_space_limit(4)),  // in case the model is built
                  {"--resume " + forged + ": its config (layers 1, heads 2, embd 65536, vocab 256, seq 8) describes a "
                   "model of 51574669312 parameters, but the file holds 11632 parameter values"});
}

TEST_CASE("train_gpt: output files that cannot be written at the end: the reason, exit code 1") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    if (!fs::exists("/dev/full")) SKIP_TEST("no /dev/full");
    TempDir dir("full");
    for (const char* flag : {"--json", "--chart"}) {
        RunResult r = run_train_gpt(dir, kTiny + " --policy input --steps 1 " + flag + " /dev/full");
        CAPTURE(r.err);
        CHECK(r.code == 1);
        CHECK(lines(r.err) == 1);
        CHECK(r.err.find(std::string(flag) + " /dev/full: cannot write: No space left on device") != std::string::npos);
    }
}

TEST_CASE("train_gpt: --save through a symbolic link writes the file it points to") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("symlink");
    fs::create_directory(dir / "real");
    fs::create_symlink("real/ck.safetensors", dir / "link.safetensors");
    RunResult r = run_train_gpt(dir, kTiny + " --policy input --steps 2 --save link.safetensors");
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    CHECK(fs::is_symlink(dir / "link.safetensors"));
    CHECK(load_safetensors(dir / "real/ck.safetensors").size() > 0);
    CHECK(listing(dir / "real") == std::vector<std::string>{"ck.safetensors"});
}

TEST_CASE("train_gpt: 200 random single-byte changes of a checkpoint: each refused with exit 2 or the same run state") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("flips");
    const std::string ck = dir / "ck.safetensors", victim = dir / "victim.safetensors";
    REQUIRE(run_train_gpt(dir, kTiny + " --policy input --steps 4 --stop-at 2 --save " + ck).code == 0);
    const std::string good = slurp(ck);
    uint64_t header_end = 8;
    for (int i = 0; i < 8; ++i) header_end += static_cast<uint64_t>(static_cast<unsigned char>(good[i])) << (8 * i);
    REQUIRE(header_end < good.size());
    // What resuming the intact file gives: the losses of steps 3 and 4, and the final checkpoint.
    auto resume = [&] { return run_train_gpt(dir, "--resume " + victim + " --save " + (dir / "end.safetensors") +
                                                      " --json " + (dir / "end.json")); };
    write_bytes(victim, good);
    REQUIRE(resume().code == 0);
    const std::string want_json = nlohmann::json::parse(slurp(dir / "end.json"))["runs"][0]["losses"].dump();
    const std::string want_end = slurp(dir / "end.safetensors");

    std::mt19937_64 rng(2026);
    int refused = 0, same = 0;
    for (int k = 0; k < 200; ++k) {
        // Half in the length and JSON header, half anywhere.
        uint64_t pos = rng() % (k % 2 ? good.size() : header_end);
        std::string bytes = good;
        bytes[pos] = static_cast<char>(static_cast<unsigned char>(bytes[pos]) ^ (1 + rng() % 255));
        write_bytes(victim, bytes);
        fs::remove(dir / "end.safetensors");
        RunResult r = resume();
        CAPTURE(k);
        CAPTURE(pos);
        CAPTURE(r.err);
        if (r.code == 2) {
            CHECK(lines(r.err) == 1);
            ++refused;
            continue;
        }
        REQUIRE(r.code == 0);
        CHECK(nlohmann::json::parse(slurp(dir / "end.json"))["runs"][0]["losses"].dump() == want_json);
        CHECK(slurp(dir / "end.safetensors") == want_end);
        ++same;
    }
    MESSAGE(refused << " refused, " << same << " loaded the same state");
    CHECK(refused + same == 200);
    CHECK(refused > 150);
}

TEST_CASE("train_gpt: 20 kills during saves leave one good checkpoint and no orphan") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("kills");
    const std::string ck = dir / "ck.safetensors";
    // About 70 MB a checkpoint, saved after every step.
    const std::string run = "--data random --vocab 8192 --embd 256 --heads 2 --layers 2 --batch 1 --seq 8 --device cpu "
                            "--policy input --save " + ck;
    REQUIRE(run_train_gpt(dir, run + " --steps 1").code == 0);
    std::mt19937_64 rng(7);
    int left_temporary = 0;
    for (int k = 0; k < 20; ++k) {
        // Kill it a few milliseconds after a save has begun writing ck.safetensors.tmp (a stale one
        // from the last kill is older than this run).
        timespec started;
        clock_gettime(CLOCK_REALTIME, &started);
        pid_t pid = start_train_gpt(dir, run + " --steps 1000000 --save-every 1", dir / "log");
        struct stat st;
        for (int i = 0; i < 60'000; ++i) {  // up to a minute
            if (stat((ck + ".tmp").c_str(), &st) == 0 &&
                std::tie(st.st_mtim.tv_sec, st.st_mtim.tv_nsec) > std::tie(started.tv_sec, started.tv_nsec))
                break;
            usleep(1000);
        }
        usleep(static_cast<useconds_t>(rng() % 5000));
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
        CAPTURE(k);
        std::vector<std::string> files = listing(dir.path);
        std::erase_if(files, [](const std::string& f) { return f.rfind("ck.", 0) != 0; });
        CAPTURE(files);
        bool tmp = std::find(files.begin(), files.end(), "ck.safetensors.tmp") != files.end();
        left_temporary += tmp;
        CHECK(files.size() == (tmp ? 2u : 1u));
        CHECK(files[0] == "ck.safetensors");
        bool checksummed = false;
        CHECK_NOTHROW(load_safetensors(ck, nullptr, &checksummed));
        CHECK(checksummed);
    }
    MESSAGE(left_temporary << " of 20 kills fell in a save");
    CHECK(left_temporary > 0);  // the kills did hit saves
    // The next save to the same file takes the stale temporary file's place.
    REQUIRE(run_train_gpt(dir, run + " --steps 1").code == 0);
    CHECK(!fs::exists(ck + ".tmp"));
}

}  // TEST_SUITE
