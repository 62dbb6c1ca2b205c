// tests/test_generate.cpp: sampling with a key/value cache. causal_self_attention_rows
// (ops/attention.h) against the rows of causal_self_attention, on the cpu and on CUDA, and its
// errors; the cached forward (nn/model/generate.h) against GPT::forward; generate with and without the
// cache, its seeds, top_k and errors; the generate binary on a checkpoint that train_gpt wrote.
#include <algorithm>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// The rows first_row .. T-1 of `out` [B, T, C], as a contiguous [B, T - first_row, C].
Tensor rows_of(const Tensor& out, int64_t first_row) {
    return out.narrow(1, first_row, out.size(1) - first_row).contiguous();
}

// A small GPT of architecture `arch` (gpt_config): V = 37, block_size 12, two layers, C = 16,
// NH = 2 (the others with one key/value head, and their projections drawn, not zero).
GPTConfig small_config(DType dtype, NormKind norm = NormKind::Layer, const std::string& arch = "gpt2") {
    GPTConfig c = gpt_config(arch);
    if (arch != "gpt2") c.n_kv_head = 1, c.zero_init_proj = false;
    c.vocab_size = 37;
    c.block_size = 12;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.norm = norm;
    c.dtype = dtype;
    return c;
}

// Its parameters scaled by `factor`, so that the logits are far from uniform (at initialization
// they are within about 0.01 of each other) and sampling depends on the model.
void scale_parameters(GPT& model, double factor) {
    NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) p.mul_(factor);
}

// `n` token ids in [0, V), drawn from the global generator.
std::vector<int64_t> random_tokens(int64_t n, int64_t V) {
    std::vector<int64_t> t;
    for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int64_t>(rand_scalar() * static_cast<double>(V)) % V);
    return t;
}

Tensor id_tensor(const std::vector<int64_t>& tokens, int64_t B = 1) {
    std::vector<int64_t> all;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t t : tokens) all.push_back(t);
    return ids(all, {B, static_cast<int64_t>(tokens.size())});
}

SamplingOptions sampling(double temperature, int64_t top_k, uint64_t seed, bool use_cache) {
    SamplingOptions o;
    o.temperature = temperature;
    o.top_k = top_k;
    o.seed = seed;
    o.use_cache = use_cache;
    return o;
}

// Writes the checkpoint `from` to `to` with its config's `key` set to `value` (checksums rewritten).
void set_config(const std::string& from, const std::string& to, const char* key, const nlohmann::json& value) {
    std::map<std::string, std::string> meta;
    NamedTensors tensors = load_safetensors(from, &meta);
    nlohmann::json config = nlohmann::json::parse(meta.at("train_gpt.config"));
    config[key] = value;
    meta["train_gpt.config"] = config.dump();
    save_safetensors(to, tensors, meta);
}

// Writes the safetensors file `from` to `to` without its checksum entries, as another writer would.
void strip_checksums(const std::string& from, const std::string& to) {
    const std::string bytes = slurp(from);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
    nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
    nlohmann::json& meta = header["__metadata__"];
    for (auto it = meta.begin(); it != meta.end();)
        it = it.key().rfind("normtape.checksum.", 0) == 0 ? meta.erase(it) : std::next(it);
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    write_bytes(to, st_file(text, bytes.substr(8 + n)));
}

}  // namespace

