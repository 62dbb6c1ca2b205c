// tests/test_parallel.cpp: the cpu kernels on several threads (core/parallel.h). Every op, forward
// and backward, in f64, f32 and bf16, gives the same bytes at 1, 2, 3 and 4 threads (Note
// [Deterministic parallel cpu kernels]), on sizes of several chunks that are not a multiple of
// the chunk; so do a few GPT training steps. Also: the loops themselves (chunks, threads,
// exceptions), set_num_threads' checks, and gelu's float tanh (accuracy, and bits that do not
// depend on where an element sits). A build without OpenMP skips what needs threads.
#include <cstring>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "core/device_ptr.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

using detail::kGrain;

#define REQUIRE_THREADS_OR_SKIP()                                                           \
    do {                                                                                    \
        ThreadCountGuard probe_;                                                            \
        set_num_threads(2);                                                                 \
        if (get_num_threads() != 2) SKIP_TEST("normtape was built without OpenMP: one thread"); \
    } while (0)

// The raw bytes of a cpu tensor, to compare bit for bit (NaN-safe, -0 != +0); "undefined" for an
// undefined tensor (a gradient that was not made).
std::string bytes_of(const Tensor& t) {
    if (!t.defined()) return "undefined";
    Tensor c = t.contiguous();
    return std::string(detail::byte_ptr(c), static_cast<size_t>(c.nbytes()));
}

// Runs `make` at 1 thread, then at 2, 3 and 4, and checks that every tensor it returns has the
// bytes of the 1-thread run. `make` must make its inputs itself (manual_seed, then randn).
void check_same_bits(const std::function<std::vector<Tensor>()>& make) {
    ThreadCountGuard guard;
    set_num_threads(1);
    std::vector<std::string> want;
    for (const Tensor& t : make()) want.push_back(bytes_of(t));
    for (int threads : {2, 3, 4}) {
        set_num_threads(threads);
        std::vector<Tensor> got = make();
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < got.size(); ++i) {
            std::string g = bytes_of(got[i]);
            size_t first = 0;
            while (first < std::min(g.size(), want[i].size()) && g[first] == want[i][first]) ++first;
            INFO("result " << i << " at " << threads << " threads: " << g.size() << " bytes, first difference at byte "
                           << first << " (" << want[i].size() << " bytes at 1 thread)");
            CHECK(g == want[i]);
        }
    }
}

// A leaf of standard normals (times scale) of `dtype` that requires grad.
Tensor param(const Shape& shape, DType dtype, double scale = 1.0) {
    Tensor t = input(shape, dtype, scale);
    t.requires_grad_(true);
    return t;
}

// out.backward(a seeded random gradient); returns out and the gradients of `leaves`.
std::vector<Tensor> with_grads(const Tensor& out, const std::vector<Tensor>& leaves) {
    out.backward(input(out.shape(), out.dtype()));
    std::vector<Tensor> r{out};
    for (const Tensor& l : leaves) r.push_back(l.grad());
    return r;
}

constexpr DType kAllFloatTypes[] = {DType::F64, DType::F32, DType::BF16};

}  // namespace

TEST_SUITE("parallel") {

TEST_CASE("parallel: set_num_threads refuses fewer than one thread, naming itself") {
    ThreadCountGuard guard;
    for (int n : {0, -1, -64}) {
        CAPTURE(n);
        check_throws<Error>([&] { set_num_threads(n); }, {"set_num_threads", ">= 1", std::to_string(n)});
    }
    set_num_threads(1);
    CHECK(get_num_threads() == 1);
}

TEST_CASE("parallel: parallel_for covers the range once, in chunks fixed by the grain, on several threads") {
    REQUIRE_THREADS_OR_SKIP();
    ThreadCountGuard guard;
    const int64_t begin = 5, end = 1000, grain = 64;
    std::set<std::pair<int64_t, int64_t>> at_one;
    for (int threads : {1, 2, 3}) {
        CAPTURE(threads);
        set_num_threads(threads);
        std::mutex mutex;
        std::set<std::pair<int64_t, int64_t>> chunks;
        std::set<std::thread::id> ids;
        std::vector<int> seen(end, 0);
        detail::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) ++seen[i];  // chunks are disjoint: no two threads touch one i
            std::this_thread::sleep_for(std::chrono::milliseconds(2));  // no thread takes every chunk
            std::lock_guard<std::mutex> lock(mutex);
            chunks.insert({b, e});
            ids.insert(std::this_thread::get_id());
        });
        for (int64_t i = 0; i < end; ++i) CHECK(seen[i] == (i >= begin ? 1 : 0));
        CHECK(chunks.size() == 16);  // ceil(995 / 64)
        CHECK(chunks.begin()->second == begin + grain);
        CHECK(chunks.rbegin()->first == begin + 15 * grain);
        CHECK(ids.size() == static_cast<size_t>(threads));
        if (threads == 1) at_one = chunks;
        CHECK(chunks == at_one);
    }
}

