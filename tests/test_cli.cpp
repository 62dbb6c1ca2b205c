// tests/test_cli.cpp: train_gpt as a user runs it: bad flags and data give one line and exit 2;
// a short run writes JSON whose measured saving equals the prediction.
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace normtape::testing;

TEST_SUITE("train_gpt") {

TEST_CASE("train_gpt: bad flags, values and data: one line on stderr, exit code 2") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    std::string short_file = dir / "short.txt";
    write_bytes(short_file, "tiny");
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
        RunResult r = run_train_gpt(dir, c.args);
        CAPTURE(r.err);
        CHECK(r.code == 2);
        CHECK(lines(r.err) == 1);
        CHECK(r.err.find(c.says) != std::string::npos);
    }
    RunResult help = run_train_gpt(dir, "--help");
    CHECK(help.code == 0);
    CHECK(help.out.find("--policy") != std::string::npos);
}

TEST_CASE("train_gpt: a short run writes JSON with measured saving == predicted saving") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    std::string json = dir / "run.json", chart = dir / "chart.svg";
    for (const char* norm : {"layer", "rms"}) {
        CAPTURE(norm);
        RunResult r = run_train_gpt(dir, std::string("--steps 3 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 "
                                                     "--log-every 1 --norm ") +
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
}

TEST_CASE("train_gpt: --detect-anomaly stops a diverging run at the first op that made a NaN or Inf, exit code 1") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    const std::string tiny = "--data random --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --policy input --log-every 1";
    // A healthy run raises nothing.
    RunResult healthy = run_train_gpt(dir, tiny + " --steps 3 --detect-anomaly");
    CAPTURE(healthy.err);
    CHECK(healthy.code == 0);
    // lr 1e4 diverges (weight decay alone multiplies each matrix by 1 - lr * 0.1 per step): without
    // the flag the run ends "successfully" with a NaN loss...
    const std::string diverging = tiny + " --steps 30 --lr 1e4";
    RunResult silent = run_train_gpt(dir, diverging);
    CAPTURE(silent.err);
    CHECK(silent.code == 0);
    CHECK(silent.out.find("nan") != std::string::npos);
    // ...with it, the run stops at the first non-finite value and says which op made it, and when.
    RunResult r = run_train_gpt(dir, diverging + " --detect-anomaly");
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
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    RunResult r = run_train_gpt(dir, "--data random --steps 1 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --policy input "
                             "--json /nonexistent-dir/run.json");
    CAPTURE(r.err);
    CHECK(r.code == 1);
    CHECK(lines(r.err) == 1);
    CHECK(r.err.find("--json: cannot open /nonexistent-dir/run.json for writing") != std::string::npos);
}

}  // TEST_SUITE
