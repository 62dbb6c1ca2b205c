// tests/test_cli_data.cpp: train_gpt on token files as llm.c and nanoGPT write them: shards written by
// a Python script here (the format's own writer, not normtape's) train, a glob of shards is read in
// name order, nanoGPT's raw uint16 ids train, and a file that is not what its format says, or ids
// past --vocab, are refused before training with exit 2.
#include <cmath>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace normtape::testing;

namespace {

const std::string kTiny = "--batch 2 --seq 8 --layers 1 --heads 2 --embd 16 --policy input --steps 3 --log-every 1";

// Writes, with Python (struct, as llm.c's dev/data/data_common.py lays a file out), the first
// 6,000 bytes of tinyshakespeare as ids byte + 256 * (position % 2), in vocabulary 512: shard_0.bin
// and shard_1.bin (halves, llm.c's uint16 kind), all.bin (both halves in one llm.c file) and
// raw.bin (the same ids as nanoGPT's raw uint16, no header).
void write_shards(const TempDir& dir) {
    const std::string script = R"PY(
import struct, sys
out, text = sys.argv[1], open(sys.argv[2], "rb").read()[:6000]
ids = [b + 256 * (i % 2) for i, b in enumerate(text)]
def llmc(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(ids), *([0] * 253)))
        f.write(struct.pack("<%dH" % len(ids), *ids))
llmc(out + "/shard_0.bin", ids[:3000])
llmc(out + "/shard_1.bin", ids[3000:])
llmc(out + "/all.bin", ids)
with open(out + "/raw.bin", "wb") as f:
    f.write(struct.pack("<%dH" % len(ids), *ids))
)PY";
    write_bytes(dir / "write_shards.py", script);
    const std::string cmd = python() + " " + (dir / "write_shards.py") + " " + dir.path.string() + " " +
                            NORMTAPE_SOURCE_DIR "/data/tinyshakespeare.txt";
    REQUIRE(std::system(cmd.c_str()) == 0);
}

std::vector<double> losses(const std::string& json_path) {
    return nlohmann::json::parse(slurp(json_path))["runs"][0]["losses"].get<std::vector<double>>();
}

}  // namespace

TEST_SUITE("train_gpt") {

TEST_CASE("train_gpt: llm.c's shards written by a script train, a glob of them reads them in name order, and nanoGPT's raw ids train") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli_data");
    write_shards(dir);
    RunResult one = run_train_gpt(dir, kTiny + " --vocab 512 --data " + (dir / "all.bin") + " --json all.json");
    CAPTURE(one.err);
    REQUIRE(one.code == 0);
    CHECK(one.out.find("all.bin (llm.c token file), 6,000 tokens in 13,024 bytes") != std::string::npos);
    // The glob's two shards, in name order, are all.bin's ids: the same batches, the same losses.
    RunResult glob = run_train_gpt(dir, kTiny + " --vocab 512 --data '" + (dir / "shard_*.bin") + "' --json glob.json");
    CAPTURE(glob.err);
    REQUIRE(glob.code == 0);
    CHECK(glob.out.find("2 files of") != std::string::npos);
    CHECK(glob.out.find("(llm.c token files), 6,000 tokens in 14,048 bytes") != std::string::npos);
    CHECK(losses(dir / "glob.json") == losses(dir / "all.json"));
    RunResult raw = run_train_gpt(dir, kTiny + " --vocab 512 --data " + (dir / "raw.bin") + " --json raw.json");
    CAPTURE(raw.err);
    REQUIRE(raw.code == 0);
    CHECK(raw.out.find("raw.bin (raw token file), 6,000 tokens in 12,000 bytes") != std::string::npos);
    CHECK(losses(dir / "raw.json") == losses(dir / "all.json"));
    // The ids are not bytes: the first step's loss is about ln 512, not ln 256.
    CHECK(losses(dir / "all.json")[0] == doctest::Approx(std::log(512.0)).epsilon(0.05));
}

