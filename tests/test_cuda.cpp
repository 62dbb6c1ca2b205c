// tests/test_cuda.cpp: the CUDA backend against the cpu reference: the caching allocator's
// accounting, device copies, every op forward and backward in f32 and bf16 (the norms in both
// policies, over every shape class, with weights near zero), and a whole GPT step. Every case
// skips with a message where no GPU is visible.
#include <functional>

#if NORMTAPE_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "core/cuda_allocator.h"
#include "core/device_ptr.h"
#include "norm_test_cases.h"
#include "ops/attention_cudnn.h"
#include "ops/cuda_launchers.h"
#include "ops/norm/norm.h"
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;

// An input of a compared op: values (made on the cpu in f32 or i64) and whether it needs a gradient.
struct Input {
    Tensor values;
    bool differentiable = true;
};

Input normal(const Shape& shape, double scale = 1.0) {
    Tensor t = randn(shape);
    t.mul_(scale);
    return {t, true};
}

Input indices(const Shape& shape, int64_t n) {
    Tensor t = zeros(shape, TensorOptions().dtype(DType::I64));
    int64_t* p = t.data_ptr<int64_t>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<int64_t>(rand_scalar() * static_cast<double>(n)) % n;
    return {t, false};
}

// Runs f on the inputs on the cpu and on CUDA, in `dtype`, and compares the outputs and, for
// L = sum(out * u) with a random u, every differentiable input's gradient (normwise).
void check_cuda_matches_cpu(DType dtype, const std::vector<Input>& inputs, const OpFn& f) {
    CAPTURE(dtype_name(dtype));
    std::vector<Tensor> cpu, gpu;
    for (const Input& in : inputs) {
        Tensor c = in.differentiable ? in.values.to(dtype) : in.values.clone();
        Tensor g = c.to(Device::CUDA);
        if (in.differentiable) {
            c.requires_grad_(true);
            g.requires_grad_(true);
        }
        cpu.push_back(c);
        gpu.push_back(g);
    }
    Tensor out_cpu = f(cpu), out_gpu = f(gpu);
    REQUIRE(out_gpu.device() == Device::CUDA);
    CHECK_NORMWISE(out_gpu, out_cpu, normwise_tolerance(dtype));
    Tensor u = randn(out_cpu.shape()).to(dtype);
    sum(mul(out_cpu, u)).backward();
    sum(mul(out_gpu, u.to(Device::CUDA))).backward();
    for (size_t i = 0; i < inputs.size(); ++i) {
        if (!inputs[i].differentiable) continue;
        CAPTURE(i);
        REQUIRE(gpu[i].grad().defined());
        CHECK_NORMWISE(gpu[i].grad(), cpu[i].grad(), normwise_tolerance(dtype));
    }
}

const DType kDtypes[] = {DType::F32, DType::BF16};

}  // namespace

