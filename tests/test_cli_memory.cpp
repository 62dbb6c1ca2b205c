// tests/test_cli_memory.cpp: train_gpt's memory settings change the losses by rounding at most:
// --checkpoint blocks saves the predicted bytes and, like --offload on the cpu, trains bit for bit
// as without; --memory-budget trains with the planner's pick within the budget and --memory-sweep
// measures every setting; --micro-batch changes the losses by rounding only and saves one
// micro-batch's bytes. The command line itself: tests/test_cli.cpp.
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace normtape::testing;

namespace {

// The losses of each run of a train_gpt JSON file, in order.
std::vector<nlohmann::json> run_losses(const std::string& json_path) {
    const nlohmann::json j = nlohmann::json::parse(slurp(json_path));
    std::vector<nlohmann::json> out;
    for (const nlohmann::json& run : j["runs"]) out.push_back(run["losses"]);
    return out;
}

}  // namespace

TEST_SUITE("train_gpt") {

TEST_CASE("train_gpt: --checkpoint blocks saves the predicted bytes and trains bit for bit as without on the cpu") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    const std::string tiny = "--data random --device cpu --steps 3 --batch 2 --seq 8 --layers 2 --heads 2 --embd 16 "
                             "--log-every 10 --chart " + (dir / "c.svg");
    RunResult plain = run_train_gpt(dir, tiny + " --policy all --json " + (dir / "plain.json"));
    RunResult ck = run_train_gpt(dir, tiny + " --policy all --checkpoint blocks --json " + (dir / "ck.json"));
    CAPTURE(ck.err);
    REQUIRE(plain.code == 0);
    REQUIRE(ck.code == 0);
    CHECK(run_losses(dir / "ck.json") == run_losses(dir / "plain.json"));  // JSON keeps every double's digits
    size_t equal = 0;
    for (size_t at = ck.out.find("checkpointed blocks: saved activation bytes"); at != std::string::npos;
         at = ck.out.find("checkpointed blocks: saved activation bytes", at + 1))
        equal += ck.out.compare(ck.out.find('\n', at) - 23, 23, "= measured, to the byte") == 0;
    CHECK(equal == 3);
    CHECK(ck.out.find("activation recompute: not measured with --checkpoint blocks") != std::string::npos);
    CHECK(ck.out.find("not checked: with --checkpoint blocks") != std::string::npos);
    const nlohmann::json j = nlohmann::json::parse(slurp(dir / "ck.json"));
    CHECK(j["config"]["checkpoint"] == "blocks");
    for (const nlohmann::json& run : j["runs"]) {
        CAPTURE(run["policy"]);
        CHECK(run["saved_activation_bytes"] == run["predicted_saved_bytes"]);
        const int64_t block_inputs = 2 * 2 * 8 * 16 * 4;  // L B T C, f32
        CHECK(run["saved_bytes_by_category"]["checkpointed block inputs"].get<int64_t>() == block_inputs);
        CHECK(run["saved_bytes_by_category"]["attention"].get<int64_t>() == 0);
        CHECK(run["saved_bytes_by_category"]["MLP"].get<int64_t>() == 0);
    }
    // By hand, under Input: the 2 block inputs, wte's ids, ln_f's x and mean and rstd, the y that
    // lm_head saves, the logits, their log-sum-exps and the targets.
    const int64_t BT = 2 * 8, C = 16, V = 256;
    CHECK(j["runs"][0]["saved_activation_bytes"].get<int64_t>() ==
          2 * BT * C * 4 + BT * 8 + 2 * BT * C * 4 + 2 * BT * 4 + BT * V * 4 + BT * 4 + BT * 8);
    // A setting of the run, not of the model: a run saved without it resumes with it, to the same losses.
    const std::string ckpt = dir / "run.safetensors";
    RunResult first = run_train_gpt(dir, tiny + " --policy output --stop-at 2 --save " + ckpt);
    REQUIRE(first.code == 0);
    RunResult resumed = run_train_gpt(dir, "--resume " + ckpt + " --device cpu --checkpoint blocks --offload on --json " +
                                               (dir / "resumed.json") + " --chart " + (dir / "c.svg"));
    CAPTURE(resumed.err);
    REQUIRE(resumed.code == 0);
    const std::vector<nlohmann::json> resumed_losses = run_losses(dir / "resumed.json"),
                                      plain_losses = run_losses(dir / "plain.json");
    REQUIRE(resumed_losses.size() == 1);
    REQUIRE(plain_losses.size() == 3);
    CHECK(resumed_losses[0] == nlohmann::json::array({plain_losses[1][2]}));  // the output run's step 3
}