TEST_CASE("train_gpt: a token file that is not what its format says, or ids past --vocab, are refused before training (exit 2)") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli_data_bad");
    write_shards(dir);
    const std::string all = slurp(dir / "all.bin");
    auto with_int = [&](size_t at, uint32_t v) {
        std::string b = all;
        for (int i = 0; i < 4; ++i, v >>= 8) b[at + i] = static_cast<char>(v & 0xff);
        return b;
    };
    write_bytes(dir / "version.bin", with_int(4, 2));
    write_bytes(dir / "count.bin", with_int(8, 7000));
    write_bytes(dir / "truncated.bin", all.substr(0, all.size() - 100));
    write_bytes(dir / "magic.bin", with_int(0, 20240521));
    write_bytes(dir / "odd.bin", slurp(dir / "raw.bin").substr(0, 1001));
    struct Case {
        std::string args, says;
    };
    for (const Case& c : {
             Case{"--vocab 512 --data " + (dir / "version.bin"), "expected version 1 after magic number 20240520, got 2"},
             Case{"--vocab 512 --data " + (dir / "count.bin"), "the header says 7000 ids of 2 bytes"},
             Case{"--vocab 512 --data " + (dir / "truncated.bin"), "a wrong count or a truncated file"},
             Case{"--vocab 512 --data-format llm.c --data " + (dir / "magic.bin"), "got 20240521"},
             Case{"--vocab 512 --data " + (dir / "odd.bin"), "expected raw uint16 ids (an even number of bytes"},
             Case{"--vocab 300 --data " + (dir / "all.bin"), "token 361 at position 1 is not below --vocab 300"},
             Case{"--vocab 512 --data '" + (dir / "nothing_*.bin") + "'", "the pattern matches no file"},
             Case{"--vocab 512 --sample 10 --data " + (dir / "all.bin"), "--sample prints text: a token file's ids have no tokenizer"},
             Case{"--data random --data-format raw", "--data-format raw reads a file: --data random has none"},
             Case{"--data-format bytes", "--data-format \"bytes\": expected auto or text or llm.c or raw"},
             Case{"--vocab 512 --data-format text --data " + (dir / "all.bin"), "--vocab 512 needs --data random, a token file or --tokenizer"},
         }) {
        CAPTURE(c.args);
        check_refused(run_train_gpt(dir, kTiny + " " + c.args), {c.says});
    }
}