TEST_SUITE("cuda") {

TEST_CASE("cuda: cuda_compute_capability is the driver's, and bf16 runs where it is 8.0 or later") {
    REQUIRE_CUDA_OR_SKIP();
    const int cc = cuda_compute_capability(Device::CUDA);
#if NORMTAPE_WITH_CUDA
    cudaDeviceProp prop{};
    REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    CHECK(cc == prop.major * 10 + prop.minor);
#endif
    Tensor x = randn({4, 8}, TensorOptions().device(Device::CUDA)).to(DType::BF16);
    if (cc >= 80) {
        CHECK_NOTHROW(gelu(x));
    } else {
        CHECK_THROWS_KIND_WITH(gelu(x), DTypeError, "gelu", "compute capability");
        CHECK_NOTHROW(gelu(x.to(DType::F32)));
    }
}

TEST_CASE("cuda: the caching allocator counts, caches, reuses, splits and resets") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope caching(true);
    empty_cache(Device::CUDA);
    MemoryStats s0 = memory_stats(Device::CUDA);
    void* first = nullptr;
    {
        Tensor a = empty({250}, TensorOptions().device(Device::CUDA));  // 1000 bytes: small pool, one 2 MiB segment
        first = a.storage()->data();
        MemoryStats s1 = memory_stats(Device::CUDA);
        CHECK(s1.allocated_bytes - s0.allocated_bytes == 1000);
        CHECK(s1.reserved_bytes - s0.reserved_bytes == (2 << 20));
        Tensor b = empty({250}, TensorOptions().device(Device::CUDA));  // split from the same segment
        CHECK(memory_stats(Device::CUDA).reserved_bytes == s1.reserved_bytes);
        CHECK(static_cast<char*>(b.storage()->data()) - static_cast<char*>(first) == 1024);  // rounded to 512
        CHECK(memory_stats(Device::CUDA).peak_allocated_bytes - s0.allocated_bytes >= 2000);
    }
    MemoryStats s2 = memory_stats(Device::CUDA);
    CHECK(s2.allocated_bytes == s0.allocated_bytes);
    CHECK(s2.reserved_bytes - s0.reserved_bytes == (2 << 20));  // cached, not returned
    {
        Tensor c = empty({250}, TensorOptions().device(Device::CUDA));
        CHECK(c.storage()->data() == first);  // the freed block, merged back, is reused
        CHECK(memory_stats(Device::CUDA).reserved_bytes == s2.reserved_bytes);
    }
    reset_peak_memory_stats(Device::CUDA);
    CHECK(memory_stats(Device::CUDA).peak_allocated_bytes == memory_stats(Device::CUDA).allocated_bytes);
    {
        Tensor big = empty({(int64_t(50) << 20) / 4}, TensorOptions().device(Device::CUDA));  // 50 MiB, own segment
        CHECK(memory_stats(Device::CUDA).reserved_bytes - s2.reserved_bytes == (int64_t(50) << 20));
    }
    empty_cache(Device::CUDA);
    CHECK(memory_stats(Device::CUDA).reserved_bytes == s0.reserved_bytes);
}

TEST_CASE("cuda: with caching off each tensor is a cudaMalloc of its bytes, freed at once, counted the same") {
    REQUIRE_CUDA_OR_SKIP();
    CachingScope off(false);
    MemoryStats s0 = memory_stats(Device::CUDA);
    {
        Tensor a = empty({250}, TensorOptions().device(Device::CUDA));  // 1000 bytes: no segment, no rounding
        MemoryStats s1 = memory_stats(Device::CUDA);
        CHECK(s1.allocated_bytes - s0.allocated_bytes == 1000);
        CHECK(s1.reserved_bytes - s0.reserved_bytes == 1000);
        CHECK(s1.num_allocs - s0.num_allocs == 1);
        Tensor b = empty({3}, TensorOptions().device(Device::CUDA).dtype(DType::BF16));  // 6 bytes
        CHECK(memory_stats(Device::CUDA).reserved_bytes - s0.reserved_bytes == 1006);
        CHECK(memory_stats(Device::CUDA).allocated_bytes - s0.allocated_bytes == 1006);
        a.fill_(2.0);  // the bytes are usable
        CHECK(sum(a).item<float>() == 500.0f);
    }
    MemoryStats s2 = memory_stats(Device::CUDA);
    CHECK(s2.allocated_bytes == s0.allocated_bytes);
    CHECK(s2.reserved_bytes == s0.reserved_bytes);  // returned to the driver, not cached
    // A block allocated while caching was on goes back to the cache when it is freed with caching off.
    Tensor cached;
    {
        CachingScope on(true);
        cached = empty({250}, TensorOptions().device(Device::CUDA));
    }
    int64_t held = memory_stats(Device::CUDA).reserved_bytes;
    cached = Tensor();
    CHECK(memory_stats(Device::CUDA).reserved_bytes == held);
    CHECK(memory_stats(Device::CUDA).allocated_bytes == s0.allocated_bytes);
}

TEST_CASE("cuda: running out of memory throws with the request and the counters, and leaks nothing") {
    REQUIRE_CUDA_OR_SKIP();
    MemoryStats before = memory_stats(Device::CUDA);
    CHECK_THROWS_KIND_WITH(empty({int64_t(1) << 44}, TensorOptions().device(Device::CUDA)), OutOfMemoryError,
                           "out of memory on cuda:0: tried to allocate 70368744177664 bytes");
    CHECK(memory_stats(Device::CUDA).allocated_bytes == before.allocated_bytes);
    Tensor still_usable = ones({4}, TensorOptions().device(Device::CUDA));
    CHECK(sum(still_usable).item<float>() == 4.0f);
}

