// tests/test_cli.cpp: train_gpt's command line as a user meets it: every bad flag, value or input
// gives one line naming the cause and exits 2 before training; an error during the run exits 1;
// --help shows every default and the README lists the same flags; a short run writes JSON whose
// measured saving equals the prediction; --memory-report's categories add up to the saved bytes;
// --optimizer muon's state is as predicted, half of AdamW's for the matrices. The memory settings
// (--checkpoint blocks, --offload, --memory-budget, --micro-batch): tests/test_cli_memory.cpp.
// The files a run reads and writes (checkpoints, outputs, a diverging run): tests/test_cli_files.cpp.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace normtape::testing;

namespace {

const std::string kTiny = "--data random --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --policy input";

// The categories of --memory-report in the order printed (examples/train_gpt/saved_categories.h).
const char* const kCategories[] = {"norms", "attention", "MLP", "embeddings", "logits and loss",
                                   "checkpointed block inputs", "other"};

// "12,345" -> 12345
int64_t without_commas(std::string s) {
    s.erase(std::remove(s.begin(), s.end(), ','), s.end());
    return std::stoll(s);
}

// The option lines of train_gpt --help by flag, "--steps" -> "  --steps INT=300  training steps ...",
// --help left out.
std::map<std::string, std::string> help_options(const std::string& help) {
    std::map<std::string, std::string> options;
    std::istringstream in(help);
    for (std::string line; std::getline(in, line);) {
        size_t at = line.find_first_not_of(' ');
        if (at == 0 || at == std::string::npos || line.compare(at, 2, "--") != 0) continue;  // "-h,--help" too
        options[line.substr(at, line.find(' ', at) - at)] = line;
    }
    return options;
}

}  // namespace

