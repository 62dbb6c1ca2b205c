// tests/test_dropout.cpp: Philox4x32-10 (core/philox.h), dropout (ops/dropout.h), attention's
// dropout (ops/attention.h), nn::Dropout and Module::train / eval, and dropout in GPT: the mask
// drawn again in backward (gradients against f64 finite differences with the mask fixed by the
// stream's state), nothing saved for it, eval() turning it off. The cpu and CUDA masks are
// compared in tests/test_cuda.cpp.
#include <cmath>
#include <limits>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// Attention with dropout written the long way: softmax over s <= t, each probability multiplied
// by keep / (1 - p) with keep drawn for element (b * NH + h) * T * T + t * T + s of the stream's
// range at `state`, then the weighted sum of v.
std::vector<double> naive_dropout_attention(const std::vector<double>& qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                                            double p, PhiloxState state) {
    const int64_t hs = C / NH;
    const DropoutMask mask(state, p);
    auto at = [&](int64_t b, int64_t t, int64_t j) { return qkv[(b * T + t) * 3 * C + j]; };
    std::vector<double> out(B * T * C, 0.0);
    for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < NH; ++h)
            for (int64_t t = 0; t < T; ++t) {
                std::vector<double> score(t + 1);
                double m = -std::numeric_limits<double>::infinity(), z = 0;
                for (int64_t s = 0; s <= t; ++s) {
                    double dot = 0;
                    for (int64_t d = 0; d < hs; ++d) dot += at(b, t, h * hs + d) * at(b, s, C + h * hs + d);
                    score[s] = dot / std::sqrt(static_cast<double>(hs));
                    m = std::max(m, score[s]);
                }
                for (int64_t s = 0; s <= t; ++s) z += std::exp(score[s] - m);
                for (int64_t s = 0; s <= t; ++s) {
                    const uint64_t i = static_cast<uint64_t>(((b * NH + h) * T + t) * T + s);
                    const double w = std::exp(score[s] - m) / z * (mask.keep(i) ? 1 / (1 - p) : 0.0);
                    for (int64_t d = 0; d < hs; ++d) out[(b * T + t) * C + h * hs + d] += w * at(b, s, 2 * C + h * hs + d);
                }
            }
    return out;
}

GPTConfig small_config(double dropout) {
    GPTConfig c;
    c.vocab_size = 32;
    c.block_size = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.dropout = dropout;
    return c;
}

}  // namespace