TEST_CASE("cuda: copies between devices and dtypes round-trip") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(1);
    Tensor x = randn({3, 5});
    for (DType d : {DType::F32, DType::F64, DType::BF16}) {
        Tensor c = x.to(d);
        CHECK_CLOSE(c.to(Device::CUDA).to(Device::CPU), c, tolerance(DType::F64));
        CHECK_CLOSE(c.to(Device::CUDA).to(DType::F32).to(Device::CPU), c.to(DType::F32), tolerance(DType::F64));
    }
    Tensor t = x.to(Device::CUDA).transpose(0, 1).contiguous().to(Device::CPU);
    CHECK_CLOSE(t, x.transpose(0, 1).contiguous(), tolerance(DType::F64));
    manual_seed(7);
    std::vector<float> r1 = randn({1001}, TensorOptions().device(Device::CUDA)).to_vector<float>();
    manual_seed(7);
    std::vector<float> r2 = randn({1001}, TensorOptions().device(Device::CUDA)).to_vector<float>();
    CHECK(r1 == r2);  // cuRAND Philox, seeded by manual_seed: reproducible
    // Factories made on the cpu and copied keep their options on the GPU.
    TensorOptions grad_f64 = TensorOptions().dtype(DType::F64).device(Device::CUDA).requires_grad(true);
    Tensor r = arange(4, grad_f64);
    CHECK(r.requires_grad());
    CHECK(r.device() == Device::CUDA);
    CHECK(r.to_vector<double>() == std::vector<double>{0, 1, 2, 3});
    CHECK(from_vector<double>({1, 2}, {}, grad_f64).requires_grad());
}

TEST_CASE("cuda: elementwise ops, reductions and products match the cpu") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(2);
    for (DType d : kDtypes) {
        check_cuda_matches_cpu(d, {normal({4, 5, 33}), normal({33})}, [](auto& in) { return add(in[0], in[1]); });
        check_cuda_matches_cpu(d, {normal({4, 5, 33}), normal({5, 33})}, [](auto& in) { return add(in[0], in[1]); });
        check_cuda_matches_cpu(d, {normal({7, 65}), normal({7, 65})}, [](auto& in) { return mul(in[0], in[1]); });
        check_cuda_matches_cpu(d, {normal({3, 100})}, [](auto& in) { return scale(in[0], -1.5); });
        check_cuda_matches_cpu(d, {normal({1000}, 2.0)}, [](auto& in) { return gelu(in[0]); });
        // 16-byte vectors, then the last n % 8 elements one at a time; a vector broadcast row.
        check_cuda_matches_cpu(d, {normal({1003}, 2.0)}, [](auto& in) { return gelu(in[0]); });
        check_cuda_matches_cpu(d, {normal({6, 40}), normal({40})}, [](auto& in) { return add(in[0], in[1]); });
        // The bias gradient's column sums: vectors in one pass and by 256-row chunks; scalars in one
        // pass and by chunks (33 columns).
        for (const Shape& shape : {Shape{100, 48}, Shape{700, 48}, Shape{300, 33}, Shape{2100, 33}})
            check_cuda_matches_cpu(d, {normal(shape), normal({shape[1]})}, [](auto& in) { return add(in[0], in[1]); });
        check_cuda_matches_cpu(d, {normal({37, 41})}, [](auto& in) { return sum(in[0]); });
        check_cuda_matches_cpu(d, {normal({37, 41})}, [](auto& in) { return mean(in[0]); });
        check_cuda_matches_cpu(d, {normal({2, 17, 33}), normal({33, 20})}, [](auto& in) { return matmul(in[0], in[1]); });
        check_cuda_matches_cpu(d, {normal({4, 9, 48}), normal({40, 48}), normal({40})},
                               [](auto& in) { return linear(in[0], in[1], in[2]); });
        check_cuda_matches_cpu(d, {normal({300, 64}), normal({96, 64})}, [](auto& in) { return linear(in[0], in[1]); });
    }
}