TEST_SUITE("train_gpt") {

TEST_CASE("train_gpt: bad flags, values and data: one line naming the cause on stderr, exit code 2") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    write_bytes(dir / "short.txt", "tiny");
    write_bytes(dir / "fifty.txt", std::string(50, 'x'));
    struct Case {
        std::string args, says;
    };
    for (const Case& c : {
             Case{"--bogus", "--bogus"},
             Case{"--steps 0", "--steps 0: expected training steps from 1 to"},
             Case{"--steps abc", "--steps: expected an integer, got \"abc\""},
             Case{"--steps 1.5", "--steps: expected an integer, got \"1.5\""},
             Case{"--steps 99999999999999999999", "which is out of range"},
             Case{"--norm batch", "--norm \"batch\": expected layer or rms"},
             Case{"--policy every", "--policy \"every\": expected input or output or normalized or both or all"},
             Case{"--recompute-activation yes", "--recompute-activation \"yes\": expected on or off"},
             Case{"--embd 10 --heads 3", "--embd 10 is not divisible by --heads 3"},
             Case{"--lr -1", "--lr -1: expected a learning rate > 0"},
             Case{"--lr 0", "--lr 0: expected a learning rate > 0"},
             Case{"--lr nan", "--lr nan: expected a learning rate > 0"},
             Case{"--lr inf", "--lr inf: expected a learning rate > 0"},
             Case{"--lr 1e7", "--lr 1e+07: expected a learning rate > 0 and <= 1e6"},
             Case{"--seed -1", "--seed: expected an integer from 0 to 2^64 - 1, got \"-1\""},
             Case{"--seed 18446744073709551616",
                  "--seed: expected an integer from 0 to 2^64 - 1, got 18446744073709551616"},
             Case{"--device tpu", "--device \"tpu\": expected cpu or cuda"},
             Case{"--dtype f16", "--dtype \"f16\": expected f32 or bf16"},
             Case{"--on-nan maybe", "--on-nan \"maybe\": expected stop or continue"},
             Case{"--offload maybe", "--offload \"maybe\": expected on or off"},
             Case{"--checkpoint all", "--checkpoint \"all\": expected none or blocks"},
             Case{"--fused-loss maybe", "--fused-loss \"maybe\": expected on or off"},
             Case{"--optimizer sgd", "--optimizer \"sgd\": expected adamw or muon"},
             Case{"--batch 4 --micro-batch 3", "--batch 4 is not a multiple of --micro-batch 3"},
             Case{"--batch 4 --micro-batch 8", "--batch 4 is not a multiple of --micro-batch 8"},
             Case{"--micro-batch -1", "--micro-batch -1: expected sequences per micro-batch (0: --batch) from 0 to"},
             Case{"--checkpoint-every 2", "--checkpoint-every 2 needs --checkpoint blocks"},
             Case{"--checkpoint blocks --checkpoint-every 0", "--checkpoint-every 0: expected blocks per checkpointed"},
             Case{"--sweep-reference " + (dir / "short.txt"), "--sweep-reference needs --memory-sweep"},
             Case{"--vocab 100 --data " + (dir / "short.txt"), "--vocab 100 needs --data random"},
             Case{"--data /nonexistent/file.txt",
                  "--data /nonexistent/file.txt: cannot read the data file: No such file"},
             Case{"--data " + dir.path.string(), ": is a directory, expected a text file"},
             Case{"--data " + (dir / "short.txt") + " --seq 8", "has 4 bytes; --seq 8 needs at least 10"},
             Case{"--steps 10 --warmup 10", "--warmup 10: expected warm-up steps from 0 to --steps - 1 = 9"},
             Case{"--warmup -2", "--warmup -2: expected warm-up steps from 0"},
             Case{"--min-lr 0.01", "--min-lr 0.01: expected a learning rate from 0 to --lr = 0.003"},
             Case{"--beta2 1", "--beta2 1: expected a decay from 0 to 1 (exclusive)"},
             Case{"--optimizer muon --muon-lr 0", "--muon-lr 0: expected a learning rate > 0 and <= 1e6"},
             Case{"--muon-lr 0.01", "--muon-lr is Muon's: it needs --optimizer muon"},
             Case{"--optimizer muon --beta2 0.99", "--beta2 is the adamw run's"},
             Case{"--dropout 1", "--dropout 1: expected a probability from 0 to 1 (exclusive)"},
             Case{"--dropout -0.1", "--dropout -0.1: expected a probability from 0 to 1 (exclusive)"},
             Case{"--threads 2000", "--threads 2000: expected cpu threads (0: every core) from 0 to 1024"},
             Case{"--sample -1", "--sample -1: expected bytes to sample from 0 to"},
             Case{"--val-fraction 0.6", "--val-fraction 0.6: expected a fraction of the text from 0 to 0.5"},
             Case{"--val-fraction nan", "--val-fraction nan: expected a fraction of the text from 0 to 0.5"},
             Case{"--eval-batches 0", "--eval-batches 0: expected held-out batches per evaluation from 1 to"},
             Case{"--eval-every 5", "--eval-every needs held-out text: --data FILE (not random)"},
             Case{"--save-best --save x.safetensors", "--save-best needs held-out text"},
             Case{"--data " + (dir / "fifty.txt") + " --eval-every 5 --val-fraction 0",
                  "--eval-every needs held-out text"},
             Case{"--data " + (dir / "fifty.txt") + " --save-best", "--save-best needs --save FILE"},
             Case{"--data " + (dir / "fifty.txt") + " --save-best --save x.safetensors --save-every 2",
                  "--save-best and --save-every choose when --save writes: give one of them"},
             Case{"--data " + (dir / "fifty.txt"),
                  "--val-fraction 0.1: the held-out tail of the data has 5 bytes; --seq 8 needs at least 9"},
             Case{"--save ''", "--save: expected a file name, got an empty one"},
             Case{"--json ''", "--json: expected a file name, got an empty one"},
             Case{"--chart ''", "--chart: expected a file name, got an empty one"},
             Case{"--detect-anomaly=maybe", "--detect-anomaly"},
         }) {
        CAPTURE(c.args);
        check_refused(run_train_gpt(dir, kTiny + " --steps 1 " + c.args), {c.says});
    }
}

TEST_CASE("train_gpt: more than memory holds is an error of the run, exit code 1, naming the sizes") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
#if defined(__SANITIZE_ADDRESS__)
    SKIP_TEST("AddressSanitizer's allocator aborts on an allocation it cannot make instead of throwing std::bad_alloc");
