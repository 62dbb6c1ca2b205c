// tests/test_checkpoint.cpp: checkpoints of a model and its optimizer (nn/formats/checkpoint.h) and
// resuming train_gpt.
// - the model and the optimizers' state (AdamW's, and Muon's beside it) round-trip bit for bit,
//   and training goes on identically;
// - train_gpt stopped at step k and resumed gives the losses of the run that never stopped, bit
//   for bit (with --micro-batch and --optimizer muon too), and refuses to resume another run,
//   saying why;
// - a failed save leaves the previous file intact and no temporary file behind;
// - loading leaks nothing.
// What loading refuses: tests/test_checkpoint_load.cpp. The safetensors format itself (bad files,
// other writers' files): tests/test_safetensors.cpp.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint_test_util.h"

using namespace normtape;
using namespace normtape::testing;
namespace fs = std::filesystem;

namespace {

// The losses of the single run in train_gpt's JSON, and the step of the first one.
std::vector<double> losses_of(const std::string& json_path, int64_t* first_step = nullptr) {
    nlohmann::json j = nlohmann::json::parse(slurp(json_path));
    REQUIRE(j["runs"].size() == 1);
    if (first_step) *first_step = j["runs"][0]["first_step"].get<int64_t>();
    return j["runs"][0]["losses"].get<std::vector<double>>();
}

}  // namespace