TEST_SUITE("causal_self_attention_rows") {
    TEST_CASE("causal_self_attention_rows: equals the rows of causal_self_attention bit for bit on the cpu") {
        manual_seed(91);
        NoGradGuard no_grad;
        const int64_t B = 2, T = 9, C = 16;
        for (DType dt : {DType::F64, DType::F32, DType::BF16}) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor qkv = input({B, T, 3 * C}, dt);
            for (int64_t nh : {1, 4}) {
                Tensor full = causal_self_attention(qkv, nh);
                for (int64_t first_row : {int64_t(0), int64_t(1), int64_t(4), T - 1}) {
                    INFO("n_head = ", nh, ", first_row = ", first_row);
                    Tensor rows = causal_self_attention_rows(qkv, nh, first_row);
                    CHECK(rows.shape() == Shape{B, T - first_row, C});
                    CHECK(rows.dtype() == dt);
                    CHECK_CLOSE(rows, rows_of(full, first_row), (Tolerance{0.0, 0.0}));
                }
            }
        }
    }

    TEST_CASE("causal_self_attention_rows: a non-contiguous qkv (a cache's first rows) gives the same rows") {
        manual_seed(92);
        NoGradGuard no_grad;
        const int64_t B = 3, T = 7, C = 8;
        Tensor cache = input({B, 12, 3 * C}, DType::F64);
        Tensor view = cache.narrow(1, 0, T);
        CHECK_CLOSE(causal_self_attention_rows(view, 2, 5), rows_of(causal_self_attention(view.contiguous(), 2), 5),
                    (Tolerance{0.0, 0.0}));
    }

    TEST_CASE("causal_self_attention_rows: on cuda equals the cpu, every dtype, head sizes 8, 64 and 128") {
        REQUIRE_CUDA_OR_SKIP();
        manual_seed(93);
        NoGradGuard no_grad;
        for (DType dt : {DType::F64, DType::F32, DType::BF16})
            for (int64_t hs : {8, 64, 128})
                for (int64_t T : {1, 37, 70}) {
                    const int64_t nh = 2, B = 2, C = nh * hs;
                    Tensor qkv = input({B, T, 3 * C}, dt, 2.0);
                    Tensor full = causal_self_attention(qkv, nh);
                    for (int64_t first_row : {int64_t(0), T / 2, T - 1}) {
                        INFO("dtype ", std::string(dtype_name(dt)), ", hs = ", hs, ", T = ", T, ", first_row = ",
                             first_row);
                        Tensor gpu = causal_self_attention_rows(qkv.to(Device::CUDA), nh, first_row);
                        REQUIRE(gpu.device() == Device::CUDA);
                        CHECK_NORMWISE(gpu, rows_of(full, first_row), normwise_tolerance(dt));
                    }
                }
    }

    TEST_CASE("causal_self_attention_rows: bad input") {
        NoGradGuard no_grad;
        Tensor ok = zeros({2, 5, 24}), i = zeros({2, 5, 24}, opts(DType::I64)), empty = zeros({2, 0, 24});
        int64_t before = cpu_allocated();
        const char* op = "causal_self_attention_rows";
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(Tensor(), 2, 0), Error, op, "undefined");
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(empty, 2, 0), ShapeError, op, "[2, 0, 24]");
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(i, 2, 0), DTypeError, op, "i64");
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(zeros({5, 24}), 2, 0), ShapeError, op, "[5, 24]");
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(zeros({2, 5, 25}), 1, 0), ShapeError, op, "[2, 5, 25]");
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(ok, 3, 0), ShapeError, op, "n_head = 3");
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(ok, 0, 0), Error, op, "n_head >= 1", "got 0");
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(ok, 2, -1), Error, op, "first_row in [0, T = 5)", "got -1");
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(ok, 2, 5), Error, op, "first_row in [0, T = 5)", "got 5");
        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("causal_self_attention_rows: refuses a qkv that requires grad in grad mode, runs under NoGradGuard") {
        Tensor qkv = leaf({1, 4, 24});
        CHECK_THROWS_KIND_WITH(causal_self_attention_rows(qkv, 2, 1), Error, "causal_self_attention_rows",
                               "inference only", "NoGradGuard");
        NoGradGuard no_grad;
        Tensor out = causal_self_attention_rows(qkv, 2, 1);
        CHECK(!out.requires_grad());
        CHECK(out.grad_fn() == nullptr);
    }
}