#endif
    TempDir dir("cli");
    // 16 GiB of address space: the batch alone asks for 2^40 * 8 bytes (without the limit, a
    // machine that overcommits memory would grant it and kill the process when it touches it).
    RunResult r =
        run_train_gpt(dir, kTiny + " --steps 1 --device cpu --batch 1048576 --seq 1048576", address_space_limit(16));
    CAPTURE(r.err);
    CHECK(r.code == 1);
    CHECK(lines(r.err) == 1);
    CHECK(r.err.find("Batcher: cannot allocate a batch") != std::string::npos);  // the allocator's OutOfMemoryError
    CHECK(r.err.find("out of memory on cpu") != std::string::npos);
    CHECK(r.err.find("B=1048576 T=1048576") != std::string::npos);
}

TEST_CASE("train_gpt: --help shows every default, and the README lists the same flags") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    RunResult help = run_train_gpt(dir, "--help");
    REQUIRE(help.code == 0);
    const std::map<std::string, std::string> options = help_options(help.out);
    CHECK(options.size() > 20);
    // Each option shows its default: after its type, "=value" (Debian's CLI11, "INT=300") or " [value]"
    // (a later CLI11's, "INT [300]"), or "(default: ...)".
    std::set<std::string> flags;
    for (const auto& [flag, line] : options) {
        CAPTURE(line);
        size_t type = line.find(flag) + flag.size() + 1;
        std::string type_and_default = line.substr(type, line.find(' ', type) - type);
        const bool bracketed = line.compare(type + type_and_default.size(), 2, " [") == 0;
        CHECK((type_and_default.find('=') != std::string::npos || bracketed ||
               line.find("(default: ") != std::string::npos));
        flags.insert(flag);
    }
    // The README's flag table names each flag once, and no other.
    std::string readme = slurp(std::string(NORMTAPE_SOURCE_DIR) + "/README.md");
    size_t begin = readme.find("| flag | default | meaning |");
    REQUIRE(begin != std::string::npos);
    size_t end = readme.find("\n\n", begin);
    std::set<std::string> listed;
    std::istringstream table(readme.substr(begin, end - begin));
    for (std::string line; std::getline(table, line);) {
        if (line.rfind("| `--", 0) != 0) continue;
        std::string flag = line.substr(3, line.find('`', 3) - 3);
        CHECK_MESSAGE(listed.insert(flag).second, flag << " is listed twice");
    }
    CHECK(listed == flags);
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
        CHECK(j["runs"][1]["measured_saving_bytes"] == j["measured_saving_bytes"]);
        // GELU recompute (on by default): L * 4 * B*T*C elements, measured in each run.
        const int64_t element = j["config"]["dtype"] == "bf16" ? 2 : 4;  // bf16 by default on a GPU
        CHECK(j["predicted_recompute_saving_bytes"].get<int64_t>() == 1 * 4 * 2 * 8 * 16 * element);
        for (int k = 0; k < 2; ++k)
            CHECK(j["runs"][k]["recompute_saving_bytes"] == j["predicted_recompute_saving_bytes"]);
        CHECK(slurp(chart).find("<svg") == 0);
    }
}