TEST_SUITE("dropout") {
    TEST_CASE("philox4x32_10: Random123's known-answer vectors") {
        // Random123 (Salmon et al. 2011), kat_vectors: counter, key -> four words.
        struct Kat {
            uint32_t c[4], k[2], out[4];
        };
        const Kat kats[] = {
            {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
            {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
             {0xffffffffu, 0xffffffffu},
             {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
            {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
             {0xa4093822u, 0x299f31d0u},
             {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
        };
        for (const Kat& k : kats) {
            PhiloxWords w = philox4x32_10(k.c[0], k.c[1], k.c[2], k.c[3], k.k[0], k.k[1]);
            for (int i = 0; i < 4; ++i) CHECK(w.w[i] == k.out[i]);
        }
    }

    TEST_CASE("philox_next: consecutive draws take disjoint counters, manual_seed restarts the stream") {
        manual_seed(5);
        PhiloxState a = philox_next(10), b = philox_next(1), c = philox_next(0);
        CHECK(a.seed == 5);
        CHECK(a.offset == 0);
        CHECK(b.offset == 3);  // ceil(10 / 4)
        CHECK(c.offset == 4);
        CHECK(philox_state().offset == 4);
        set_philox_state({7, 100});
        CHECK(philox_next(4).offset == 100);
        CHECK(philox_state().seed == 7);
        manual_seed(5);
        CHECK(philox_state().offset == 0);
    }

    TEST_CASE("dropout: drops a fraction p, scales the rest by 1 / (1 - p), and the same state gives the same mask") {
        const int64_t n = 200000;
        Tensor x = full({n}, 3.0, opts(DType::F64));
        for (double p : {0.1, 0.5, 0.9}) {
            INFO("p = ", p);
            manual_seed(11);
            std::vector<double> y = dropout(x, p).to_vector<double>();
            int64_t dropped = 0;
            for (double v : y) {
                if (v == 0) ++dropped;
                else CHECK(v == 3.0 * (1 / (1 - p)));  // x * (1 / (1 - p)), as the kernel rounds it
            }
            // Binomial(n, p): within 5 standard deviations.
            CHECK(std::abs(static_cast<double>(dropped) - p * n) < 5 * std::sqrt(n * p * (1 - p)));
            manual_seed(11);
            CHECK(dropout(x, p).to_vector<double>() == y);
            CHECK(dropout(x, p).to_vector<double>() != y);  // the stream moved on
        }
    }

    TEST_CASE("dropout: p = 0 or training false returns x itself, drawing nothing and recording nothing") {
        Tensor x = leaf({4, 5});
        manual_seed(3);
        for (bool training : {true, false}) {
            Tensor y = dropout(x, training ? 0.0 : 0.5, training);
            CHECK(y.data_ptr<double>() == x.data_ptr<double>());
            CHECK(!y.grad_fn());
        }
        CHECK(philox_state().offset == 0);
    }

    TEST_CASE("dropout: gradcheck with the mask fixed by the stream's state, f64") {
        manual_seed(12);
        const PhiloxState s = philox_state();
        auto f = [&](const std::vector<Tensor>& in) {
            set_philox_state(s);
            return dropout(in[0], 0.3);
        };
        std::vector<Tensor> in{leaf({3, 7})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("dropout: f32 and bf16 keep exactly the f64 mask, values rounded once") {
        manual_seed(13);
        Tensor x = input({1000}, DType::F64);
        for (DType dt : {DType::F32, DType::BF16}) {
            INFO("dtype ", dtype_name(dt));
            set_philox_state({13, 40});
            std::vector<double> ref = dropout(x, 0.25).to_vector<double>();
            set_philox_state({13, 40});
            std::vector<double> y = as_f64(dropout(x.to(dt), 0.25));
            for (size_t i = 0; i < y.size(); ++i) {
                CHECK((y[i] == 0) == (ref[i] == 0));
                CHECK(y[i] == doctest::Approx(ref[i]).epsilon(dt == DType::BF16 ? 1e-2 : 1e-6));
            }
        }
    }

    TEST_CASE("dropout: bad input") {
        Tensor x = input({4}, DType::F32);
        CHECK_THROWS_KIND_WITH(dropout(x, 1.0), Error, "dropout", "[0, 1)", "1");
        CHECK_THROWS_KIND_WITH(dropout(x, -0.1), Error, "dropout", "[0, 1)", "-0.1");
        CHECK_THROWS_KIND_WITH(dropout(x, std::nan("")), Error, "dropout", "[0, 1)");
        CHECK_THROWS_KIND_WITH(dropout(Tensor(), 0.1), Error, "dropout", "undefined");
        CHECK_THROWS_KIND_WITH(dropout(zeros({3}, opts(DType::I64)), 0.1), DTypeError, "dropout", "i64");
        CHECK_THROWS_KIND_WITH(Dropout(1.5), Error, "Dropout", "[0, 1)", "1.5");
        GPTConfig c = small_config(1.0);
        CHECK_THROWS_KIND_WITH(GPT{c}, Error, "GPTConfig", "dropout", "[0, 1)");
    }
}

TEST_SUITE("causal_self_attention") {
    TEST_CASE("causal_self_attention: dropout on the probabilities matches a naive attention with the same mask") {
        manual_seed(21);
        const int64_t B = 2, T = 6, C = 8, NH = 2;
        for (DType dt : kFloatTypes) {
            INFO("dtype ", dtype_name(dt));
            Tensor qkv = input({B, T, 3 * C}, dt);
            const PhiloxState s = philox_state();
            Tensor y = causal_self_attention(qkv, NH, 0.4);
            CHECK(philox_state().offset == s.offset + (B * NH * T * T + 3) / 4);
            CHECK_CLOSE(y, expected(naive_dropout_attention(as_f64(qkv), B, T, C, NH, 0.4, s), {B, T, C}), tolerance(dt));
        }
    }

    TEST_CASE("causal_self_attention: gradcheck with dropout, the mask fixed by the stream's state") {
        manual_seed(22);
        const PhiloxState s = philox_state();
        auto f = [&](const std::vector<Tensor>& in) {
            set_philox_state(s);
            return causal_self_attention(in[0], 2, 0.3);
        };
        std::vector<Tensor> in{leaf({2, 5, 3 * 8})};
        CHECK_GRADCHECK(f, in);
    }

    TEST_CASE("causal_self_attention: dropout saves the bytes it saves without dropout") {
        manual_seed(23);
        Tensor qkv = leaf({2, 5, 24});
        const int64_t before = saved_bytes();
        int64_t without = 0, with = 0;
        {
            Tensor y = causal_self_attention(qkv, 2);
            without = saved_bytes() - before;
        }
        {
            Tensor y = causal_self_attention(qkv, 2, 0.5);
            with = saved_bytes() - before;
        }
        CHECK(without > 0);
        CHECK(with == without);
        CHECK_THROWS_KIND_WITH(causal_self_attention(qkv, 2, 1.0), Error, "causal_self_attention", "dropout", "[0, 1)");
    }
}

TEST_SUITE("nn") {
    TEST_CASE("Module: train() and eval() reach every submodule") {
        GPT model(small_config(0.1));
        CHECK(model.is_training());
        model.eval();
        CHECK(!model.is_training());
        CHECK(!model.h[1]->attn->resid_dropout->is_training());
        CHECK(!model.h[0]->mlp->dropout->is_training());
        CHECK(!model.drop->is_training());
        model.train();
        CHECK(model.h[1]->mlp->dropout->is_training());
    }

    TEST_CASE("GPT: dropout saves no byte more, eval() turns it off, train() draws a new mask each forward") {
        for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized}) {
            INFO("policy ", policy_name(policy));
            GPTConfig with_cfg = small_config(0.2), without_cfg = small_config(0.0);
            with_cfg.policy = without_cfg.policy = policy;
            manual_seed(31);
            GPT with(with_cfg);
            manual_seed(31);
            GPT without(without_cfg);
            Tensor idx = from_vector<int64_t>({1, 5, 9, 2, 30, 7, 3, 3, 0, 11, 12, 13}, {2, 6});
            Tensor targets = from_vector<int64_t>({5, 9, 2, 30, 7, 3, 3, 0, 11, 12, 13, 1}, {2, 6});
            const int64_t base = saved_bytes();
            int64_t saved_with = 0, saved_without = 0;
            {
                Tensor loss = with.loss(idx, targets);
                saved_with = saved_bytes() - base;
            }
            {
                Tensor loss = without.loss(idx, targets);
                saved_without = saved_bytes() - base;
            }
            CHECK(saved_with == saved_without);

            std::vector<float> a = with.forward(idx).to_vector<float>(), b = with.forward(idx).to_vector<float>();
            CHECK(a != b);
            with.eval();
            std::vector<float> c = with.forward(idx).to_vector<float>(), d = with.forward(idx).to_vector<float>();
            CHECK(c == d);
            CHECK(c == without.forward(idx).to_vector<float>());
        }
    }
}

TEST_SUITE("cuda") {
    TEST_CASE("cuda: dropout draws the cpu's mask, forward and backward, f32 and bf16") {
        REQUIRE_CUDA_OR_SKIP();
        manual_seed(41);
        Tensor x = input({3, 1001}, DType::F32);  // not a multiple of 4: the last counter's words partly used
        for (DType dt : {DType::F32, DType::BF16}) {
            INFO("dtype ", dtype_name(dt));
            Tensor xc = x.to(dt), xg = xc.to(Device::CUDA);
            xc.requires_grad_(true);
            xg.requires_grad_(true);
            set_philox_state({41, 7});
            Tensor yc = dropout(xc, 0.3);
            set_philox_state({41, 7});
            Tensor yg = dropout(xg, 0.3);
            CHECK(as_f64(yg.to(Device::CPU)) == as_f64(yc));
            Tensor u = input({3, 1001}, DType::F32).to(dt);
            sum(mul(yc, u)).backward();
            sum(mul(yg, u.to(Device::CUDA))).backward();
            CHECK(as_f64(xg.grad().to(Device::CPU)) == as_f64(xc.grad()));
        }
    }

    // f32: the warp-per-row kernels; bf16 at head sizes 64 and 128: the tensor-core kernels. T below,
    // at and past the 64-row tile.
    TEST_CASE("cuda: attention with dropout, gradients included, match the cpu with the same mask") {
        REQUIRE_CUDA_OR_SKIP();
        manual_seed(42);
        for (DType dt : {DType::F32, DType::BF16})
            for (int64_t hs : {16, 64, 128})
                for (int64_t T : {37, 64, 130}) {
                    INFO("dtype ", dtype_name(dt), ", hs ", hs, ", T ", T);
                    const int64_t nh = 2, B = 2;
                    Tensor qkv = input({B, T, 3 * nh * hs}, DType::F32, 2.0).to(dt);
                    Tensor qc = qkv.clone(), qg = qkv.to(Device::CUDA);
                    qc.requires_grad_(true);
                    qg.requires_grad_(true);
                    set_philox_state({42, 1000});
                    Tensor yc = causal_self_attention(qc, nh, 0.25);
                    set_philox_state({42, 1000});
                    Tensor yg = causal_self_attention(qg, nh, 0.25);
                    CHECK_NORMWISE(yg, yc, normwise_tolerance(dt));
                    Tensor u = input({B, T, nh * hs}, DType::F32).to(dt);
                    sum(mul(yc, u)).backward();
                    sum(mul(yg, u.to(Device::CUDA))).backward();
                    CHECK_NORMWISE(qg.grad(), qc.grad(), normwise_tolerance(dt));
                }
    }

    TEST_CASE("cuda: a bf16 GPT saves no byte more with dropout, and eval() turns it off") {
        REQUIRE_CUDA_OR_SKIP();
        GPTConfig with_cfg = small_config(0.2), without_cfg = small_config(0.0);
        with_cfg.n_embd = without_cfg.n_embd = 128;  // head size 64: the tensor-core attention
        with_cfg.dtype = without_cfg.dtype = DType::BF16;
        with_cfg.device = without_cfg.device = Device::CUDA;
        manual_seed(43);
        GPT with(with_cfg);
        manual_seed(43);
        GPT without(without_cfg);
        Tensor idx = from_vector<int64_t>({1, 5, 9, 2, 30, 7, 3, 3, 0, 11, 12, 13}, {2, 6}).to(Device::CUDA);
        const int64_t base = saved_bytes();
        int64_t saved_with = 0, saved_without = 0;
        {
            Tensor logits = with.forward(idx);
            saved_with = saved_bytes() - base;
        }
        {
            Tensor logits = without.forward(idx);
            saved_without = saved_bytes() - base;
        }
        CHECK(saved_with == saved_without);
        with.eval();
        CHECK(as_f64(with.forward(idx).to(Device::CPU)) == as_f64(without.forward(idx).to(Device::CPU)));
    }
}