TEST_CASE("parallel: parallel_reduce adds the chunks in chunk order, at any thread count") {
    REQUIRE_THREADS_OR_SKIP();
    ThreadCountGuard guard;
    // Values whose sum depends on the order of the additions.
    std::vector<double> v(100003);
    for (size_t i = 0; i < v.size(); ++i) v[i] = (i % 7 == 0 ? 1e16 : 1.0) * (i % 2 ? 1 : -1) + 0.1 * double(i);
    auto reduce = [&](int64_t grain) {
        double out[2];
        detail::parallel_reduce(0, static_cast<int64_t>(v.size()), grain, 2, out, [&](int64_t b, int64_t e, double* acc) {
            for (int64_t i = b; i < e; ++i) {
                acc[0] += v[i];
                acc[1] += v[i] * v[i];
            }
        });
        return std::make_pair(out[0], out[1]);
    };
    set_num_threads(1);
    const auto want = reduce(1000);
    // The same as adding chunk sums by hand, chunks of reduce_chunk(n, grain).
    const int64_t chunk = detail::reduce_chunk(static_cast<int64_t>(v.size()), 1000);
    CHECK(chunk == 1563);  // 100003 / 64, rounded up: the cap of 64 accumulators
    double by_hand = 0.0;
    for (size_t b = 0; b < v.size(); b += chunk) {
        double s = 0.0;
        for (size_t i = b; i < std::min(v.size(), b + chunk); ++i) s += v[i];
        by_hand += s;
    }
    CHECK(want.first == by_hand);
    for (int threads : {2, 3, 4}) {
        CAPTURE(threads);
        set_num_threads(threads);
        CHECK(reduce(1000) == want);
    }
}

TEST_CASE("parallel: an exception in a chunk reaches the caller, the lowest chunk's at any thread count") {
    REQUIRE_THREADS_OR_SKIP();
    ThreadCountGuard guard;
    for (int threads : {1, 2, 4}) {
        CAPTURE(threads);
        set_num_threads(threads);
        check_throws<std::runtime_error>(
            [] {
                detail::parallel_for(0, 100, 10, [](int64_t b, int64_t) {
                    if (b >= 30) throw std::runtime_error("chunk at " + std::to_string(b));
                });
            },
            {"chunk at 30"});
    }
    // From a copy: a value that does not fit in i64, in a late chunk.
    std::vector<double> values(4 * kGrain + 1, 1.0);
    values.back() = 1e300;
    Tensor t = from_vector<double>(values, {static_cast<int64_t>(values.size())});
    set_num_threads(2);
    check_throws<Error>([&] { t.to(DType::I64); }, {"to", "does not fit"});
}

TEST_CASE("parallel: add, mul, scale, gelu and their gradients have the same bits at 1 to 4 threads") {
    REQUIRE_THREADS_OR_SKIP();
    const int64_t rows = 5 * kGrain / 97 + 3, n = 97;  // about 5 chunks, the last one short
    for (DType dtype : kAllFloatTypes) {
        CAPTURE(dtype_name(dtype));
        check_same_bits([&] {
            manual_seed(1);
            Tensor a = param({rows, n}, dtype), b = param({n}, dtype), c = param({rows, n}, dtype);
            Tensor y = gelu(scale(mul(add(a, b), c), 0.7));
            return with_grads(y, {a, b, c});
        });
    }
}

TEST_CASE("parallel: sum, mean and cross_entropy have the same bits at 1 to 4 threads") {
    REQUIRE_THREADS_OR_SKIP();
    for (DType dtype : kAllFloatTypes) {
        CAPTURE(dtype_name(dtype));
        check_same_bits([&] {
            manual_seed(2);
            Tensor x = param({3 * kGrain + 11}, dtype);
            Tensor s = sum(x), m = mean(scale(x, 3.0));
            std::vector<Tensor> r = with_grads(add(s, m), {x});
            r.push_back(s);
            return r;
        });
        check_same_bits([&] {
            manual_seed(3);
            const int64_t M = 4 * kGrain / 65 + 5, V = 65;  // the cpu kernel takes about kGrain / 4 per chunk
            Tensor logits = param({M, V}, dtype, 3.0);
            std::vector<int64_t> t(M);
            for (int64_t i = 0; i < M; ++i) t[i] = (i * 7919) % V;
            Tensor logits_in = scale(logits, 1.0);  // not a leaf: backward may write over it
            return with_grads(cross_entropy(logits_in, from_vector<int64_t>(t, {M})), {logits});
        });
    }
}