TEST_CASE("train_gpt: --optimizer muon trains, its state as predicted, half of AdamW's for the blocks' matrices") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli_muon");
    const std::string json = dir / "run.json";
    // The line of stdout that holds `what` ("" when none does).
    auto line_of = [](const std::string& out, const std::string& what) {
        const size_t at = out.find(what);
        if (at == std::string::npos) return std::string();
        const size_t begin = out.rfind('\n', at) + 1, end = out.find('\n', at);
        return out.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    };
    std::map<std::string, nlohmann::json> state;  // runs[0].optimizer_state by --optimizer
    for (const std::string optimizer : {"adamw", "muon"}) {
        CAPTURE(optimizer);
        RunResult r = run_train_gpt(dir, kTiny + " --steps 3 --optimizer " + optimizer + " --json " + json + " --chart " +
                                             (dir / "c.svg"));
        CAPTURE(r.out);
        CAPTURE(r.err);
        REQUIRE(r.code == 0);
        const std::string state_line = line_of(r.out, "optimizer state:");
        CAPTURE(state_line);
        CHECK(state_line.find("= measured") != std::string::npos);
        const std::string keeps = line_of(r.out, "Muon keeps");
        CAPTURE(keeps);
        if (optimizer == "muon") CHECK(keeps.find(": 0.50 of AdamW's") != std::string::npos);
        else CHECK(keeps.empty());
        const nlohmann::json j = nlohmann::json::parse(slurp(json));
        REQUIRE(j["runs"].size() == 1);
        const nlohmann::json& run = j["runs"][0];
        CHECK(run["losses"].size() == 3);
        for (const nlohmann::json& loss : run["losses"]) CHECK(std::isfinite(loss.get<double>()));
        const nlohmann::json& s = run["optimizer_state"];
        CAPTURE(s.dump());
        CHECK(s["adamw_moment_bytes"] == s["predicted_adamw_moment_bytes"]);
        CHECK(s["muon_momentum_bytes"] == s["predicted_muon_momentum_bytes"]);
        CHECK(s["adamw_moment_bytes"].get<int64_t>() > 0);  // the embeddings, lm_head and vectors under muon
        if (optimizer == "muon") CHECK(s["muon_momentum_bytes"].get<int64_t>() > 0);
        else CHECK(s["muon_momentum_bytes"].get<int64_t>() == 0);
        state[optimizer] = s;
    }
    // The matrices' two moments under adamw are twice their one buffer under muon; the masters
    // (bf16 on a GPU) are the same.
    const int64_t moved = state["adamw"]["adamw_moment_bytes"].get<int64_t>() -
                          state["muon"]["adamw_moment_bytes"].get<int64_t>();
    CHECK(moved == 2 * state["muon"]["muon_momentum_bytes"].get<int64_t>());
    CHECK(state["adamw"]["master_bytes"] == state["muon"]["master_bytes"]);
}

TEST_CASE("train_gpt: --recompute-activation off saves gelu(h), and the report measures no saving for it") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    std::string json = dir / "run.json";
    const std::string tiny = "--steps 2 --batch 2 --seq 8 --layers 2 --heads 2 --embd 16 --policy input --json " + json;
    RunResult on = run_train_gpt(dir, tiny);
    REQUIRE(on.code == 0);
    int64_t saved_on = nlohmann::json::parse(slurp(json))["runs"][0]["saved_activation_bytes"].get<int64_t>();
    RunResult off = run_train_gpt(dir, tiny + " --recompute-activation off");
    CAPTURE(off.err);
    REQUIRE(off.code == 0);
    CHECK(off.out.find("activation recompute") == std::string::npos);
    nlohmann::json j = nlohmann::json::parse(slurp(json));
    CHECK(j["predicted_recompute_saving_bytes"].get<int64_t>() == 0);
    CHECK(j["runs"][0]["recompute_saving_bytes"].get<int64_t>() == 0);
    const int64_t element = j["config"]["dtype"] == "bf16" ? 2 : 4;  // bf16 by default on a GPU
    CHECK(j["runs"][0]["saved_activation_bytes"].get<int64_t>() - saved_on == 2 * 4 * 2 * 8 * 16 * element);
}

TEST_CASE("train_gpt: the held-out tail is scored every --eval-every steps, and --save-best keeps the best") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    std::string json = dir / "run.json", ck = dir / "best.safetensors";
    RunResult r = run_train_gpt(dir, "--steps 6 --batch 2 --seq 16 --layers 1 --heads 2 --embd 16 --policy input "
                                     "--device cpu --eval-every 2 --eval-batches 3 --save-best --save " + ck +
                                         " --json " + json + " --chart " + (dir / "c.svg"));
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("| val loss ") != std::string::npos);
    CHECK(r.out.find("validation: best loss") != std::string::npos);
    nlohmann::json run = nlohmann::json::parse(slurp(json))["runs"][0];
    CHECK(run["val_steps"] == nlohmann::json({2, 4, 6}));
    std::vector<double> losses = run["val_losses"].get<std::vector<double>>();
    REQUIRE(losses.size() == 3);
    size_t best = std::min_element(losses.begin(), losses.end()) - losses.begin();
    CHECK(run["best_val_loss"].get<double>() == losses[best]);
    CHECK(run["best_val_step"].get<int64_t>() == 2 * static_cast<int64_t>(best + 1));
    // The checkpoint is the best step's, and carries its loss for a resumed run to beat.
    std::map<std::string, std::string> metadata;
    normtape::load_safetensors(ck, &metadata);
    CHECK(metadata.at("train_gpt.step") == std::to_string(2 * (best + 1)));
    CHECK(metadata.at("train_gpt.best_val").find(" at step " + std::to_string(2 * (best + 1))) != std::string::npos);
    // --val-fraction 0: nothing held out, nothing evaluated.
    RunResult none = run_train_gpt(dir, "--steps 2 --batch 2 --seq 16 --layers 1 --heads 2 --embd 16 --policy input "
                                        "--device cpu --val-fraction 0 --json " + json + " --chart " + (dir / "c.svg"));
    REQUIRE(none.code == 0);
    CHECK(none.out.find("val loss") == std::string::npos);
    CHECK(nlohmann::json::parse(slurp(json))["runs"][0]["val_losses"].empty());
}