TEST_SUITE("checkpoint") {

TEST_CASE("checkpoint: model and AdamW state round-trip bit for bit, and training goes on identically") {
    for (DType dtype : {DType::F32, DType::BF16}) {  // bf16: the f32 master copies are part of the state
        CAPTURE(dtype_name(dtype));
        TempDir dir("roundtrip");
        manual_seed(1);
        GPT a(small_config(dtype));
        AdamW opt_a = make_optimizer(a);
        for (uint64_t s = 0; s < 3; ++s) train_step(a, opt_a, s);
        save_checkpoint(dir / "ck.safetensors", a, {{"note", "three steps"}}, &opt_a);

        manual_seed(2);  // other initial weights: everything must come from the file
        GPT b(small_config(dtype));
        AdamW opt_b = make_optimizer(b);
        std::map<std::string, std::string> meta;
        NamedTensors file = load_safetensors(dir / "ck.safetensors", &meta);
        CHECK(meta["note"] == "three steps");
        load_checkpoint(dir / "ck.safetensors", file, meta, b, &opt_b);
        CHECK(opt_b.step_count() == 3);
        NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
        REQUIRE(pa.size() == pb.size());
        // every parameter plus m and v of each, plus a master copy of each bf16 parameter
        CHECK(file.size() == pa.size() * (dtype == DType::BF16 ? 4 : 3));
        for (size_t i = 0; i < pa.size(); ++i) {
            CAPTURE(pa[i].first);
            CHECK(bytes_of(pa[i].second) == bytes_of(pb[i].second));
            const AdamW::ParamState &sa = opt_a.state(pa[i].second), &sb = opt_b.state(pb[i].second);
            CHECK(bytes_of(sa.m) == bytes_of(sb.m));
            CHECK(bytes_of(sa.v) == bytes_of(sb.v));
            CHECK(sa.master.defined() == (dtype == DType::BF16));
            if (sa.master.defined()) CHECK(bytes_of(sa.master) == bytes_of(sb.master));
        }
        // Two more steps on each: the same parameters, bit for bit.
        for (uint64_t s = 3; s < 5; ++s) {
            train_step(a, opt_a, s);
            train_step(b, opt_b, s);
        }
        pa = a.named_parameters();
        pb = b.named_parameters();
        for (size_t i = 0; i < pa.size(); ++i) {
            CAPTURE(pa[i].first);
            CHECK(bytes_of(pa[i].second) == bytes_of(pb[i].second));
        }
    }
}

TEST_CASE("checkpoint: a model with AdamW and Muon round-trips bit for bit, and training goes on identically") {
    for (DType dtype : {DType::F32, DType::BF16}) {  // bf16: both optimizers' f32 master copies are state
        CAPTURE(dtype_name(dtype));
        TempDir dir("roundtrip_muon");
        const std::string path = dir / "ck.safetensors";
        manual_seed(1);
        GPT a(small_config(dtype));
        MuonOptimizers opt_a = make_muon_optimizers(a);
        for (uint64_t s = 0; s < 3; ++s) train_step(a, opt_a, s);
        save_checkpoint(path, a, {{"note", "three steps"}}, &opt_a.adamw, &opt_a.muon);

        // The file: each parameter, AdamW's two moments or Muon's one buffer, a master copy of
        // each bf16 parameter, and an entry per optimizer.
        std::map<std::string, std::string> meta;
        NamedTensors file = load_safetensors(path, &meta);
        const MuonParamSplit split = param_groups_for_muon(a);
        const size_t n_params = a.named_parameters().size(), n_matrices = split.matrices.size();
        REQUIRE(n_matrices > 0);
        CHECK(file.size() == n_params + 2 * (n_params - n_matrices) + n_matrices + (dtype == DType::BF16 ? n_params : 0));
        CHECK(meta["note"] == "three steps");
        const nlohmann::json muon_entry = nlohmann::json::parse(meta.at("optimizer.muon"));
        CHECK(muon_entry["type"] == "Muon");
        CHECK(muon_entry["step"] == 3);
        CHECK(muon_entry["groups"][0]["size"] == n_matrices);
        CHECK(nlohmann::json::parse(meta.at("optimizer"))["groups"].size() == 3);

        manual_seed(2);  // other initial weights: everything must come from the file
        GPT b(small_config(dtype));
        MuonOptimizers opt_b = make_muon_optimizers(b);
        if (dtype == DType::F32) {
            bool checksummed = false;
            load_checkpoint(path, b, &opt_b.adamw, &checksummed, &opt_b.muon);
            CHECK(checksummed);
        } else {  // the overload for a file already read
            load_checkpoint(path, file, meta, b, &opt_b.adamw, &opt_b.muon);
        }
        CHECK(opt_b.adamw.step_count() == 3);
        CHECK(opt_b.muon.step_count() == 3);
        NamedTensors pa = a.named_parameters(), pb = b.named_parameters();
        REQUIRE(pa.size() == pb.size());
        int64_t in_muon = 0;
        for (size_t i = 0; i < pa.size(); ++i) {
            CAPTURE(pa[i].first);
            CHECK(bytes_of(pa[i].second) == bytes_of(pb[i].second));
            const bool muon = std::any_of(split.matrices.begin(), split.matrices.end(),
                                          [&](const Tensor& m) { return &m.impl() == &pa[i].second.impl(); });
            Tensor master_a, master_b;
            if (muon) {
                ++in_muon;
                const Muon::ParamState &sa = opt_a.muon.state(pa[i].second), &sb = opt_b.muon.state(pb[i].second);
                CHECK(bytes_of(sa.momentum_buffer) != bytes_of(zeros(sa.momentum_buffer.shape())));  // three steps' worth
                CHECK(bytes_of(sa.momentum_buffer) == bytes_of(sb.momentum_buffer));
                master_a = sa.master;
                master_b = sb.master;
            } else {
                const AdamW::ParamState &sa = opt_a.adamw.state(pa[i].second), &sb = opt_b.adamw.state(pb[i].second);
                CHECK(bytes_of(sa.m) == bytes_of(sb.m));
                CHECK(bytes_of(sa.v) == bytes_of(sb.v));
                master_a = sa.master;
                master_b = sb.master;
            }
            CHECK(master_a.defined() == (dtype == DType::BF16));
            if (master_a.defined()) CHECK(bytes_of(master_a) == bytes_of(master_b));
        }
        CHECK(in_muon == static_cast<int64_t>(n_matrices));
        // The next steps on each: the same parameters, bit for bit.
        for (uint64_t s = 3; s < 5; ++s) {
            train_step(a, opt_a, s);
            train_step(b, opt_b, s);
            pa = a.named_parameters();
            pb = b.named_parameters();
            for (size_t i = 0; i < pa.size(); ++i) {
                CAPTURE(s);
                CAPTURE(pa[i].first);
                CHECK(bytes_of(pa[i].second) == bytes_of(pb[i].second));
            }
        }
    }
}

TEST_CASE("checkpoint: train_gpt stopped and resumed gives the losses of the run that never stopped, bit for bit") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("resume");
    {
        std::string text;
        for (int i = 0; i < 60; ++i) text += "It is a truth universally acknowledged, line " + std::to_string(i) + ".\n";
        write_bytes(dir / "data.txt", text);
    }
    struct Case {
        std::string name, flags;
    };
    const std::string model = " --steps 7 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --log-every 1";
    for (const Case& c : {Case{"text, layer norm, input policy, f32", "--data " + (dir / "data.txt") + " --policy input"},
                          Case{"random tokens, rms norm, output policy, f32",
                               "--data random --vocab 64 --norm rms --policy output --seed 7"},
                          Case{"text, layer norm, output policy, bf16 (master copies)",
                               "--data " + (dir / "data.txt") + " --policy output --dtype bf16"},
                          // The dropout stream is restored, and the schedule's flags come from the checkpoint.
                          Case{"text, layer norm, normalized policy, f32, dropout and nanoGPT's schedule",
                               "--data " + (dir / "data.txt") +
                                   " --policy normalized --dropout 0.2 --warmup 2 --min-lr 1e-4 --beta2 0.99"},
                          // Muon's momentum buffers and AdamW's moments, each optimizer's step count;
                          // --optimizer comes from the checkpoint.
                          Case{"random tokens, rms norm, input policy, f32, Muon",
                               "--data random --vocab 64 --norm rms --policy input --seed 3 --optimizer muon"},
                          Case{"text, layer norm, output policy, bf16 (both optimizers' masters), Muon and a schedule",
                               "--data " + (dir / "data.txt") +
                                   " --policy output --dtype bf16 --optimizer muon --warmup 2 --min-lr 1e-4"}}) {
        CAPTURE(c.name);
        std::string flags = c.flags + model + " --device cpu";
        RunResult straight = run_train_gpt(dir, flags + " --json " + (dir / "straight.json"));
        CAPTURE(straight.err);
        REQUIRE(straight.code == 0);
        std::vector<double> all = losses_of(dir / "straight.json");
        REQUIRE(all.size() == 7);

        // Stop at 3 (saving every 2 steps too), resume to 5, resume again to the end.
        RunResult first = run_train_gpt(dir, flags + " --stop-at 3 --save-every 2 --save " + (dir / "ck.safetensors") +
                                                 " --json " + (dir / "first.json"));
        CAPTURE(first.err);
        REQUIRE(first.code == 0);
        CHECK(first.out.find("ck.safetensors (step 2)") != std::string::npos);
        CHECK(first.out.find("ck.safetensors (step 3)") != std::string::npos);
        RunResult second = run_train_gpt(dir, "--device cpu --resume " + (dir / "ck.safetensors") + " --stop-at 5 --save " +
                                                  (dir / "ck.safetensors") + " --json " + (dir / "second.json"));
        CAPTURE(second.err);
        REQUIRE(second.code == 0);
        CHECK(second.out.find("resumed from") != std::string::npos);
        RunResult third =
            run_train_gpt(dir, "--device cpu --resume " + (dir / "ck.safetensors") + " --json " + (dir / "third.json"));
        CAPTURE(third.err);
        REQUIRE(third.code == 0);

        std::vector<double> resumed;
        int64_t first_step[3];
        for (int k = 0; k < 3; ++k) {
            std::vector<double> part = losses_of(dir / (k == 0 ? "first.json" : k == 1 ? "second.json" : "third.json"),
                                                 &first_step[k]);
            CHECK(first_step[k] == static_cast<int64_t>(resumed.size()));
            resumed.insert(resumed.end(), part.begin(), part.end());
        }
        CHECK(first_step[1] == 3);
        CHECK(first_step[2] == 5);
        REQUIRE(resumed.size() == all.size());
        for (size_t i = 0; i < all.size(); ++i) {
            CAPTURE(i);
            CAPTURE(all[i]);
            CAPTURE(resumed[i]);
            CHECK(std::bit_cast<uint64_t>(all[i]) == std::bit_cast<uint64_t>(resumed[i]));
        }
    }
}