TEST_CASE("cuda: SavePolicy::Normalized is as exact as Input at any weight, in bf16, both norms") {
    REQUIRE_CUDA_OR_SKIP();
    check_normalized_at_any_weight({"layer_norm", true,
                                    [](const Tensor& x, const Tensor& w, const Tensor& b, double eps, SavePolicy p) {
                                        return layer_norm(x, w, b, eps, p);
                                    }},
                                   Device::CUDA);
    check_normalized_at_any_weight({"rms_norm", false,
                                    [](const Tensor& x, const Tensor& w, const Tensor&, double eps, SavePolicy p) {
                                        return rms_norm(x, w, eps, p);
                                    }},
                                   Device::CUDA);
}

TEST_CASE("cuda: linear and linear_gelu through cuBLASLt's epilogues and without them match the cpu") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(9);
    for (DType d : kDtypes) {
        // N % 8 == 0: bias and bias + GELU in the products' epilogues.
        check_cuda_matches_cpu(d, {normal({4, 33, 64}), normal({256, 64}), normal({256})},
                               [](auto& in) { return linear_gelu(in[0], in[1], in[2]); });
        check_cuda_matches_cpu(d, {normal({130, 96}), normal({64, 96}), normal({64})},
                               [](auto& in) { return linear(in[0], in[1], in[2]); });
        // N = 20: no GELU epilogue (its aux's leading dimension), the kernels of our own instead.
        check_cuda_matches_cpu(d, {normal({5, 7, 24}), normal({20, 24}), normal({20})},
                               [](auto& in) { return linear_gelu(in[0], in[1], in[2]); });
        // Operands at an odd element offset: the heuristic is told each pointer's alignment.
        check_cuda_matches_cpu(d, {normal({41, 33}), normal({24, 33}), normal({24})}, [](auto& in) {
            return linear_gelu(in[0].narrow(0, 1, 40), in[1].narrow(0, 1, 16), in[2].narrow(0, 3, 16));
        });
    }
}

TEST_CASE("cuda: attention, embedding and cross-entropy match the cpu") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(3);
    for (DType d : kDtypes) {
        check_cuda_matches_cpu(d, {normal({2, 13, 96})}, [](auto& in) { return causal_self_attention(in[0], 4); });
        check_cuda_matches_cpu(d, {normal({1, 70, 192})}, [](auto& in) { return causal_self_attention(in[0], 2); });
        check_cuda_matches_cpu(d, {indices({3, 7}, 5), normal({50, 24})}, [](auto& in) { return embedding(in[0], in[1]); });
        check_cuda_matches_cpu(d, {normal({6, 5, 37}, 3.0), indices({6, 5}, 37)},
                               [](auto& in) { return cross_entropy(in[0], in[1]); });
        // The logit softcap of 15 (nanochat's) on logits of about +-30: most of them bent by tanh.
        check_cuda_matches_cpu(d, {normal({6, 5, 37}, 30.0), indices({6, 5}, 37)},
                               [](auto& in) { return cross_entropy(in[0], in[1], 15.0); });
    }
}

// Head sizes 64 and 128 (bf16: the tensor-core kernels), T below, at, just past and well past the
// 64-row tile, scores large enough that the softmax is far from uniform.
TEST_CASE("cuda: attention at head sizes 64 and 128 and every T, gradients included, match the cpu") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(5);
    for (DType d : kDtypes)
        for (int64_t hs : {64, 128})
            for (int64_t T : {1, 37, 64, 65, 200}) {
                CAPTURE(hs);
                CAPTURE(T);
                const int64_t nh = 2, B = T < 64 ? 3 : 2;
                check_cuda_matches_cpu(d, {normal({B, T, 3 * nh * hs}, 2.0)},
                                       [](auto& in) { return causal_self_attention(in[0], 2); });
            }
}