TEST_CASE("train_gpt: --threads 1 and 2 train bit for bit alike, with dropout, and --sample prints what it draws") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    const std::string flags = "--steps 4 --batch 2 --seq 16 --layers 1 --heads 2 --embd 16 --policy input --device cpu "
                              "--dropout 0.1 --sample 40 --chart " + (dir / "c.svg");
    RunResult one = run_train_gpt(dir, flags + " --threads 1 --json " + (dir / "one.json"));
    RunResult two = run_train_gpt(dir, flags + " --threads 2 --json " + (dir / "two.json"));
    CAPTURE(one.err);
    CAPTURE(two.err);
    REQUIRE(one.code == 0);
    REQUIRE(two.code == 0);
    CHECK(one.out.find("cpu (1 threads)") != std::string::npos);
    CHECK(two.out.find("cpu (2 threads)") != std::string::npos);
    nlohmann::json a = nlohmann::json::parse(slurp(dir / "one.json")), b = nlohmann::json::parse(slurp(dir / "two.json"));
    CHECK(a["runs"][0]["losses"] == b["runs"][0]["losses"]);  // bit for bit: JSON keeps every double's digits
    CHECK(a["runs"][0]["val_losses"] == b["runs"][0]["val_losses"]);
    // The sample: its header line, then 40 bytes drawn by the seed, the same in both runs.
    const std::string header = "a sample of 40 bytes (temperature 0.8, top-k 200):\n";
    const size_t at = one.out.find(header);
    REQUIRE(at != std::string::npos);
    const std::string sample = one.out.substr(at + header.size(), 40);
    CHECK(sample.size() == 40);
    CHECK(two.out.find(header + sample) != std::string::npos);
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
    // the flag the run stops at the first NaN loss; with it, at the first non-finite value any op
    // makes, saying which op made it, and when.
    const std::string diverging = tiny + " --steps 30 --lr 1e4";
    RunResult plain = run_train_gpt(dir, diverging);
    CAPTURE(plain.err);
    CHECK(plain.code == 1);
    CHECK(plain.err.find("--detect-anomaly names the first op") != std::string::npos);
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
    for (const char* name : {"add", "mul", "scale", "gelu", "sum", "mean", "matmul", "linear", "linear_gelu",
                             "causal_self_attention", "embedding", "cross_entropy", "layer_norm", "rms_norm"})
        known = known || op == name;
    CHECK(known);
    CHECK(r.out.find("nan") == std::string::npos);  // it stopped before printing a NaN loss
}

TEST_CASE("train_gpt: one policy still draws its chart, and every line reaches the log as it is printed") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    RunResult r = run_train_gpt(dir, kTiny + " --steps 2 --chart " + (dir / "one.svg"));
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    std::string svg = slurp(dir / "one.svg");
    CHECK(svg.find("<svg") == 0);
    CHECK(svg.find("save input") != std::string::npos);
    // A run writing to a file whose first step takes seconds: its header lines are there before the
    // first step ends (a run killed early leaves a log that says what it was).
    std::string out = dir / "long.out";
    pid_t pid = start_train_gpt(dir,
                                "--data random --device cpu --policy input --batch 16 --seq 512 --layers 2 --heads 2 "
                                "--embd 256 --steps 1000",
                                out);
    std::string log;
    for (int i = 0; i < 300 && log.find("data: random tokens") == std::string::npos; ++i) {  // up to 30 s
        usleep(100 * 1000);
        log = slurp(out);
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    CAPTURE(log);
    CHECK(log.find("train_gpt: layer norm") != std::string::npos);
    CHECK(log.find("data: random tokens") != std::string::npos);
    CHECK(log.find("step ") == std::string::npos);  // seen before the first step's line flushed it
}