TEST_CASE("train_gpt: --tokenizer encodes a text before training, once, and the held-out loss is reported in bits per byte") {
    REQUIRE_TRAIN_GPT_OR_SKIP();
    TempDir dir("cli_tokenizer");
    const std::string text = slurp(shakespeare_path());
    std::filesystem::create_directories(dir / "texts");
    write_bytes(dir / "texts/input.txt", text);  // the encoded text is cached beside it
    // A tokenizer of 512 ids trained on 200,000 bytes from `at`, saved as train_tokenizer saves one.
    auto save = [&](const std::string& name, size_t at) {
        normtape::Tokenizer tok = normtape::train_bpe(std::string_view(text).substr(at, 200000), 512);
        tok.save_tiktoken_file(dir / (name + ".tiktoken"));
        write_bytes(dir / (name + ".json"), nlohmann::json({{"pat_str", tok.pattern()}}).dump());
        return tok;
    };
    const normtape::Tokenizer tok = save("small", 0);
    save("other", 400000);  // the same size, other merges
    std::filesystem::copy_file(dir / "small.tiktoken", dir / "huge.tiktoken");
    write_bytes(dir / "huge.json", nlohmann::json({{"pat_str", tok.pattern()}, {"special_tokens", {{"<big>", 20000000}}}}).dump());
    // A glob: the cache beside the text, hidden, is not one of the files it matches.
    const std::string run = kTiny + " --data 'texts/*' --eval-every 3 --eval-batches 2";
    RunResult r = run_train_gpt(dir, run + " --tokenizer " + (dir / "small.tiktoken") + " --json tok.json --save ck.safetensors --stop-at 2 --chart c.svg");
    CAPTURE(r.err);
    REQUIRE(r.code == 0);
    CHECK(slurp(dir / "c.svg").find("bits per byte") != std::string::npos);
    // The ids, cached beside the text as an llm.c token file, and read from there by the next run.
    std::vector<std::string> caches;
    for (const auto& e : std::filesystem::directory_iterator(dir / "texts"))
        if (e.path().filename().string().starts_with(".input.txt.small.")) caches.push_back(e.path().string());
    REQUIRE(caches.size() == 1);
    const std::string cache_name = std::filesystem::path(caches[0]).filename().string();  // --data is relative
    CHECK(r.out.find("(cached in texts/" + cache_name + ")") != std::string::npos);
    CHECK(normtape::read_token_file(caches[0]) == tok.encode_ordinary(text));
    RunResult again = run_train_gpt(dir, run + " --tokenizer " + (dir / "small.tiktoken") + " --json again.json --stop-at 2");
    CHECK(again.out.find("(read from the cache texts/" + cache_name + ")") != std::string::npos);
    CHECK(nlohmann::json::parse(slurp(dir / "again.json"))["runs"][0]["val_losses"] ==
          nlohmann::json::parse(slurp(dir / "tok.json"))["runs"][0]["val_losses"]);
    write_bytes(caches[0], slurp(caches[0]).substr(0, 2000));  // truncated: encoded again, with a warning
    RunResult truncated = run_train_gpt(dir, run + " --tokenizer " + (dir / "small.tiktoken") + " --stop-at 1");
    CHECK(truncated.code == 0);
    CHECK(truncated.err.find("is unreadable, encoding again") != std::string::npos);
    CHECK(normtape::read_token_file(caches[0]) == tok.encode_ordinary(text));
    std::vector<uint32_t> foreign = tok.encode_ordinary(text);
    foreign[5] = 600;  // no token of small: encoded again, with a warning
    normtape::write_token_file(caches[0], foreign);
    RunResult past = run_train_gpt(dir, run + " --tokenizer " + (dir / "small.tiktoken") + " --stop-at 1");
    CHECK(past.err.find("id 600 at position 5 is no ordinary token of small") != std::string::npos);
    CHECK(normtape::read_token_file(caches[0]) == tok.encode_ordinary(text));
    CHECK(r.out.find("V=512") != std::string::npos);  // --vocab: the tokenizer's
    const size_t n = tok.encode_ordinary(text).size();
    const std::string digits = std::to_string(n);
    std::string count;  // with commas, as train_gpt prints it
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) count += ',';
        count += digits[i];
    }
    CHECK(r.out.find("encoded by small, " + count + " tokens in 1,115,394 bytes") != std::string::npos);
    // The same tokenizer as a tokenizer.json: the same ids.
    tok.save_tokenizer_json(dir / "small.tokenizer.json");
    RunResult json = run_train_gpt(dir, run + " --tokenizer " + (dir / "small.tokenizer.json") + " --sample 20");
    CHECK(json.code == 0);
    CHECK(json.out.find("encoded by small, " + count + " tokens") != std::string::npos);
    const std::string header = "a sample of 20 tokens (temperature 0.8, top-k 200):\n";
    const size_t sample = json.out.find(header), after = json.out.find("\n[input ]", sample);
    REQUIRE(after != std::string::npos);
    CHECK(after - (sample + header.size()) >= 20);  // every id is a token of at least a byte
    CHECK(r.out.find("bits per byte") != std::string::npos);
    const nlohmann::json tokenized = nlohmann::json::parse(slurp(dir / "tok.json"))["runs"][0];
    // The held-out tail's bytes per token: its ids' bytes over its ids.
    const std::vector<uint32_t> ids = tok.encode_ordinary(text);
    const std::vector<uint32_t> val(ids.end() - static_cast<std::ptrdiff_t>(ids.size() / 10), ids.end());
    const double bytes_per_token = static_cast<double>(tok.decode(val).size()) / static_cast<double>(val.size());
    CHECK(tokenized["val_bytes_per_token"].get<double>() == doctest::Approx(bytes_per_token));
    CHECK(tokenized["val_bpb"][0].get<double>() ==
          doctest::Approx(tokenized["val_losses"][0].get<double>() / (std::log(2.0) * bytes_per_token)));
    // Bytes as tokens: one byte a token.
    REQUIRE(run_train_gpt(dir, run + " --json bytes.json").code == 0);
    const nlohmann::json bytes = nlohmann::json::parse(slurp(dir / "bytes.json"))["runs"][0];
    CHECK(bytes["val_bpb"][0].get<double>() == doctest::Approx(bytes["val_losses"][0].get<double>() / std::log(2.0)));
    // generate decodes with the checkpoint's tokenizer, and refuses another.
    if (!std::string(NORMTAPE_GENERATE).empty()) {
        const std::string gen = "ck.safetensors --prompt 'ROMEO:' --tokens 10 --device cpu --temperature 0";
        RunResult g = run_generate(dir, gen);
        CAPTURE(g.err);
        CHECK(g.code == 0);
        CHECK(!g.out.empty());
        CHECK(run_generate(dir, gen + " --tokenizer " + (dir / "small.tiktoken")).out == g.out);
        RunResult other = run_generate(dir, gen + " --tokenizer " + (dir / "other.tiktoken"));
        CHECK(other.code == 2);
        CHECK(other.err.find("not the tokenizer the model was trained with") != std::string::npos);
        std::filesystem::rename(dir / "small.tiktoken", dir / "moved.tiktoken");
        std::filesystem::rename(dir / "small.json", dir / "moved.json");
        RunResult moved = run_generate(dir, gen);
        CHECK(moved.code == 2);
        CHECK(moved.err.find("give --tokenizer FILE if it has moved") != std::string::npos);
        CHECK(run_generate(dir, gen + " --tokenizer " + (dir / "moved.tiktoken")).out == g.out);
        std::filesystem::rename(dir / "moved.tiktoken", dir / "small.tiktoken");
        std::filesystem::rename(dir / "moved.json", dir / "small.json");
    }
    for (const auto& [args, says] : std::initializer_list<std::pair<std::string, std::string>>{
             {"--data random --tokenizer " + (dir / "small.tiktoken"), "--tokenizer encodes a text --data: --data random"},
             {"--data " + (dir / "small.tiktoken") + ".bin --tokenizer " + (dir / "small.tiktoken"),
              "a token file holds ids already"},
             {"--data " + shell_quote(shakespeare_path()) + " --vocab 300 --tokenizer " + (dir / "small.tiktoken"),
              "--vocab 300 is smaller than --tokenizer"},
             {"--data " + shell_quote(shakespeare_path()) + " --tokenizer " + (dir / "missing.tiktoken"), "cannot read"},
             {"--data " + shell_quote(shakespeare_path()) + " --tokenizer " + (dir / "huge.tiktoken"),
              "has 20000001 ids, more than a model's vocabulary may have (2^24)"},
             {"--data " + shell_quote(shakespeare_path()) + " --tokenizer " + (dir / "small.tiktoken") + " --json " +
                  (dir / "small.json"),
              "is a file the run reads (--tokenizer " + (dir / "small.tiktoken") + " (" + (dir / "small.json") + "))"},
             {"--resume ck.safetensors --tokenizer " + (dir / "other.tiktoken"),
              "is not the checkpoint's run's"},
         }) {
        CAPTURE(args);
        check_refused(run_train_gpt(dir, args), {says});
    }
}

}  // TEST_SUITE