// cuDNN's fused attention against normtape's kernels, both ways round: each backend's forward
// with each backend's backward (so the row log-sum-exp one writes is the one the other reads),
// packed and grouped heads, head sizes 64 and 128, T odd, below, at and past a 64-row tile.
// Normwise bf16 tolerance (2^-7): both round the probabilities to bf16 before the product with v.
TEST_CASE("cuda: cuDNN's attention matches normtape's kernels, outputs and gradients, either direction") {
    REQUIRE_CUDA_OR_SKIP();
    if (!detail::cudnn_attention_built()) {
        MESSAGE("skipped: the library was built without cuDNN");
        return;
    }
    struct Restore {
        AttentionBackend before = attention_backend();
        ~Restore() { set_attention_backend(before); }
    } restore;
    manual_seed(9);
    const TensorOptions o = TensorOptions().dtype(DType::BF16).device(Device::CUDA);
    struct Shape4 {
        int64_t B, T, NH, NKV, hs;
    };
    int64_t item = 0;
    for (Shape4 sh : {Shape4{3, 1, 2, 2, 64}, {2, 37, 4, 4, 64}, {2, 64, 2, 2, 128}, {2, 65, 4, 2, 64},
                      {1, 200, 4, 1, 128}, {2, 513, 8, 2, 64}}) {
        if (!in_test_part(item++)) continue;
        CAPTURE(sh.B);
        CAPTURE(sh.T);
        CAPTURE(sh.NH);
        CAPTURE(sh.NKV);
        CAPTURE(sh.hs);
        const bool packed = sh.NH == sh.NKV;  // GPT-2's qkv, else separate q, k, v
        Tensor qkv = scale(randn({sh.B, sh.T, 3 * sh.NH * sh.hs}, o), 1.5);
        Tensor q = scale(randn({sh.B, sh.T, sh.NH, sh.hs}, o), 1.5);
        Tensor k = randn({sh.B, sh.T, sh.NKV, sh.hs}, o), v = randn({sh.B, sh.T, sh.NKV, sh.hs}, o);
        Tensor u = randn({sh.B, sh.T, sh.NH * sh.hs}, o);
        // out and the inputs' gradients with `forward` running the forward and `backward` the backward.
        auto run = [&](AttentionBackend forward, AttentionBackend backward) {
            set_attention_backend(forward);
            std::vector<Tensor> in = packed ? std::vector<Tensor>{qkv.detach().requires_grad_(true)}
                                            : std::vector<Tensor>{q.detach().requires_grad_(true),
                                                                  k.detach().requires_grad_(true),
                                                                  v.detach().requires_grad_(true)};
            Tensor out = packed ? causal_self_attention(in[0], sh.NH)
                                : causal_attention(in[0], in[1], in[2]).reshape({sh.B, sh.T, -1});
            set_attention_backend(backward);
            sum(mul(out, u)).backward();
            std::vector<Tensor> result{out.detach()};
            for (Tensor& t : in) result.push_back(t.grad());
            return result;
        };
        const auto kernels = AttentionBackend::Kernels, cudnn = AttentionBackend::Cudnn;
        const std::vector<Tensor> reference = run(kernels, kernels);
        for (auto [forward, backward] : {std::pair{cudnn, cudnn}, {cudnn, kernels}, {kernels, cudnn}}) {
            CAPTURE(attention_backend_name(forward));
            CAPTURE(attention_backend_name(backward));
            const std::vector<Tensor> got = run(forward, backward);
            for (size_t i = 0; i < got.size(); ++i) {
                CAPTURE(i);
                CHECK_NORMWISE(got[i], reference[i], normwise_tolerance(DType::BF16));
            }
        }
    }
}

TEST_CASE("cuda: layer_norm and rms_norm match the cpu in both policies over every shape class") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(4);
    // N below a warp, odd N, N = 3000, N large (f32 12288: the backward's rows split over a
    // thread-block cluster; 20000: past the fast kernels), M = 1
    const Shape shapes[] = {{5, 7}, {3, 33}, {4, 3000}, {3, 12288}, {2, 20000}, {1, 1024}, {2, 3, 768}};
    int64_t item = 0;
    for (DType d : kDtypes)
        for (SavePolicy p : {SavePolicy::Input, SavePolicy::Output})
            for (const Shape& s : shapes) {
                if (!in_test_part(item++)) continue;
                CAPTURE(policy_name(p));
                CAPTURE(shape_str(s));
                int64_t N = s.back();
                Input w{add(ones({N}), scale(randn({N}), 0.2)), true};
                check_cuda_matches_cpu(d, {normal(s, 2.0), w, normal({N}, 0.3)},
                                       [p](auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5, p); });
                check_cuda_matches_cpu(d, {normal(s, 2.0), w},
                                       [p](auto& in) { return rms_norm(in[0], in[1], 1e-5, p); });
                check_cuda_matches_cpu(d, {normal(s, 2.0)},
                                       [p](auto& in) { return layer_norm(in[0], Tensor(), Tensor(), 1e-5, p); });
            }
}