TEST_CASE("train_gpt: --offload on the cpu keeps the saved tensors where they are and trains bit for bit as without") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    const std::string tiny = "--data random --device cpu --steps 3 --batch 2 --seq 8 --layers 2 --heads 2 --embd 16 "
                             "--policy both --log-every 10 --chart " + (dir / "c.svg");
    RunResult plain = run_train_gpt(dir, tiny + " --json " + (dir / "plain.json"));
    RunResult off = run_train_gpt(dir, tiny + " --offload on --json " + (dir / "off.json"));
    CAPTURE(off.err);
    REQUIRE(plain.code == 0);
    REQUIRE(off.code == 0);
    CHECK(off.out.find("= measured, to the byte") != std::string::npos);
    CHECK(run_losses(dir / "off.json") == run_losses(dir / "plain.json"));
    const nlohmann::json a = nlohmann::json::parse(slurp(dir / "plain.json"));
    const nlohmann::json b = nlohmann::json::parse(slurp(dir / "off.json"));
    CHECK(b["config"]["offload"] == true);
    for (int k = 0; k < 2; ++k) {
        CHECK(b["runs"][k]["saved_activation_bytes"] == a["runs"][k]["saved_activation_bytes"]);
        CHECK(b["runs"][k]["saved_bytes_on_device"] == b["runs"][k]["saved_activation_bytes"]);
    }
}

TEST_CASE("train_gpt: --memory-budget trains with the planner's pick within the budget, and --memory-sweep measures every setting") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    const std::string tiny = "--data random --device cpu --steps 1 --seq 8 --layers 2 --heads 2 --embd 16 --batch 4 "
                             "--log-every 10 --chart " + (dir / "c.svg");
    // The budget between the least and the plain step's peak: the plan must trade something.
    RunResult plain = run_train_gpt(dir, tiny + " --policy input --recompute-activation off --json " + (dir / "p.json"));
    REQUIRE(plain.code == 0);
    const int64_t peak = nlohmann::json::parse(slurp(dir / "p.json"))["runs"][0]["peak_allocated_bytes"].get<int64_t>();
    const int64_t budget = peak - 1;
    RunResult planned = run_train_gpt(dir, tiny + " --memory-budget " + std::to_string(budget) + " --json " +
                                               (dir / "b.json"));
    CAPTURE(planned.out);
    CAPTURE(planned.err);
    REQUIRE(planned.code == 0);
    CHECK(planned.out.find("memory plan for ") != std::string::npos);
    CHECK(planned.out.find("(within it)") != std::string::npos);
    const nlohmann::json b = nlohmann::json::parse(slurp(dir / "b.json"));
    CHECK(b["runs"][0]["peak_allocated_bytes"].get<int64_t>() <= budget);
    CHECK(b["runs"][0]["peak_allocated_bytes"] == b["runs"][0]["predicted_peak_bytes"]);

    // Refused before training (exit 2, one line): bad sizes, the flags the plan sets, outputs of
    // one run, and a budget nothing fits (the message says what would).
    for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
             {"--memory-budget lots", "--memory-budget lots: expected auto or a size"},
             {"--memory-budget 6XB", "--memory-budget 6XB: expected auto or a size"},
             {"--memory-budget -1GiB", "--memory-budget -1GiB: expected auto or a size"},
             {"--memory-budget 1GiB --policy input", "--memory-budget chooses --policy: leave it out"},
             {"--memory-sweep --micro-batch 2", "--memory-sweep chooses --micro-batch: leave it out"},
             {"--memory-budget 1GiB --save x.safetensors", "--memory-budget trains runs of its own choosing"},
             {"--memory-budget 100kB", "--memory-budget 100kB: expected auto or a size"},
             {"--memory-budget 100KB", "--memory-budget 100KB: nothing fits in 100000 bytes: the least budget that fits is"},
             // An empty size trained with no plan; a sweep that nothing fits swept 0 settings, exit 0.
             {"--memory-budget ''", "--memory-budget \"\": expected auto or a size"},
             {"--memory-sweep --memory-budget 1", "--memory-budget 1: nothing fits in 1 bytes: the least budget that fits is"}}) {
        CAPTURE(args);
        check_refused(run_train_gpt(dir, tiny + " " + args), {says});
    }

    RunResult sweep = run_train_gpt(dir, tiny + " --memory-sweep --json " + (dir / "s.json"));
    CAPTURE(sweep.err);
    REQUIRE(sweep.code == 0);
    const nlohmann::json j = nlohmann::json::parse(slurp(dir / "s.json"));
    CHECK(j["sweep"].size() == 3 * 2 * 2 * 3 * 3);  // policies, recompute, fused, checkpoint 0/1/2, micro 4/2/1
    int64_t pareto = 0;
    for (const nlohmann::json& row : j["sweep"]) {
        CAPTURE(row["label"]);
        CHECK(row["peak_allocated_bytes"] == row["predicted_peak_bytes"]);  // exact on the cpu
        pareto += row["pareto"].get<bool>() ? 1 : 0;
    }
    CHECK(pareto >= 1);
    CHECK(slurp(dir / "c.svg").find("Pareto front") != std::string::npos);
}

