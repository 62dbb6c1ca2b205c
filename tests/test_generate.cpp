// tests/test_generate.cpp: sampling with a key/value cache. causal_self_attention_rows
// (ops/attention.h) against the rows of causal_self_attention, on the cpu and on CUDA, and its
// errors; the cached forward (nn/generate.h) against GPT::forward; generate with and without the
// cache, its seeds, top_k and errors; the generate binary on a checkpoint that train_gpt wrote.
#include <string>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// The rows first_row .. T-1 of `out` [B, T, C], as a contiguous [B, T - first_row, C].
Tensor rows_of(const Tensor& out, int64_t first_row) {
    return out.narrow(1, first_row, out.size(1) - first_row).contiguous();
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
