// tests/test_cli.cpp: train_gpt as a user runs it: bad flags and data give one line and exit 2;
// a short run writes JSON whose measured saving equals the prediction.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace {

struct Result {
    int code;
    std::string out, err;
};

std::string slurp(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// A path unique to this process (ctest runs test cases in parallel processes).
std::string temp_path(const std::string& name) {
    std::string unique = "normtape_test_cli_" + std::to_string(getpid()) + "_" + name;
    return (std::filesystem::temp_directory_path() / unique).string();
}

Result run_train_gpt(const std::string& args) {
    std::string out = temp_path("stdout"), err = temp_path("stderr");
    std::string cmd = std::string(NORMTAPE_TRAIN_GPT) + " " + args + " > " + out + " 2> " + err;
    int status = std::system(cmd.c_str());
    Result r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
    std::remove(out.c_str());
    std::remove(err.c_str());
    return r;
}

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

}  // namespace

TEST_SUITE("train_gpt") {

TEST_CASE("train_gpt: bad flags, values and data: one line on stderr, exit code 2") {
    if (std::string(NORMTAPE_TRAIN_GPT).empty()) {
        MESSAGE("skipped: train_gpt was not built");
        return;
    }
    std::string short_file = temp_path("short.txt");
    {
        std::ofstream f(short_file);
        f << "tiny";
    }
    struct Case {
        std::string args, says;
    };
    for (const Case& c : {Case{"--bogus", "--bogus"}, Case{"--steps 0", "--steps"}, Case{"--steps abc", "--steps"},
                          Case{"--norm batch", "--norm"}, Case{"--policy all", "--policy"},
                          Case{"--embd 10 --heads 3", "not divisible"}, Case{"--lr -1", "--lr"},
                          Case{"--device tpu", "--device"}, Case{"--dtype f16", "--dtype"},
                          Case{"--vocab 100", "needs --data random"}, Case{"--data /nonexistent/file.txt", "cannot read data"},
                          Case{"--data " + short_file + " --seq 8", "needs at least 10"},
                          Case{"--detect-anomaly=maybe", "--detect-anomaly"}, Case{"--lr 1e7", "--lr"}}) {
        CAPTURE(c.args);
        Result r = run_train_gpt(c.args);
        CAPTURE(r.err);
        CHECK(r.code == 2);
        CHECK(lines(r.err) == 1);
        CHECK(r.err.find(c.says) != std::string::npos);
    }
    std::remove(short_file.c_str());
    Result help = run_train_gpt("--help");
    CHECK(help.code == 0);
    CHECK(help.out.find("--policy") != std::string::npos);
}

TEST_CASE("train_gpt: a short run writes JSON with measured saving == predicted saving") {
    if (std::string(NORMTAPE_TRAIN_GPT).empty()) {
        MESSAGE("skipped: train_gpt was not built");
        return;
    }
    std::string json = temp_path("run.json"), chart = temp_path("chart.svg");
    for (const char* norm : {"layer", "rms"}) {
        CAPTURE(norm);
        Result r = run_train_gpt(std::string("--steps 3 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --log-every 1 --norm ") +
                                 norm + " --json " + json + " --chart " + chart);
        CAPTURE(r.err);
        REQUIRE(r.code == 0);
        CHECK(r.out.find("= measured, to the byte") != std::string::npos);
        nlohmann::json j = nlohmann::json::parse(slurp(json));
        CHECK(j["predicted_saving_bytes"].get<int64_t>() == j["measured_saving_bytes"].get<int64_t>());
        CHECK(j["predicted_saving_bytes"].get<int64_t>() > 0);
        REQUIRE(j["runs"].size() == 2);
        CHECK(j["runs"][0]["policy"] == "input");
        CHECK(j["runs"][1]["policy"] == "output");
        CHECK(j["runs"][0]["losses"].size() == 3);
        CHECK(j["runs"][0]["saved_activation_bytes"].get<int64_t>() - j["runs"][1]["saved_activation_bytes"].get<int64_t>() ==
              j["measured_saving_bytes"].get<int64_t>());
        CHECK(slurp(chart).find("<svg") == 0);
    }
    std::remove(json.c_str());
    std::remove(chart.c_str());
}

TEST_CASE("train_gpt: --detect-anomaly stops a diverging run at the first op that made a NaN or Inf, exit code 1") {
    if (std::string(NORMTAPE_TRAIN_GPT).empty()) {
        MESSAGE("skipped: train_gpt was not built");
        return;
    }
    const std::string tiny = "--data random --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --policy input --log-every 1";
    // A healthy run raises nothing.
    Result healthy = run_train_gpt(tiny + " --steps 3 --detect-anomaly");
    CAPTURE(healthy.err);
    CHECK(healthy.code == 0);
    // lr 1e4 diverges (weight decay alone multiplies each matrix by 1 - lr * 0.1 per step): without
    // the flag the run ends "successfully" with a NaN loss...
    const std::string diverging = tiny + " --steps 30 --lr 1e4";
    Result silent = run_train_gpt(diverging);
    CAPTURE(silent.err);
    CHECK(silent.code == 0);
    CHECK(silent.out.find("nan") != std::string::npos);
    // ...with it, the run stops at the first non-finite value and says which op made it, and when.
    Result r = run_train_gpt(diverging + " --detect-anomaly");
    CAPTURE(r.err);
    CHECK(r.code == 1);
    CHECK(lines(r.err) == 1);
    CHECK(r.err.find("anomaly in ") != std::string::npos);
    CHECK(r.err.find("(at step ") != std::string::npos);
    const std::string prefix = "train_gpt: error: ";
    REQUIRE(r.err.rfind(prefix, 0) == 0);
    std::string op = r.err.substr(prefix.size(), r.err.find(':', prefix.size()) - prefix.size());
    CAPTURE(op);
    bool known = op.size() > 8 && op.compare(op.size() - 8, 8, "Backward") == 0;
    for (const char* name : {"add", "mul", "scale", "gelu", "sum", "mean", "matmul", "linear", "causal_self_attention",
                             "embedding", "cross_entropy", "layer_norm", "rms_norm"})
        known = known || op == name;
    CHECK(known);
    CHECK(r.out.find("nan") == std::string::npos);  // it stopped before printing a NaN loss
}

TEST_CASE("train_gpt: an output file that cannot be written: one line naming the file, exit code 1") {
    if (std::string(NORMTAPE_TRAIN_GPT).empty()) {
        MESSAGE("skipped: train_gpt was not built");
        return;
    }
    Result r = run_train_gpt("--data random --steps 1 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --policy input "
                             "--json /nonexistent-dir/run.json");
    CAPTURE(r.err);
    CHECK(r.code == 1);
    CHECK(lines(r.err) == 1);
    CHECK(r.err.find("--json: cannot open /nonexistent-dir/run.json for writing") != std::string::npos);
}

}  // TEST_SUITE