TEST_CASE("checkpoint: train_gpt with --micro-batch stopped and resumed gives the losses of the run that never stopped") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("resume_micro");
    {
        std::string text;
        for (int i = 0; i < 60; ++i) text += "It is a truth universally acknowledged, line " + std::to_string(i) + ".\n";
        write_bytes(dir / "data.txt", text);
    }
    // Dropout: the stream goes on across the micro-batches of a step and across the resume.
    const std::string flags = "--data " + (dir / "data.txt") +
                              " --policy output --dropout 0.1 --steps 5 --batch 4 --seq 8 --layers 1 --heads 2 "
                              "--embd 16 --device cpu --micro-batch 2 --chart " + (dir / "c.svg");
    RunResult straight = run_train_gpt(dir, flags + " --json " + (dir / "straight.json"));
    CAPTURE(straight.err);
    REQUIRE(straight.code == 0);
    const std::vector<double> all = losses_of(dir / "straight.json");
    REQUIRE(all.size() == 5);
    const std::string ck = dir / "ck.safetensors";
    RunResult first = run_train_gpt(dir, flags + " --stop-at 2 --save " + ck + " --json " + (dir / "first.json"));
    CAPTURE(first.err);
    REQUIRE(first.code == 0);
    // The micro-batch is not part of the run's config: the resumed run names it again.
    std::map<std::string, std::string> metadata;
    load_safetensors(ck, &metadata);
    const nlohmann::json config = nlohmann::json::parse(metadata.at("train_gpt.config"));
    CHECK(config.contains("batch"));
    CHECK_FALSE(config.contains("micro-batch"));
    RunResult second = run_train_gpt(dir, "--device cpu --resume " + ck + " --micro-batch 2 --json " +
                                              (dir / "second.json") + " --chart " + (dir / "c.svg"));
    CAPTURE(second.err);
    REQUIRE(second.code == 0);
    std::vector<double> resumed = losses_of(dir / "first.json");
    int64_t first_step = 0;
    const std::vector<double> rest = losses_of(dir / "second.json", &first_step);
    CHECK(first_step == 2);
    resumed.insert(resumed.end(), rest.begin(), rest.end());
    REQUIRE(resumed.size() == all.size());
    for (size_t i = 0; i < all.size(); ++i) {
        CAPTURE(i);
        CHECK(std::bit_cast<uint64_t>(all[i]) == std::bit_cast<uint64_t>(resumed[i]));
    }
    // A memory setting: the checkpoint also resumes with the whole batch (other dropout masks).
    RunResult whole = run_train_gpt(dir, "--device cpu --resume " + ck + " --json " + (dir / "whole.json") +
                                             " --chart " + (dir / "c.svg"));
    CAPTURE(whole.err);
    CHECK(whole.code == 0);
    CHECK(losses_of(dir / "whole.json").size() == 3);
}