// This case calls the CUDA launchers directly, which a build without the CUDA backend lacks.
#if NORMTAPE_WITH_CUDA
TEST_CASE("cuda: the fast norm kernels match the reference kernels at every benchmark width") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(8);
    // M = 1031: a ragged last wave; M = 100003 at the small widths: every persistent block of the
    // backward walks many rows with several rows per block, so the per-block sums of dweight and
    // dbias are used, and a bf16 forward group takes several rows before its block retires.
    // N = 12288 and 16384 at M = 1 and 7: the f32 backward's rows split over a cluster of two
    // blocks, with clusters left without a row.
    const std::pair<int64_t, int64_t> shapes[] = {{768, 1031},   {1024, 1031}, {2048, 1031}, {3000, 1031},
                                                  {4096, 1031},  {8192, 1031}, {16384, 1031}, {768, 100003},
                                                  {1024, 100003}, {12288, 7},  {16384, 1}};
    int64_t item = 0;
    for (DType dtype : kDtypes)
        for (auto [N, M] : shapes)
            for (bool centered : {true, false})
                for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized}) {
                    if (!in_test_part(item++)) continue;
                    CAPTURE(dtype_name(dtype));
                    CAPTURE(N);
                    CAPTURE(centered);
                    CAPTURE(policy_name(policy));
                    CAPTURE(M);
                    TensorOptions o = TensorOptions().dtype(dtype).device(Device::CUDA);
                    TensorOptions so = o.dtype(DType::F32);
                    Tensor x = add(scale(randn({M, N}, o), 2.0), full({N}, 0.5, o)), dy = randn({M, N}, o);
                    Tensor w = add(ones({N}, o), scale(randn({N}, o), 0.2)), b = centered ? scale(randn({N}, o), 0.3) : Tensor();
                    const bool normalized = policy == SavePolicy::Normalized;
                    Tensor y[2], x_hat[2], mean[2], rstd[2], dx[2], dw[2], db[2];
                    auto run = [&](auto tag) {  // k = 0: the fast kernels, k = 1: the reference
                        using T = decltype(tag);
                        auto p = detail::device_ptr<T>;
                        auto f = detail::device_ptr<float>;
                        for (int k = 0; k < 2; ++k) {
                            y[k] = empty({M, N}, o), dx[k] = empty({M, N}, o), dw[k] = empty({N}, o);
                            x_hat[k] = normalized ? empty({M, N}, o) : Tensor();
                            db[k] = centered ? empty({N}, o) : Tensor();
                            mean[k] = centered ? empty({M}, so) : Tensor(), rstd[k] = empty({M}, so);
                            if (k == 0) {  // Normalized: x_hat and y in one kernel
                                detail::norm_forward_cuda<T>(p(y[k]), p(x_hat[k]), f(mean[k]), f(rstd[k]), p(x), nullptr,
                                                             nullptr, p(w), p(b), M, N, 1e-5, 0);
                            } else if (normalized) {  // x_hat, then y from it
                                detail::norm_forward_reference_cuda<T>(p(x_hat[k]), f(mean[k]), f(rstd[k]), p(x),
                                                                       nullptr, nullptr, M, N, 1e-5, 0);
                                detail::norm_affine_cuda<T>(p(y[k]), p(x_hat[k]), p(w), p(b), M, N, 0);
                            } else {
                                detail::norm_forward_reference_cuda<T>(p(y[k]), f(mean[k]), f(rstd[k]), p(x), p(w),
                                                                       p(b), M, N, 1e-5, 0);
                            }
                            const T* saved = policy == SavePolicy::Input ? p(x) : normalized ? p(x_hat[k]) : p(y[k]);
                            float* m = policy == SavePolicy::Input ? f(mean[k]) : nullptr;
                            if (k == 0)
                                detail::norm_backward_cuda<T>(p(dx[k]), p(dw[k]), p(db[k]), p(dy), nullptr, saved, m,
                                                              f(rstd[k]), p(w), p(b), centered, policy, M, N, 0);
                            else
                                detail::norm_backward_reference_cuda<T>(p(dx[k]), p(dw[k]), p(db[k]), p(dy), saved, m,
                                                                        f(rstd[k]), p(w), p(b), centered, policy, M, N, 0);
                        }
                    };
                    if (dtype == DType::F32) run(float{});
                    else run(bf16{});
                    double tol = normwise_tolerance(dtype);
                    CHECK_NORMWISE(y[0], y[1], tol);
                    if (normalized) {  // the fused kernel's y is the recipe's, bit for bit
                        CHECK_NORMWISE(x_hat[0], x_hat[1], tol);
                        CHECK_NORMWISE(y[0], detail::norm_affine(x_hat[0], w, b), 0.0);
                    }
                    CHECK_NORMWISE(rstd[0], rstd[1], 1e-5);
                    if (centered) CHECK_NORMWISE(mean[0], mean[1], 1e-5);
                    CHECK_NORMWISE(dx[0], dx[1], tol);
                    CHECK_NORMWISE(dw[0], dw[1], tol);
                    if (centered) CHECK_NORMWISE(db[0], db[1], tol);
                }
}
#endif  // NORMTAPE_WITH_CUDA