TEST_SUITE("generate") {
    TEST_CASE("generate: forward_cached: logits equal GPT::forward's, token by token and after a multi-token prefill") {
        for (DType dt : {DType::F64, DType::F32})
            for (auto [arch, norm] : {std::pair<const char*, NormKind>{"gpt2", NormKind::Layer}, {"gpt2", NormKind::RMS},
                                      {"nanochat", NormKind::RMS}, {"llama", NormKind::RMS}}) {
                INFO("dtype ", std::string(dtype_name(dt)), ", arch ", std::string(arch), ", norm ",
                     std::string(norm == NormKind::Layer ? "layer" : "rms"));
                manual_seed(101);
                GPT model(small_config(dt, norm, arch));
                // Logits of order 1: the two computations differ by summation order alone (products
                // of one row, against those of T rows), a few ulp of f32 (2e-7 seen).
                scale_parameters(model, 2.0);
                const Tolerance tol = dt == DType::F64 ? Tolerance{1e-12, 1e-12} : tolerance(DType::F32);
                for (int64_t B : {1, 3}) {
                    INFO("B = ", B);
                    const int64_t T = model.config().block_size;
                    Tensor idx = ids(random_tokens(B * T, 37), {B, T});
                    NoGradGuard no_grad;
                    Tensor full = model.forward(idx);
                    KVCache one_by_one(model, B);
                    for (int64_t t = 0; t < T; ++t) {
                        INFO("position ", t);
                        Tensor logits = forward_cached(model, one_by_one, idx.narrow(1, t, 1).contiguous());
                        CHECK(logits.shape() == Shape{B, 1, 37});
                        CHECK(one_by_one.length() == t + 1);
                        CHECK_CLOSE(logits, full.narrow(1, t, 1).contiguous(), tol);
                    }
                    KVCache chunks(model, B);
                    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 5}, {5, 6}, {6, T}}) {
                        INFO("positions ", begin, " .. ", end - 1);
                        Tensor logits = forward_cached(model, chunks, idx.narrow(1, begin, end - begin).contiguous());
                        CHECK_CLOSE(logits, full.narrow(1, begin, end - begin).contiguous(), tol);
                    }
                    CHECK(chunks.length() == T);
                    chunks.clear();
                    CHECK_CLOSE(forward_cached(model, chunks, idx), full, tol);  // a prefill of the whole block
                }
            }
    }

    TEST_CASE("generate: on cuda, the cached forward equals GPT::forward, and both modes give the same tokens") {
        REQUIRE_CUDA_OR_SKIP();
        for (DType dt : {DType::F64, DType::F32, DType::BF16})
            for (const char* arch : {"gpt2", "nanochat", "llama"}) {
                INFO("dtype ", std::string(dtype_name(dt)), ", arch ", std::string(arch));
                manual_seed(108);
                GPTConfig c = small_config(dt, arch == std::string("gpt2") ? NormKind::Layer : NormKind::RMS, arch);
                c.device = Device::CUDA;
                GPT model(c);
                scale_parameters(model, 20.0);
                const int64_t B = 2, T = c.block_size;
                Tensor idx = ids(random_tokens(B * T, 37), {B, T}).to(Device::CUDA);
                NoGradGuard no_grad;
                Tensor full = model.forward(idx);
                KVCache cache(model, B);
                Tensor prefill = forward_cached(model, cache, idx.narrow(1, 0, 5).contiguous());
                REQUIRE(prefill.device() == Device::CUDA);
                // cuDNN's attention (GPT::forward in bf16) rounds the probabilities to bf16 before
                // their product with v, the cached rows' kernel does not: at weights scaled by 20,
                // through the layers, that is up to twice bf16's tolerance.
                const bool cudnn = dt == DType::BF16 && attention_backend() == AttentionBackend::Cudnn;
                const double tol = (cudnn ? 2 : 1) * normwise_tolerance(dt);
                CHECK_NORMWISE(prefill, full.narrow(1, 0, 5).contiguous(), tol);
                for (int64_t t = 5; t < T; ++t)
                    CHECK_NORMWISE(forward_cached(model, cache, idx.narrow(1, t, 1).contiguous()),
                                   full.narrow(1, t, 1).contiguous(), tol);
                if (dt != DType::F64) continue;
                const std::vector<int64_t> prompt{4, 5, 6};
                for (double temperature : {0.0, 1.0})
                    CHECK(generate(model, prompt, 30, sampling(temperature, 0, 3, true)) ==
                          generate(model, prompt, 30, sampling(temperature, 0, 3, false)));
            }
    }

    TEST_CASE("generate: with and without the cache, the same tokens (greedy and seeded), past block_size") {
        manual_seed(102);
        GPT model(small_config(DType::F64));
        scale_parameters(model, 20.0);
        // block_size 12: 40 new tokens restart the context several times; a prompt of 17 starts
        // from its last 12.
        for (int64_t prompt_length : {1, 5, 17})
            for (double temperature : {0.0, 1.0})
                for (int64_t top_k : {0, 5}) {
                    INFO("prompt of ", prompt_length, ", temperature ", temperature, ", top_k ", top_k);
                    std::vector<int64_t> prompt = random_tokens(prompt_length, 37);
                    std::vector<int64_t> cached = generate(model, prompt, 40, sampling(temperature, top_k, 7, true));
                    std::vector<int64_t> reference = generate(model, prompt, 40, sampling(temperature, top_k, 7, false));
                    CHECK(cached.size() == 40);
                    CHECK(cached == reference);
                }
    }

    TEST_CASE("generate: one seed gives one output, another seed another, and top_k = 1 is greedy") {
        manual_seed(103);
        GPT model(small_config(DType::F32));
        scale_parameters(model, 5.0);
        const std::vector<int64_t> prompt{3, 1, 4};
        std::vector<int64_t> a = generate(model, prompt, 30, sampling(1.0, 0, 11, true));
        CHECK(a == generate(model, prompt, 30, sampling(1.0, 0, 11, true)));
        CHECK(a != generate(model, prompt, 30, sampling(1.0, 0, 12, true)));
        std::vector<int64_t> greedy = generate(model, prompt, 30, sampling(0.0, 0, 11, true));
        CHECK(greedy == generate(model, prompt, 30, sampling(1.0, 1, 99, true)));
        CHECK(greedy == generate(model, prompt, 30, sampling(0.0, 0, 12, true)));  // greedy draws nothing
    }

    TEST_CASE("generate: top_k tokens only: each drawn token is among the k largest logits of its context") {
        manual_seed(104);
        GPT model(small_config(DType::F64));
        scale_parameters(model, 5.0);
        std::vector<int64_t> tokens{7};
        std::vector<int64_t> drawn = generate(model, tokens, 11, sampling(2.0, 3, 5, true));
        NoGradGuard no_grad;
        for (int64_t token : drawn) {
            Tensor logits = model.forward(id_tensor(tokens));
            std::vector<double> last = as_f64(logits.narrow(1, logits.size(1) - 1, 1));
            int64_t larger = std::count_if(last.begin(), last.end(), [&](double v) { return v > last[token]; });
            CHECK(larger < 3);
            tokens.push_back(token);
        }
    }

    TEST_CASE("generate: a prompt of one token, no new tokens, and on_token sees each token in order") {
        manual_seed(105);
        GPT model(small_config(DType::F32));
        CHECK(generate(model, {10}, 0, SamplingOptions()).empty());
        std::vector<int64_t> seen;
        std::vector<int64_t> out = generate(model, {10}, 15, SamplingOptions(), [&](int64_t t) { seen.push_back(t); });
        CHECK(out.size() == 15);
        CHECK(seen == out);
        for (int64_t t : out) CHECK((t >= 0 && t < 37));
    }

    TEST_CASE("generate: bad input: each names generate and what was found") {
        manual_seed(106);
        GPT model(small_config(DType::F32));
        const SamplingOptions ok;
        int64_t before = cpu_allocated();
        CHECK_THROWS_KIND_WITH(generate(model, {}, 5, ok), ShapeError, "generate", "empty");
        CHECK_THROWS_KIND_WITH(generate(model, {1, 37}, 5, ok), Error, "generate", "[0, V = 37)", "got 37 at position 1");
        CHECK_THROWS_KIND_WITH(generate(model, {-1}, 5, ok), Error, "generate", "got -1 at position 0");
        CHECK_THROWS_KIND_WITH(generate(model, {1}, -1, ok), Error, "generate", "max_new_tokens >= 0", "got -1");
        CHECK_THROWS_KIND_WITH(generate(model, {1}, 5, sampling(-0.5, 0, 1, true)), Error, "generate", "temperature",
                               "got -0.5");
        CHECK_THROWS_KIND_WITH(generate(model, {1}, 5, sampling(NAN, 0, 1, true)), Error, "generate", "temperature",
                               "nan");
        CHECK_THROWS_KIND_WITH(generate(model, {1}, 5, sampling(INFINITY, 0, 1, true)), Error, "generate",
                               "temperature", "inf");
        CHECK_THROWS_KIND_WITH(generate(model, {1}, 5, sampling(1.0, -2, 1, true)), Error, "generate", "top_k >= 0",
                               "got -2");
        CHECK(cpu_allocated() == before);
    }

    TEST_CASE("generate: forward_cached: bad input: each names forward_cached and what was found") {
        manual_seed(107);
        GPT model(small_config(DType::F32));
        KVCache cache(model, 1);
        CHECK_THROWS_KIND_WITH(forward_cached(model, cache, Tensor()), Error, "forward_cached", "undefined");
        CHECK_THROWS_KIND_WITH(forward_cached(model, cache, zeros({1, 2})), DTypeError, "forward_cached", "f32");
        CHECK_THROWS_KIND_WITH(forward_cached(model, cache, id_tensor({1, 2}).view({2})), ShapeError, "forward_cached",
                               "[2]");
        CHECK_THROWS_KIND_WITH(forward_cached(model, cache, id_tensor({1, 2}, 2)), ShapeError, "forward_cached",
                               "batch size 1", "[2, 2]");
        CHECK_THROWS_KIND_WITH(forward_cached(model, cache, id_tensor(std::vector<int64_t>(13, 1))), ShapeError,
                               "forward_cached", "1 to 12 new positions", "got 13");
        CHECK_THROWS_KIND_WITH(forward_cached(model, cache, id_tensor({40})), Error, "embedding");
        CHECK(cache.length() == 0);
        forward_cached(model, cache, id_tensor(std::vector<int64_t>(10, 1)));
        CHECK_THROWS_KIND_WITH(forward_cached(model, cache, id_tensor({1, 2, 3})), ShapeError, "forward_cached",
                               "1 to 2 new positions (the cache holds 10 of block_size = 12)", "got 3");
        GPTConfig other = small_config(DType::F32);
        other.n_layer = 3;
        GPT deeper(other);
        CHECK_THROWS_KIND_WITH(forward_cached(deeper, cache, id_tensor({1})), ShapeError, "forward_cached",
                               "a cache made for this model", "n_layer 2");
        GPT f64_model(small_config(DType::F64));
        CHECK_THROWS_KIND_WITH(forward_cached(f64_model, cache, id_tensor({1})), DTypeError, "forward_cached", "f64",
                               "f32");
        CHECK_THROWS_KIND_WITH(KVCache(model, 0), ShapeError, "KVCache", "batch_size >= 1", "got 0");
    }
}