TEST_CASE("checkpoint: train_gpt refuses to resume another run, naming what differs") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("mismatch");
    write_bytes(dir / "a.txt", std::string(400, 'a') + "the data of run a\n");
    write_bytes(dir / "b.txt", std::string(400, 'b') + "the data of run b\n");
    std::string ck = dir / "ck.safetensors";
    RunResult r = run_train_gpt(dir, "--data " + (dir / "a.txt") +
                                         " --steps 4 --stop-at 2 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 "
                                         "--policy output --device cpu --save " + ck);
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    manual_seed(0);
    save_checkpoint(dir / "model_only.safetensors", GPT(small_config()));
    write_bytes(dir / "garbage.safetensors", st_file("{\"w\": {\"dtype\": \"F16\", \"shape\": [1], \"data_offsets\": [0, 2]}}", "ab"));
    struct Case {
        std::string args;
        std::vector<std::string> says;
    };
    for (const Case& c :
         {Case{"--resume " + ck + " --layers 2", {"--layers 1", "asks for 2"}},
          Case{"--resume " + ck + " --embd 32", {"--embd 16", "asks for 32"}},
          Case{"--resume " + ck + " --lr 0.001", {"--lr 0.003", "asks for 0.001"}},
          Case{"--resume " + ck + " --steps 8", {"--steps 4", "asks for 8"}},
          Case{"--resume " + ck + " --norm rms", {"--norm \"layer\"", "asks for \"rms\""}},
          Case{"--resume " + ck + " --policy input", {"--policy \"output\"", "asks for \"input\""}},
          Case{"--resume " + ck + " --policy both", {"--policy input, output or normalized", "output"}},
          Case{"--resume " + ck + " --policy all", {"--policy input, output or normalized", "not all"}},
          Case{"--resume " + ck + " --data " + (dir / "b.txt"), {"b.txt", "is not the checkpoint's run's"}},
          Case{"--resume " + ck + " --stop-at 2", {"at step 2", "nothing is left"}},
          Case{"--resume " + ck + " --preset gpt2-medium-ish", {"--preset"}},
          Case{"--resume " + (dir / "model_only.safetensors"), {"model_only.safetensors", "not a train_gpt checkpoint"}},
          Case{"--resume " + (dir / "garbage.safetensors"), {"garbage.safetensors", "unsupported dtype \"F16\""}},
          Case{"--resume " + (dir / "missing.safetensors"), {"missing.safetensors", "cannot open"}},
          Case{"--stop-at 2 --save " + ck, {"--policy input, output or normalized"}},
          Case{"--save-every 2 --policy input", {"--save-every needs --save"}},
          Case{"--stop-at 9 --steps 4 --policy input", {"--stop-at 9 is past --steps 4"}}}) {
        CAPTURE(c.args);
        RunResult bad = run_train_gpt(dir, c.args);
        CAPTURE(bad.err);
        CHECK(bad.code == 2);
        CHECK(lines(bad.err) == 1);
        for (const std::string& s : c.says) CHECK(bad.err.find(s) != std::string::npos);
    }
    // The checkpoint still resumes after all that.
    RunResult ok = run_train_gpt(dir, "--resume " + ck);
    CAPTURE(ok.err);
    CHECK(ok.code == 0);
}