TEST_CASE("cuda: weights near zero under SavePolicy::Output follow the cpu's rule") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(5);
    for (double special : {0.0, 1e-6, 1e-3, -1e-3, -0.7}) {
        CAPTURE(special);
        Tensor w = add(ones({64}), scale(randn({64}), 0.1));
        w.data_ptr<float>()[5] = static_cast<float>(special);
        int64_t before = output_policy_fallbacks();
        check_cuda_matches_cpu(DType::F32, {normal({6, 64}), {w, true}, normal({64}, 0.3)},
                               [](auto& in) { return layer_norm(in[0], in[1], in[2], 1e-5, SavePolicy::Output); });
        // one forward on each device; both fall back below the threshold
        CHECK(output_policy_fallbacks() - before == (std::abs(special) < kOutputPolicyMinWeight ? 2 : 0));
    }
}

TEST_CASE("cuda: a GPT step on the GPU matches the same step on the cpu (f32, and bf16 against f32)") {
    REQUIRE_CUDA_OR_SKIP();
    for (NormKind norm : {NormKind::Layer, NormKind::RMS})
        for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized})
            for (DType dtype : {DType::F32, DType::BF16}) {
                CAPTURE(norm_kind_name(norm));
                CAPTURE(policy_name(policy));
                CAPTURE(dtype_name(dtype));
                GPTConfig c{.block_size = 32, .n_layer = 2, .n_head = 4, .n_embd = 64, .norm = norm, .policy = policy};
                manual_seed(6);
                GPT cpu_model(c);
                manual_seed(6);
                GPT gpu_model(c);
                gpu_model.to(Device::CUDA, dtype);
                std::vector<int64_t> ids(4 * 32);
                for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 131 + 7) % 256);
                Tensor idx = from_vector(ids, {4, 32}), targets = from_vector(std::vector<int64_t>(ids.rbegin(), ids.rend()), {4, 32});
                Tensor l_cpu = cpu_model.loss(idx, targets);
                Tensor l_gpu = gpu_model.loss(idx.to(Device::CUDA), targets.to(Device::CUDA));
                l_cpu.backward();
                l_gpu.backward();
                double tol = dtype == DType::BF16 ? 3e-2 : 1e-4;
                CHECK(std::abs(l_gpu.item<float>() - l_cpu.item<float>()) <= tol * std::abs(l_cpu.item<float>()) + 1e-3);
                NamedTensors pc = cpu_model.named_parameters(), pg = gpu_model.named_parameters();
                for (size_t i = 0; i < pc.size(); ++i) {
                    CAPTURE(pc[i].first);
                    CHECK_NORMWISE(pg[i].second.grad(), pc[i].second.grad(), 5 * tol);
                }
            }
}

}  // TEST_SUITE
