// tests/test_util.cpp: the shared test helpers that decide what runs: in_test_part's parts.
#include "test_util.h"

using normtape::testing::in_part;
using normtape::testing::test_part;

TEST_CASE("testing: NORMTAPE_TEST_PART's parts split a loop, each item in exactly one") {
    CHECK(test_part(nullptr) == std::pair<int64_t, int64_t>{1, 1});
    CHECK(test_part("") == std::pair<int64_t, int64_t>{1, 1});
    CHECK(test_part("3/8") == std::pair<int64_t, int64_t>{3, 8});
    for (int64_t K = 1; K <= 5; ++K)
        for (int64_t i = 0; i < 23; ++i) {
            int parts = 0;
            for (int64_t k = 1; k <= K; ++k) parts += in_part(i, {k, K});
            CHECK(parts == 1);
        }
    CHECK(in_part(5, {2, 4}));
    CHECK_FALSE(in_part(5, {1, 4}));
    for (const char* bad : {"0/4", "5/4", "1/0", "2", "1/2x", "a/b", "-1/2", "1/-2", " 1/2", "+1/2", "1/ 2", "/2",
                            "1/", "1/2/3", "99999999999999999999/1"}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(test_part(bad), doctest::Contains("expected k/K with 1 <= k <= K"), std::invalid_argument);
    }
}