TEST_CASE("train_gpt: --micro-batch 2 trains as the whole batch to rounding, and a forward saves a micro-batch's bytes") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    const std::string tiny = "--data random --device cpu --steps 4 --seq 8 --layers 2 --heads 2 --embd 16 --policy both "
                             "--log-every 10 --chart " + (dir / "c.svg");
    RunResult whole = run_train_gpt(dir, tiny + " --batch 4 --json " + (dir / "whole.json"));
    RunResult micro = run_train_gpt(dir, tiny + " --batch 4 --micro-batch 2 --json " + (dir / "micro.json"));
    RunResult one = run_train_gpt(dir, tiny + " --batch 4 --micro-batch 4 --json " + (dir / "one.json"));
    RunResult half = run_train_gpt(dir, tiny + " --batch 2 --json " + (dir / "half.json"));
    CAPTURE(micro.err);
    REQUIRE(whole.code == 0);
    REQUIRE(micro.code == 0);  // exit 0: every saved byte and saving = its prediction, at B = 2
    REQUIRE(one.code == 0);
    REQUIRE(half.code == 0);
    CHECK(micro.out.find("B=4 (micro-batches of 2) T=8") != std::string::npos);
    CHECK(one.out.find("micro-batches") == std::string::npos);
    const nlohmann::json w = nlohmann::json::parse(slurp(dir / "whole.json")),
                         m = nlohmann::json::parse(slurp(dir / "micro.json")),
                         h = nlohmann::json::parse(slurp(dir / "half.json"));
    CHECK(m["config"]["micro_batch"] == 2);
    CHECK(w["config"]["micro_batch"] == 4);  // without the flag: the whole batch
    // The losses: those of the whole batch but for the order in which the two halves' gradients
    // are summed (f32 on the cpu; about 1e-7 relative seen over these 4 steps, 1e-5 allowed).
    // A micro-batch of the whole batch is the step without the flag, bit for bit.
    CHECK(run_losses(dir / "one.json") == run_losses(dir / "whole.json"));
    const std::vector<nlohmann::json> whole_losses = run_losses(dir / "whole.json"),
                                      micro_losses = run_losses(dir / "micro.json");
    REQUIRE(micro_losses.size() == 2);
    for (size_t k = 0; k < 2; ++k) {
        REQUIRE(micro_losses[k].size() == 4);
        for (size_t i = 0; i < 4; ++i) {
            CAPTURE(k);
            CAPTURE(i);
            const double x = whole_losses[k][i].get<double>(), y = micro_losses[k][i].get<double>();
            CHECK(std::abs(x - y) <= 1e-5 * std::abs(x));
        }
    }
    // What a forward saves is a batch of 2's: the saved bytes, their predictions and the savings.
    for (const char* key : {"predicted_saving_bytes", "measured_saving_bytes", "predicted_recompute_saving_bytes"}) {
        CAPTURE(key);
        CHECK(m[key] == h[key]);
        CHECK(m[key].get<int64_t>() * 2 == w[key].get<int64_t>());  // every term is linear in B here
    }
    for (size_t k = 0; k < 2; ++k) {
        const nlohmann::json &mr = m["runs"][k], &hr = h["runs"][k];
        CAPTURE(mr["policy"]);
        for (const char* key : {"saved_activation_bytes", "predicted_saved_bytes", "recompute_saving_bytes",
                                "saved_bytes_by_category"}) {
            CAPTURE(key);
            CHECK(mr[key] == hr[key]);
        }
        CHECK(mr["saved_activation_bytes"] == mr["predicted_saved_bytes"]);
        CHECK(mr["saved_activation_bytes"].get<int64_t>() < w["runs"][k]["saved_activation_bytes"].get<int64_t>());
    }
}

}  // TEST_SUITE