TEST_CASE("checkpoint: a failed save leaves the previous file intact and no temporary file behind") {
    TempDir dir("atomic");
    std::string path = dir / "ck.safetensors";
    manual_seed(5);
    GPT model(small_config());
    save_checkpoint(path, model);
    const std::string good = slurp(path);
    GPTConfig wide = small_config();
    wide.n_embd = 64;
    GPT bigger(wide);

    SUBCASE("the disk fills up mid-write (a file-size limit, which binds root too)") {
        struct rlimit old_limit;
        REQUIRE(getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
        void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
        struct rlimit small = old_limit;
        small.rlim_cur = 4096;
        REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
        struct Restore {  // the limit and the handler come back even if the check throws
            rlimit limit;
            void (*handler)(int);
            ~Restore() {
                setrlimit(RLIMIT_FSIZE, &limit);
                signal(SIGXFSZ, handler);
            }
        } restore{old_limit, old_handler};
        check_throws<IOError>([&] { save_checkpoint(path, bigger); }, {path});
    }
    SUBCASE("the target is a directory: the rename fails") {
        std::string d = dir / "a_directory";
        fs::create_directories(fs::path(d) / "inside");
        CHECK_THROWS_KIND_WITH(save_checkpoint(d, model), IOError, d, "renaming");
        CHECK(fs::is_directory(fs::path(d) / "inside"));
        fs::remove_all(d);
    }
    SUBCASE("the directory does not exist") {
        std::string missing = dir / "no_such_dir/ck.safetensors";
        CHECK_THROWS_KIND_WITH(save_checkpoint(missing, model), IOError, missing);
        CHECK(!fs::exists(dir / "no_such_dir"));
    }
    SUBCASE("the directory is read-only (as a user other than root)") {
        if (geteuid() == 0) {
            MESSAGE("skipped: root writes into read-only directories");
        } else {
            fs::permissions(dir.path, fs::perms::owner_read | fs::perms::owner_exec, fs::perm_options::replace);
            CHECK_THROWS_KIND_WITH(save_checkpoint(path, bigger), IOError, path);
            fs::permissions(dir.path, fs::perms::owner_all, fs::perm_options::replace);
        }
    }
    SUBCASE("a tensor cannot be written (undefined): nothing is touched") {
        CHECK_THROWS_KIND_WITH(save_safetensors(path, {{"a", ones({2})}, {"b", Tensor()}}), Error, "undefined");
    }
    CHECK(slurp(path) == good);
    CHECK(listing(dir.path) == std::vector<std::string>{"ck.safetensors"});
    GPT reloaded(small_config());
    load_checkpoint(path, reloaded);
    CHECK(bytes_of(reloaded.wte->weight) == bytes_of(model.wte->weight));
    // And a save that works replaces the file.
    save_checkpoint(path, bigger);
    CHECK(slurp(path) != good);
    CHECK(listing(dir.path) == std::vector<std::string>{"ck.safetensors"});
}

TEST_CASE("checkpoint: loading leaks nothing, whether it succeeds or fails") {
    TempDir dir("leaks");
    manual_seed(6);
    GPT model(small_config());
    AdamW optimizer = make_optimizer(model);
    train_step(model, optimizer, 0);
    save_checkpoint(dir / "ck.safetensors", model, {}, &optimizer);
    GPTConfig wide = small_config();
    wide.n_embd = 16;
    save_checkpoint(dir / "wide.safetensors", GPT(wide));
    write_bytes(dir / "bad.safetensors", st_file("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", "1234"));

    const int64_t start = memory_stats(Device::CPU).allocated_bytes;
    {
        NamedTensors t = load_safetensors(dir / "ck.safetensors");
        CHECK(memory_stats(Device::CPU).allocated_bytes > start);
    }
    CHECK(memory_stats(Device::CPU).allocated_bytes == start);
    load_checkpoint(dir / "ck.safetensors", model, &optimizer);  // copies into existing tensors
    CHECK(memory_stats(Device::CPU).allocated_bytes == start);
    CHECK_THROWS_AS(load_checkpoint(dir / "wide.safetensors", model), ShapeError);  // after every tensor was read
    CHECK(memory_stats(Device::CPU).allocated_bytes == start);
    CHECK_THROWS_AS(load_safetensors(dir / "bad.safetensors"), FormatError);
    CHECK(memory_stats(Device::CPU).allocated_bytes == start);
}

}  // TEST_SUITE