TEST_CASE("train_gpt: --memory-report prints the saved bytes by category, which add up to the saved bytes and the JSON's") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli");
    const std::string json = dir / "run.json", chart = dir / "c.svg";
    RunResult r =
        run_train_gpt(dir, kTiny + " --device cpu --steps 1 --memory-report --json " + json + " --chart " + chart);
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.out.find("[input ] saved for backward after the first forward: ") != std::string::npos);
    CHECK(r.out.find("CrossEntropyBackward#") != std::string::npos);  // the largest storage: the logits
    // The category lines: "  <bytes> <share>%  <name>", then the total.
    const std::string header = "[input ] saved bytes by category:\n";
    const size_t at = r.out.find(header);
    REQUIRE(at != std::string::npos);
    std::istringstream lines_after(r.out.substr(at + header.size()));
    std::map<std::string, int64_t> printed;
    int64_t sum = 0, total = -1;
    for (std::string line; std::getline(lines_after, line) && total < 0;) {
        std::istringstream fields(line);
        std::string bytes, share;
        fields >> bytes >> share;
        std::string name;
        std::getline(fields >> std::ws, name);
        if (name == "total (saved_bytes())") total = without_commas(bytes);
        else sum += printed[name] = without_commas(bytes);
    }
    for (const char* name : kCategories) CHECK_MESSAGE(printed.count(name) == 1, name);
    CHECK(printed.size() == std::size(kCategories));
    const nlohmann::json run = nlohmann::json::parse(slurp(json))["runs"][0];
    const int64_t saved = run["saved_activation_bytes"].get<int64_t>();
    CHECK(total == saved);
    CHECK(sum == saved);
    CHECK(run["saved_bytes_on_device"].get<int64_t>() == saved);  // the cpu holds everything
    // The step's peak, named by the memory trace's labels: a phase and a module.
    const std::string peak = run["step_peak"].get<std::string>();
    CHECK((peak.find(" in forward, ") != std::string::npos || peak.find(" in backward, ") != std::string::npos));
    // Every part of the model saves something; nothing is checkpointed or unaccounted for.
    for (const char* name : {"norms", "attention", "MLP", "embeddings", "logits and loss"}) CHECK(printed[name] > 0);
    CHECK(printed["checkpointed block inputs"] == 0);
    CHECK(printed["other"] == 0);
    // The JSON: the same categories, and the whole report, whose total is the saved bytes.
    int64_t json_sum = 0;
    for (const char* name : kCategories) {
        CAPTURE(name);
        CHECK(run["saved_bytes_by_category"][name].get<int64_t>() == printed[name]);
        json_sum += run["saved_bytes_by_category"][name].get<int64_t>();
    }
    CHECK(json_sum == saved);
    CHECK(run["saved_tensors_report"]["total_bytes"].get<int64_t>() == saved);
    CHECK(run["saved_tensors_report"]["entries"].size() > 10);
    CHECK(slurp(chart).find("Saved for backward after the first forward") != std::string::npos);
    // Without the flag nothing is printed, and the JSON and the chart have the same.
    RunResult quiet = run_train_gpt(dir, kTiny + " --device cpu --steps 1 --json " + json + " --chart " + chart);
    REQUIRE(quiet.code == 0);
    CHECK(quiet.out.find("by category") == std::string::npos);
    CHECK(nlohmann::json::parse(slurp(json))["runs"][0]["saved_bytes_by_category"] == run["saved_bytes_by_category"]);
    CHECK(slurp(chart).find("checkpointed block inputs") != std::string::npos);
}

}  // TEST_SUITE
