// tests/test_embedding.cpp: embedding (ops/embedding.h), one TEST_SUITE per op.
// Per op: (a) forward against a plain computation written here, in f64 and f32; (b) f64
// finite-difference gradcheck of every differentiable input; (c) every error path of the op's
// header, each naming the op, and no bytes leaked by the failed calls.
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

TEST_SUITE("embedding") {
    TEST_CASE("embedding: forward copies the rows looked up") {
        manual_seed(91);
        const int64_t V = 5, C = 4;
        std::vector<int64_t> vi{3, 0, 3, 4, 1, 3};
        Tensor idx = ids(vi, {2, 3});
        for (DType dt : kFloatTypes) {
            INFO("dtype ", std::string(dtype_name(dt)));
            Tensor w = input({V, C}, dt);
            std::vector<double> vw = as_f64(w), want;
            for (int64_t id : vi)
                for (int64_t c = 0; c < C; ++c) want.push_back(vw[id * C + c]);
            Tensor y = embedding(idx, w);
            CHECK(y.shape() == Shape{2, 3, C});
            CHECK(y.dtype() == dt);
            // A lookup is a copy: exact in every dtype.
            CHECK_CLOSE(y, expected(want, {2, 3, C}), (Tolerance{0.0, 0.0}));
        }
    }

    TEST_CASE("embedding: gradcheck of weight, repeated ids accumulate") {
        manual_seed(92);
        Tensor idx = ids({2, 2, 0, 2, 4, 0}, {3, 2});
        auto f = [&](const std::vector<Tensor>& in) { return embedding(idx, in[0]); };
        std::vector<Tensor> in{leaf({6, 3})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("embedding: dweight row = number of occurrences for an upstream gradient of ones") {
        Tensor w = leaf({4, 2});
        Tensor idx = ids({1, 1, 3, 1}, {4});
        embedding(idx, w).backward(ones({4, 2}, opts(DType::F64)));
        REQUIRE(w.grad().defined());
        CHECK(w.grad().to_vector<double>() == std::vector<double>{0, 0, 3, 3, 0, 0, 1, 1});
    }

    TEST_CASE("embedding: bad input") {
        Tensor w = zeros({5, 4}), wi = zeros({5, 4}, opts(DType::I64)), w1 = zeros({5}), w3 = zeros({5, 4, 1});
        Tensor w_empty = zeros({0, 4});
        Tensor idx = ids({0, 1, 2}, {3}), idx_f = zeros({3}), idx_empty = zeros({0}, opts(DType::I64));
        Tensor idx_neg = ids({0, -1, 2}, {3}), idx_v = ids({0, 1, 5}, {3});
        Tensor idx_big = ids({0, 1, 2, 3, 4, 17}, {2, 3});
        Tensor w11 = zeros({11, 4});
        int64_t before = cpu_allocated();

        CHECK_THROWS_KIND_WITH(embedding(Tensor(), w), normtape::Error, "embedding");
        CHECK_THROWS_KIND_WITH(embedding(idx, Tensor()), normtape::Error, "embedding");
        CHECK_THROWS_KIND_WITH(embedding(idx_f, w), normtape::Error, "embedding", "i64");
        CHECK_THROWS_KIND_WITH(embedding(idx_empty, w), normtape::Error, "embedding");
        CHECK_THROWS_KIND_WITH(embedding(idx, w_empty), normtape::Error, "embedding");
        CHECK_THROWS_KIND_WITH(embedding(idx, wi), normtape::Error, "embedding");
        CHECK_THROWS_KIND_WITH(embedding(idx, w1), normtape::Error, "embedding");
        CHECK_THROWS_KIND_WITH(embedding(idx, w3), normtape::Error, "embedding", "[5, 4, 1]");
        CHECK_THROWS_KIND_WITH(embedding(idx_neg, w), normtape::Error, "embedding", "-1");
        CHECK_THROWS_KIND_WITH(embedding(idx_v, w), normtape::Error, "embedding");
        // The message gives the id, its position and V.
        CHECK_THROWS_KIND_WITH(embedding(idx_big, w11), normtape::Error, "17", "11", "5");

        CHECK(cpu_allocated() == before);
    }
}