TEST_SUITE("generate_cli") {
    TEST_CASE("generate_cli: samples a train_gpt checkpoint: one seed, one output, with or without the cache") {
        REQUIRE_TRAIN_GPT_OR_SKIP();
        if (std::string(NORMTAPE_GENERATE).empty()) SKIP_TEST("generate was not built");
        TempDir dir("generate_cli");
        const std::string ck = dir / "ck.safetensors";
        REQUIRE(run_train_gpt(dir, "--data random --steps 3 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 "
                                   "--policy input --device cpu --save " + ck).code == 0);
        const std::string args = ck + " --device cpu --prompt 'Hello' --tokens 40";
        RunResult a = run_generate(dir, args + " --seed 7");
        CAPTURE(a.err);
        REQUIRE(a.code == 0);
        CHECK(a.out.size() == 40);
        CHECK(a.err.empty());
        CHECK(run_generate(dir, args + " --seed 7").out == a.out);
        CHECK(run_generate(dir, args + " --seed 7 --no-cache").out == a.out);
        CHECK(run_generate(dir, args + " --seed 8").out != a.out);
        write_bytes(dir / "prompt.txt", "Hello");
        CHECK(run_generate(dir, ck + " --device cpu --prompt-file prompt.txt --tokens 40 --seed 7").out == a.out);
        RunResult greedy = run_generate(dir, args + " --temperature 0");
        CHECK(greedy.code == 0);
        CHECK(greedy.out == run_generate(dir, args + " --top-k 1 --seed 3").out);
        CHECK(run_generate(dir, ck + " --device cpu --prompt x --tokens 0").out.empty());
    }

    TEST_CASE("generate_cli: bad flags, prompts and checkpoints: one line naming the cause, exit code 2") {
        REQUIRE_TRAIN_GPT_OR_SKIP();
        if (std::string(NORMTAPE_GENERATE).empty()) SKIP_TEST("generate was not built");
        TempDir dir("generate_cli_errors");
        const std::string ck = dir / "ck.safetensors", big = dir / "big.safetensors";
        REQUIRE(run_train_gpt(dir, "--data random --steps 1 --batch 2 --seq 8 --layers 1 --heads 2 --embd 16 "
                                   "--policy input --device cpu --save " + ck).code == 0);
        REQUIRE(run_train_gpt(dir, "--data random --vocab 300 --steps 1 --batch 2 --seq 8 --layers 1 --heads 2 "
                                   "--embd 16 --policy input --device cpu --save " + big).code == 0);
        write_bytes(dir / "empty.txt", "");
        write_bytes(dir / "junk.safetensors", "not a safetensors file");
        save_safetensors(dir / "bare.safetensors", {{"x", zeros({2})}});
        struct Case {
            std::string args, says;
        };
        const std::string p = " --device cpu --prompt hi";
        for (const Case& c : {
                 Case{"", "checkpoint is required"},
                 Case{ck + " --device cpu", "--prompt TEXT or --prompt-file FILE"},
                 Case{ck + " --device cpu --prompt ''", "--prompt: expected at least one byte"},
                 Case{ck + " --device cpu --prompt-file empty.txt", "the file is empty"},
                 Case{ck + " --device cpu --prompt-file missing.txt", "--prompt-file missing.txt: cannot read"},
                 Case{ck + " --prompt a --prompt-file empty.txt", "excludes"},
                 Case{ck + p + " --tokens -1", "--tokens -1: expected an integer >= 0"},
                 Case{ck + p + " --tokens 1.5", "--tokens: expected an integer, got \"1.5\""},
                 Case{ck + p + " --temperature -1", "--temperature -1: expected a finite number >= 0"},
                 Case{ck + p + " --temperature nan", "--temperature nan: expected a finite number >= 0"},
                 Case{ck + p + " --top-k -3", "--top-k -3: expected an integer >= 0"},
                 Case{ck + p + " --seed -1", "--seed: expected an integer from 0 to 2^64 - 1"},
                 Case{ck + " --prompt hi --device tpu", "--device \"tpu\": expected cpu or cuda"},
                 Case{ck + p + " --bogus", "--bogus"},
                 Case{(dir / "missing.safetensors") + p, "missing.safetensors"},
                 Case{(dir / "junk.safetensors") + p, "junk.safetensors"},
                 Case{(dir / "bare.safetensors") + p, "not a train_gpt checkpoint"},
                 Case{big + p, "a vocabulary of 300 tokens"},
             }) {
            CAPTURE(c.args);
            RunResult r = run_generate(dir, c.args);
            CAPTURE(r.err);
            CHECK(r.code == 2);
            CHECK(lines(r.err) == 1);
            CHECK(r.err.find(c.says) != std::string::npos);
            CHECK(r.out.empty());
        }
    }

    TEST_CASE("generate_cli: a checkpoint's sizes are checked before the model is built (exit 2), an unverified file warned of") {
        REQUIRE_TRAIN_GPT_OR_SKIP();
        if (std::string(NORMTAPE_GENERATE).empty()) SKIP_TEST("generate was not built");
        TempDir dir("generate_cli_config");
        const std::string ck = dir / "ck.safetensors", forged = dir / "forged.safetensors";
        REQUIRE(run_train_gpt(dir, "--data random --steps 2 --stop-at 1 --batch 2 --seq 8 --layers 1 --heads 2 "
                                   "--embd 16 --policy input --device cpu --save " + ck).code == 0);
        const std::string p = " --device cpu --prompt hi --tokens 10";
        const std::string of = forged + ": the checkpoint's train_gpt.config has ";
        struct Case {
            const char* key;
            nlohmann::json value;
            std::string says;
        };
        for (const Case& c : {
                 Case{"seq", int64_t{1} << 40, of + "seq 1099511627776, expected a sequence length from 1 to 1048576"},
                 Case{"seq", 0, of + "seq 0, expected a sequence length from 1 to 1048576"},
                 Case{"layers", 1025, of + "layers 1025, expected transformer blocks from 1 to 1024"},
                 Case{"heads", uint64_t{1} << 63, of + "heads 9223372036854775808, expected attention heads from 1 to 1024"},
                 Case{"embd", -16, of + "embd -16, expected an embedding width from 1 to 65536"},
                 Case{"vocab", int64_t{1} << 25, of + "vocab 33554432, expected a vocabulary size from 2 to 16777216"},
                 // Each size in range, but 5.2e10 parameters (206 GB): more than the file holds.
                 Case{"embd", 65536, forged + ": its config (layers 1, heads 2, embd 65536, vocab 256, seq 8) describes a "
                                              "model of 51574669312 parameters, but the file holds 11632 parameter values"},
             }) {
            CAPTURE(c.key);
            set_config(ck, forged, c.key, c.value);
            RunResult r = run_generate(dir, forged + p, address_space_limit(4));  // in case the model is built
            CAPTURE(r.err);
            CHECK(r.code == 2);
            CHECK(lines(r.err) == 1);
            CHECK(r.err.find("generate: " + c.says) == 0);
            CHECK(r.out.empty());
        }
        // A file without checksums is read, with train_gpt --resume's warning.
        const std::string plain = dir / "plain.safetensors";
        strip_checksums(ck, plain);
        const std::string warning = ": the file carries no checksums (it was written by an older normtape or another "
                                    "program), so its bytes cannot be verified\n";
        RunResult g = run_generate(dir, plain + p);
        CHECK(g.code == 0);
        CHECK(g.out.size() == 10);
        CHECK(g.err == "generate: warning: " + plain + warning);
        RunResult t = run_train_gpt(dir, "--resume " + plain);
        CHECK(t.code == 0);
        CHECK(t.err == "train_gpt: warning: --resume " + plain + warning);
    }

    TEST_CASE("generate_cli: a train_gpt.config nested 100,000 deep is refused by generate and train_gpt --resume, exit 2") {
        REQUIRE_TRAIN_GPT_OR_SKIP();
        if (std::string(NORMTAPE_GENERATE).empty()) SKIP_TEST("generate was not built");
        TempDir dir("generate_cli_deep");
        const std::string ck = dir / "ck.safetensors";
        REQUIRE(run_train_gpt(dir, "--data random --steps 2 --stop-at 1 --batch 2 --seq 8 --layers 1 --heads 2 "
                                   "--embd 16 --policy input --device cpu --save " + ck).code == 0);
        // The config with "arch" replaced by `value` (JSON text), in a file without checksums.
        auto forge = [&](const std::string& name, const std::string& value) {
            std::map<std::string, std::string> meta;
            NamedTensors tensors = load_safetensors(ck, &meta);
            nlohmann::json config = nlohmann::json::parse(meta.at("train_gpt.config"));
            config["arch"] = "ARCH";
            std::string text = config.dump();
            text.replace(text.find("\"ARCH\""), 6, value);
            meta["train_gpt.config"] = text;
            const std::string with = dir / (name + "_checksums.safetensors"), path = dir / (name + ".safetensors");
            save_safetensors(with, tensors, meta);
            strip_checksums(with, path);
            return path;
        };
        // Once a SIGSEGV in both programs: the value was copied and dump()ed, recursively.
        const std::string deep = forge("deep", std::string(100000, '[') + std::string(100000, ']'));
        RunResult g = run_generate(dir, deep + " --device cpu --prompt hi --tokens 4");
        CAPTURE(g.err);
        CHECK(g.code == 2);
        CHECK(g.err.find("generate: " + deep + ": malformed train_gpt.config metadata: nests deeper than 64 levels") !=
              std::string::npos);
        RunResult t = run_train_gpt(dir, "--resume " + deep);
        CAPTURE(t.err);
        CHECK(t.code == 2);
        CHECK(t.err.find("--resume " + deep) != std::string::npos);
        CHECK(t.err.find("malformed train_gpt.config: nests deeper than 64 levels") != std::string::npos);
        // 60 deep parses, and the message quotes the first 80 characters of the value.
        const std::string long_value = forge("long", std::string(60, '[') + "1" + std::string(60, ']'));
        g = run_generate(dir, long_value + " --device cpu --prompt hi --tokens 4");
        CAPTURE(g.err);
        CHECK(g.code == 2);
        const std::string error = g.err.substr(g.err.find("\ngenerate: ") + 1);  // after the checksum warning
        CHECK(error.find("train_gpt.config has arch " + std::string(60, '[') + "1" + std::string(19, ']') +
                         "..., expected gpt2") != std::string::npos);
        CHECK(error.size() < 300);
    }

    TEST_CASE("generate_cli: samples a Hugging Face directory (load_hf), as generate() does in process") {
        if (std::string(NORMTAPE_GENERATE).empty()) SKIP_TEST("generate was not built");
        TempDir dir("generate_cli_hf");
        for (const char* arch : {"llama", "gpt2"}) {
            CAPTURE(arch);
            // The fixtures' vocabularies are 64 tokens: bytes 0 to 63, so the prompt is "01".
            const std::string hf = std::string(NORMTAPE_SOURCE_DIR) + "/tests/fixtures/hf/" + arch;
            const std::string args = hf + " --device cpu --prompt 01 --tokens 40";  // past block_size 32
            RunResult r = run_generate(dir, args + " --seed 5");
            CAPTURE(r.err);
            REQUIRE(r.code == 0);
            CHECK(r.err.empty());
            std::string want;
            for (int64_t t : generate(*load_hf(hf), {'0', '1'}, 40, sampling(0.8, 200, 5, true))) want += static_cast<char>(t);
            CHECK(r.out == want);
            CHECK(run_generate(dir, args + " --seed 5 --no-cache").out == want);
        }
        // A Hugging Face model of more than 256 tokens, and a directory load_hf refuses: exit 2.
        GPTConfig c = gpt_config("llama");
        c.vocab_size = 300;
        c.n_layer = 1;
        c.n_embd = 16;
        c.n_head = 2;
        save_hf(GPT(c), dir / "big");
        std::filesystem::create_directories(dir / "bad");
        write_bytes(dir / "bad/config.json", "{\"model_type\": \"t5\"}");
        for (auto [path, says] : {std::pair<std::string, std::string>{dir / "big", "a vocabulary of 300 tokens"},
                                  {dir / "bad", "load_hf: " + (dir / "bad/config.json") + ": model_type \"t5\""}}) {
            RunResult r = run_generate(dir, path + " --device cpu --prompt hi");
            CAPTURE(r.err);
            CHECK(r.code == 2);
            CHECK(lines(r.err) == 1);
            CHECK(r.err.find(says) != std::string::npos);
            CHECK(r.out.empty());
        }
    }
}