TEST_CASE("parallel: matmul, linear and linear_gelu have the same bits at 1 to 4 threads") {
    REQUIRE_THREADS_OR_SKIP();
    for (DType dtype : kAllFloatTypes) {
        CAPTURE(dtype_name(dtype));
        // Blocks of output rows (more rows than columns) and of columns (more columns), both odd.
        for (auto [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{333, 70, 91}, {45, 83, 517}}) {
            CAPTURE(M);
            check_same_bits([&, M = M, K = K, N = N] {
                manual_seed(4);
                Tensor a = param({M, K}, dtype), b = param({K, N}, dtype);
                return with_grads(matmul(a, b), {a, b});
            });
            for (bool recompute : {false, true}) {
                CAPTURE(recompute);
                check_same_bits([&, M = M, K = K, N = N] {
                    manual_seed(5);
                    Tensor x = param({M, K}, dtype), w = param({N, K}, dtype, 0.1), bias = param({N}, dtype);
                    Tensor w2 = param({K, N}, dtype, 0.1), bias2 = param({K}, dtype);
                    Tensor y = linear(linear_gelu(x, w, bias, recompute), w2, bias2);
                    return with_grads(y, {x, w, bias, w2, bias2});
                });
            }
        }
    }
}

TEST_CASE("parallel: layer_norm and rms_norm under every policy have the same bits at 1 to 4 threads") {
    REQUIRE_THREADS_OR_SKIP();
    const int64_t N = 100, M = 4 * kGrain / N + 7;  // about 16 chunks of kGrain / 4 elements
    for (DType dtype : kAllFloatTypes)
        for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized})
            for (bool rms : {false, true}) {
                CAPTURE(dtype_name(dtype));
                CAPTURE(policy_name(policy));
                CAPTURE(rms);
                check_same_bits([&] {
                    manual_seed(6);
                    Tensor x = param({M, N}, dtype), w = param({N}, dtype), b = param({N}, dtype);
                    Tensor h = rms ? rms_norm(x, w, 1e-5, policy) : layer_norm(x, w, b, 1e-5, policy);
                    // A consumer that saves the output, as a Linear does (and makes it again under Normalized).
                    Tensor y = mul(h, input({M, N}, dtype));
                    return with_grads(y, rms ? std::vector<Tensor>{x, w} : std::vector<Tensor>{x, w, b});
                });
            }
}

TEST_CASE("parallel: embedding and its scatter-add gradient have the same bits at 1 to 4 threads") {
    REQUIRE_THREADS_OR_SKIP();
    for (DType dtype : kAllFloatTypes) {
        CAPTURE(dtype_name(dtype));
        check_same_bits([&] {
            manual_seed(7);
            const int64_t V = 300, C = 200, n = kGrain / 8 + 3;  // many ids per row of the table
            Tensor w = param({V, C}, dtype);
            std::vector<int64_t> id(n);
            for (int64_t i = 0; i < n; ++i) id[i] = (i * i + 3 * i) % V;
            return with_grads(embedding(from_vector<int64_t>(id, {n}), w), {w});
        });
    }
}

TEST_CASE("parallel: causal_self_attention, with and without dropout, has the same bits at 1 to 4 threads") {
    REQUIRE_THREADS_OR_SKIP();
    for (DType dtype : kAllFloatTypes)
        for (double p : {0.0, 0.2}) {
            CAPTURE(dtype_name(dtype));
            CAPTURE(p);
            check_same_bits([&] {
                manual_seed(9);
                Tensor qkv = param({3, 37, 3 * 24}, dtype);  // 3 batches x 4 heads: 12 (batch, head) chunks
                return with_grads(causal_self_attention(qkv, 4, p), {qkv});
            });
        }
}

TEST_CASE("parallel: copies, dtype conversions and in-place updates have the same bits at 1 to 4 threads") {
    REQUIRE_THREADS_OR_SKIP();
    check_same_bits([] {
        manual_seed(8);
        Tensor x = input({301, 7, 97}, DType::F64, 1e3);  // 5 chunks and a short one
        std::vector<Tensor> r{x.to(DType::F32), x.to(DType::BF16), x.to(DType::I64), x.to(DType::BF16).to(DType::F64),
                              x.transpose(0, 2).contiguous(), x.narrow(1, 2, 3).to(DType::F32)};
        Tensor y = x.to(DType::F32);
        y.add_(x.to(DType::F32), 0.3);
        y.mul_(1.7);
        r.push_back(y);
        Tensor z = empty({301, 7, 97}, opts(DType::BF16));
        z.fill_(0.1);
        r.push_back(z);
        return r;
    });
}

