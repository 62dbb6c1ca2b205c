// tests/test_data.cpp: Batcher (nn/data/data.h): windows of the text with their targets one token on,
// the same batches from the same seed, a saved state resuming the same sequence of batches, random
// tokens in range, the shortest text it accepts, and each bad argument's error.
#include <limits>
#include <random>
#include <string>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {
// n bytes of a fixed pseudo-random sequence: a window of 8 bytes or more occurs in it once.
std::string text_of(int64_t n) {
    std::mt19937 rng(42);
    std::string t;
    for (int64_t i = 0; i < n; ++i) t += static_cast<char>(rng() % 256);
    return t;
}
}  // namespace

TEST_CASE("data: a batch's rows are windows of the text, its targets the same windows one token on") {
    const std::string text = text_of(300);
    const int64_t B = 5, T = 16;
    Batcher batcher(text, B, T, 256, 7);
    for (int k = 0; k < 4; ++k) {
        Batch batch = batcher.next();
        REQUIRE(batch.idx.shape() == Shape{B, T});
        REQUIRE(batch.targets.shape() == Shape{B, T});
        CHECK(batch.idx.dtype() == DType::I64);
        std::vector<int64_t> x = batch.idx.to_vector<int64_t>(), y = batch.targets.to_vector<int64_t>();
        for (int64_t b = 0; b < B; ++b) {
            std::string window;
            for (int64_t t = 0; t < T; ++t) window += static_cast<char>(x[b * T + t]);
            size_t start = text.find(window);
            REQUIRE(start != std::string::npos);
            for (int64_t t = 0; t < T; ++t)
                CHECK(y[b * T + t] == static_cast<unsigned char>(text[start + t + 1]));
        }
    }
}

TEST_CASE("data: the same seed draws the same batches, and a restored state the batches that follow it") {
    const std::string text = text_of(300);
    Batcher a(text, 3, 8, 256, 11), b(text, 3, 8, 256, 11), other(text, 3, 8, 256, 12);
    CHECK(a.next().idx.to_vector<int64_t>() == b.next().idx.to_vector<int64_t>());
    CHECK(a.next().idx.to_vector<int64_t>() != other.next().idx.to_vector<int64_t>());
    std::string saved = a.state();
    std::vector<int64_t> third = a.next().targets.to_vector<int64_t>();
    Batcher resumed(text, 3, 8, 256, 999);
    resumed.set_state(saved);
    CHECK(resumed.next().targets.to_vector<int64_t>() == third);
    // A bad state is refused and leaves the generator where it was.
    std::string before = resumed.state();
    CHECK_THROWS_KIND_WITH(resumed.set_state("not a state"), Error, "Batcher", "state");
    CHECK(resumed.state() == before);
}

TEST_CASE("data: with an empty text the batches are random tokens from 0 to vocab_size - 1") {
    Batcher batcher("", 4, 32, 5, 3);
    std::vector<int64_t> seen(5, 0);
    for (int k = 0; k < 3; ++k)
        for (int64_t v : batcher.next().idx.to_vector<int64_t>()) {
            REQUIRE(v >= 0);
            REQUIRE(v < 5);
            ++seen[v];
        }
    for (int64_t count : seen) CHECK(count > 0);
}

TEST_CASE("data: a text of T + 1 tokens holds one window, a shorter one and empty sizes are refused") {
    Batch batch = Batcher("abcde", 2, 4, 256, 1).next();
    CHECK(batch.idx.to_vector<int64_t>() == std::vector<int64_t>{'a', 'b', 'c', 'd', 'a', 'b', 'c', 'd'});
    CHECK(batch.targets.to_vector<int64_t>() == std::vector<int64_t>{'b', 'c', 'd', 'e', 'b', 'c', 'd', 'e'});
    CHECK_THROWS_KIND_WITH(Batcher("abcd", 2, 4, 256, 1), ShapeError, "Batcher", "at least T + 1 = 5", "got 4");
    CHECK_THROWS_KIND_WITH(Batcher("abcde", 0, 4, 256, 1), ShapeError, "Batcher", "B >= 1", "got B 0");
    CHECK_THROWS_KIND_WITH(Batcher("abcde", 1, 0, 256, 1), ShapeError, "Batcher", "T >= 1");
    CHECK_THROWS_KIND_WITH(Batcher("", 1, 4, 0, 1), ShapeError, "Batcher", "vocab_size >= 1");
}

TEST_CASE("data: sizes whose products overflow are refused, and a batch too large for memory throws OutOfMemoryError") {
    const int64_t max = std::numeric_limits<int64_t>::max();
    // B * T (and the batch's bytes, B * T * 8) past int64: refused where they enter.
    CHECK_THROWS_KIND_WITH(Batcher("abcde", int64_t(1) << 62, 4, 256, 1), ShapeError, "Batcher", "B * T",
                           "4611686018427387904", "overflow");
    CHECK_THROWS_KIND_WITH(Batcher("", int64_t(1) << 31, int64_t(1) << 31, 256, 1), ShapeError, "Batcher", "B * T");
    // T + 1 past int64: refused, not wrapped to a negative count that any text passes.
    CHECK_THROWS_KIND_WITH(Batcher("abcde", 1, max, 256, 1), ShapeError, "Batcher", "T + 1", "overflow");
    // 2^56 tokens a tensor (2^59 bytes) fit int64 but no host: the library's OutOfMemoryError,
    // naming Batcher and the bytes, not std::bad_alloc; nothing is left allocated.
    const int64_t before = cpu_allocated();
    Batcher huge("", int64_t(1) << 28, int64_t(1) << 28, 256, 1);
    CHECK_THROWS_KIND_WITH(huge.next(), OutOfMemoryError, "Batcher", "576460752303423488 bytes");
    CHECK(cpu_allocated() == before);
}

TEST_CASE("data: batches are made on the device the batcher was given") {
    REQUIRE_CUDA_OR_SKIP();
    Batcher cpu(text_of(100), 2, 8, 256, 5), gpu(text_of(100), 2, 8, 256, 5, Device::CUDA);
    Batch on_gpu = gpu.next();
    CHECK(on_gpu.idx.device().is_cuda());
    CHECK(on_gpu.targets.to(Device::CPU).to_vector<int64_t>() == cpu.next().targets.to_vector<int64_t>());
}

TEST_CASE("data: token ids of any vocabulary make the windows, and an id past vocab_size is refused with its position") {
    std::vector<uint32_t> ids;
    for (uint32_t i = 0; i < 40; ++i) ids.push_back(70000 + 3 * i);  // past 2^16: the ids as given, not bytes
    Batcher batcher(ids, 2, 5, 70000 + 3 * 40, 9);
    Batch batch = batcher.next();
    std::vector<int64_t> x = batch.idx.to_vector<int64_t>(), y = batch.targets.to_vector<int64_t>();
    for (size_t k = 0; k < x.size(); ++k) {
        CHECK((x[k] - 70000) % 3 == 0);
        CHECK(y[k] == x[k] + 3);  // the next id in the sequence
    }
    CHECK(batcher.tokens() == ids);
    ids[17] = 70000 + 3 * 40;
    CHECK_THROWS_KIND_WITH(Batcher(ids, 2, 5, 70000 + 3 * 40, 9), Error, "Batcher", "below vocab_size 70120",
                           "got 70120 at position 17");
    // A text's bytes are ids too: a vocabulary smaller than its largest byte is refused.
    CHECK_THROWS_KIND_WITH(Batcher("abcde", 1, 4, 100, 1), Error, "Batcher", "below vocab_size 100", "got 100 at position 3");
}