TEST_CASE("parallel: AdamW and clip_grad_norm_ give the same parameters at 1 to 4 threads") {
    REQUIRE_THREADS_OR_SKIP();
    for (DType dtype : kAllFloatTypes) {
        CAPTURE(dtype_name(dtype));
        check_same_bits([&] {
            manual_seed(9);
            std::vector<Tensor> ps{param({3 * kGrain + 5}, dtype), param({300, 97}, dtype), param({7}, dtype)};
            AdamWOptions o;
            o.lr = 1e-2;
            AdamW opt(ps, o);
            for (int step = 0; step < 3; ++step) {
                for (Tensor& p : ps) p.grad();  // no-op: the gradients come from the sum below
                sum(mul(ps[0], ps[0])).backward();
                sum(gelu(ps[1])).backward();
                sum(scale(ps[2], 2.0)).backward();
                clip_grad_norm_(ps, 0.5);
                opt.step();
                opt.zero_grad();
            }
            std::vector<Tensor> r = ps;
            for (const Tensor& p : ps) r.push_back(opt.state(p).v);
            return r;
        });
    }
}

TEST_CASE("parallel: GPT training steps give the same parameters at 1 and 2 threads") {
    REQUIRE_THREADS_OR_SKIP();
    ThreadCountGuard guard;
    const int64_t B = 4, T = 32;
    for (auto [norm, policy] : {std::pair{NormKind::Layer, SavePolicy::Input}, {NormKind::RMS, SavePolicy::Normalized}}) {
        CAPTURE(norm_kind_name(norm));
        auto train = [&, norm = norm, policy = policy](int threads) {
            set_num_threads(threads);
            manual_seed(10);
            GPT model({.block_size = T, .n_layer = 2, .n_head = 4, .n_embd = 64, .norm = norm, .policy = policy});
            AdamWOptions o;
            o.lr = 3e-3;
            AdamW opt(model.parameters(), o);
            std::vector<int64_t> x(B * T), y(B * T);
            std::vector<std::string> bytes;
            for (int step = 0; step < 3; ++step) {
                for (int64_t i = 0; i < B * T; ++i) {
                    x[i] = (i * 31 + step * 7) % 256;
                    y[i] = (i * 17 + step * 5 + 1) % 256;
                }
                Tensor loss = model.loss(from_vector(x, {B, T}), from_vector(y, {B, T}));
                bytes.push_back(bytes_of(loss));
                loss.backward();
                clip_grad_norm_(model.parameters(), 1.0);
                opt.step();
                opt.zero_grad();
            }
            for (const Tensor& p : model.parameters()) bytes.push_back(bytes_of(p));
            return bytes;
        };
        const std::vector<std::string> one = train(1), two = train(2);
        REQUIRE(one.size() == two.size());
        for (size_t i = 0; i < one.size(); ++i) {
            INFO("losses of steps 1..3, then the parameters in order: item " << i);
            CHECK(one[i] == two[i]);
        }
    }
}

TEST_CASE("parallel: gelu in f32 is as accurate as with libm's tanh, and an element's bits do not depend on its place") {
    // Against f64 gelu: |error| <= 3 * 2^-24 * max(1, |x|) over [-12, 12]. The unit is the rounding
    // of tanh (about 2^-24) carried through 0.5 x (1 + tanh); gelu with libm's tanhf reaches 2.1 of
    // it, ours 1.8 (relative to |gelu| no f32 gelu is accurate where 1 + tanh cancels, x < -3).
    std::vector<float> xs;
    for (int i = -120000; i <= 120000; ++i) xs.push_back(static_cast<float>(i) * 1e-4f);
    Tensor x32 = from_vector<float>(xs, {static_cast<int64_t>(xs.size())});
    std::vector<float> y32 = gelu(x32).to_vector<float>();
    std::vector<double> y64 = gelu(x32.to(DType::F64)).to_vector<double>();
    double worst = 0.0;
    for (size_t i = 0; i < xs.size(); ++i)
        worst = std::max(worst, std::abs(double(y32[i]) - y64[i]) / std::ldexp(std::max(1.0, std::abs(double(xs[i]))), -24));
    INFO("largest error " << worst << " * 2^-24 * max(1, |x|)");
    CHECK(worst <= 3.0);
    // The same values, shifted by 1..15 places: vector lanes, loop tails and chunk edges move.
    for (int shift = 1; shift < 16; ++shift) {
        CAPTURE(shift);
        std::vector<float> shifted(shift, 0.5f);
        shifted.insert(shifted.end(), xs.begin(), xs.end());
        std::vector<float> y = gelu(from_vector<float>(shifted, {static_cast<int64_t>(shifted.size())})).to_vector<float>();
        CHECK(std::memcmp(y.data() + shift, y32.data(), y32.size() * sizeof(float)) == 0);
    }
    // Special values as libm's tanh gives them.
    std::vector<float> special = gelu(from_vector<float>({0.0f, -0.0f, INFINITY, NAN}, {4})).to_vector<float>();
    CHECK(special[0] == 0.0f);
    CHECK(std::signbit(special[1]));
    CHECK(special[2] == INFINITY);
    CHECK(std::isnan(special[3]));
}

}  // TEST_SUITE
