// tests/test_tensor.cpp: Tensor and its storage: factories, shapes, views and copies, dtype
// conversion, element access and its errors, printing, the generator, the CPU allocator's
// counters, in-place updates and their version counter, and the missing CUDA backend.
// Not here: the engine (test_autograd.cpp) and the ops (test_elementwise.cpp, test_reduce.cpp,
// test_matmul.cpp, test_attention.cpp, test_embedding.cpp, test_cross_entropy.cpp).
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

std::string printed(const Tensor& t) {
    std::ostringstream ss;
    ss << t;
    return ss.str();
}

}  // namespace

TEST_SUITE("tensor") {
    TEST_CASE("tensor: factories: dtype, device, requires_grad, values") {
        Tensor e = empty({2, 3});
        CHECK(e.shape() == Shape{2, 3});
        CHECK(e.strides() == Shape{3, 1});
        CHECK(e.dtype() == DType::F32);
        CHECK(e.device() == Device::CPU);
        CHECK_FALSE(e.requires_grad());
        CHECK(e.is_leaf());
        CHECK(e.is_contiguous());

        CHECK(zeros({2, 2}).to_vector<float>() == std::vector<float>{0, 0, 0, 0});
        CHECK(ones({3}, opts(DType::F64)).to_vector<double>() == std::vector<double>{1, 1, 1});
        CHECK(full({2}, 2.5, opts(DType::F64)).to_vector<double>() == std::vector<double>{2.5, 2.5});
        CHECK(full({2}, -7, opts(DType::I64)).to_vector<int64_t>() == std::vector<int64_t>{-7, -7});
        CHECK(zeros({2}, opts(DType::I64)).dtype() == DType::I64);

        Tensor g = ones({2}, TensorOptions().dtype(DType::F64).requires_grad(true));
        CHECK(g.requires_grad());
        CHECK(g.is_leaf());
        CHECK(g.dtype() == DType::F64);
        CHECK(full({2}, 1.0, TensorOptions().requires_grad(true)).requires_grad());
        CHECK(randn({4}, TensorOptions().dtype(DType::F64).requires_grad(true)).requires_grad());
        CHECK(randn({4}).dtype() == DType::F32);

        Tensor r = arange(5);
        CHECK(r.dtype() == DType::I64);
        CHECK(r.shape() == Shape{5});
        CHECK(r.to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4});
        CHECK(arange(3, opts(DType::F64)).to_vector<double>() == std::vector<double>{0, 1, 2});
        CHECK(arange(0).numel() == 0);

        Tensor v = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
        CHECK(v.dtype() == DType::F64);
        CHECK(v.shape() == Shape{2, 3});
        CHECK(v.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
        CHECK(from_vector<float>({1.5f, -2.0f}).shape() == Shape{2});
        CHECK(from_vector<float>({1.5f, -2.0f}).dtype() == DType::F32);
        CHECK(from_vector<int64_t>({7, 8}).dtype() == DType::I64);
        CHECK(from_vector<double>({1, 2}, {}, TensorOptions().requires_grad(true)).requires_grad());
    }

    TEST_CASE("tensor: factories: bad input") {
        CHECK_THROWS_KIND_WITH(from_vector<double>({1, 2, 3}, {2, 2}), normtape::Error, "from_vector", "[2, 2]");
        CHECK_THROWS_AS(empty({2, -1}), normtape::Error);
        CHECK_THROWS_AS(zeros({-3}), normtape::Error);
        CHECK_THROWS_AS(full({-1, 2}, 1.0), normtape::Error);
        CHECK_THROWS_KIND_WITH(randn({2}, opts(DType::I64)), normtape::Error, "randn");
        CHECK_THROWS_KIND_WITH(arange(-1), normtape::Error, "arange");
        CHECK_THROWS_AS(empty({2}, opts(DType::I64).requires_grad(true)), normtape::Error);
        CHECK_THROWS_AS(from_vector<int64_t>({1, 2}, {}, TensorOptions().requires_grad(true)), normtape::Error);
    }

    TEST_CASE("tensor: factories refuse an i64 tensor that requires grad, as empty() and requires_grad_() do") {
        TensorOptions o = opts(DType::I64).requires_grad(true);
        CHECK_THROWS_AS(zeros({2}, o), normtape::Error);
        CHECK_THROWS_AS(ones({2}, o), normtape::Error);
        CHECK_THROWS_AS(full({2}, 3.0, o), normtape::Error);
    }

    TEST_CASE("tensor: shape, numel, dim, size") {
        Tensor t = zeros({2, 3, 4});
        CHECK(t.numel() == 24);
        CHECK(t.dim() == 3);
        CHECK(t.nbytes() == 24 * 4);
        CHECK(t.size(0) == 2);
        CHECK(t.size(2) == 4);
        CHECK(t.size(-1) == 4);
        CHECK(t.size(-2) == 3);
        CHECK(t.size(-3) == 2);
        CHECK_THROWS_KIND_WITH(t.size(3), normtape::Error, "size", "[2, 3, 4]");
        CHECK_THROWS_AS(t.size(-4), normtape::Error);

        Tensor s = zeros({});
        CHECK(s.dim() == 0);
        CHECK(s.numel() == 1);
        CHECK_THROWS_AS(s.size(0), normtape::Error);

        Tensor z = zeros({0, 4});
        CHECK(z.numel() == 0);
        CHECK(z.dim() == 2);
        CHECK(z.size(1) == 4);
        CHECK(zeros({3}, opts(DType::F64)).nbytes() == 24);
        CHECK_FALSE(Tensor().defined());
    }

    TEST_CASE("tensor: view and reshape") {
        Tensor t = arange(24, opts(DType::F64)).view({2, 3, 4});
        CHECK(t.shape() == Shape{2, 3, 4});
        CHECK(t.view({6, 4}).shape() == Shape{6, 4});
        CHECK(t.view({-1, 4}).shape() == Shape{6, 4});
        CHECK(t.view({2, -1}).shape() == Shape{2, 12});
        CHECK(t.view({-1}).shape() == Shape{24});
        CHECK(t.reshape({4, -1}).shape() == Shape{4, 6});
        // Same storage, row-major order kept.
        Tensor v = t.view({4, 6});
        CHECK(v.storage() == t.storage());
        CHECK(v.to_vector<double>() == t.to_vector<double>());
        CHECK(t.reshape({24}).storage() == t.storage());
        CHECK(zeros({0, 4}).view({-1, 2}).shape() == Shape{0, 2});

        CHECK_THROWS_KIND_WITH(t.view({5, 5}), normtape::Error, "view", "[5, 5]");
        CHECK_THROWS_KIND_WITH(t.view({-1, -1}), normtape::Error, "view");
        CHECK_THROWS_KIND_WITH(t.view({-1, 5}), normtape::Error, "view");
        CHECK_THROWS_KIND_WITH(t.view({-2, -12}), normtape::Error, "view");
        CHECK_THROWS_AS(t.reshape({7, -1}), normtape::Error);

        // A transposed tensor cannot be viewed; reshape copies it instead.
        Tensor m = arange(6, opts(DType::F64)).view({2, 3});
        Tensor mt = m.transpose(0, 1);
        CHECK_THROWS_KIND_WITH(mt.view({6}), normtape::Error, "view");
        Tensor r = mt.reshape({6});
        CHECK(r.is_contiguous());
        CHECK(r.storage() != m.storage());
        CHECK(r.to_vector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
        CHECK(mt.reshape({2, 3}).to_vector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
    }

    TEST_CASE("tensor: transpose, is_contiguous, contiguous") {
        Tensor m = arange(6, opts(DType::F64)).view({2, 3});  // [[0, 1, 2], [3, 4, 5]]
        Tensor mt = m.transpose(0, 1);
        CHECK(mt.shape() == Shape{3, 2});
        CHECK(mt.strides() == Shape{1, 3});
        CHECK_FALSE(mt.is_contiguous());
        CHECK(mt.storage() == m.storage());
        CHECK(m.transpose(-1, -2).shape() == Shape{3, 2});
        CHECK(mt.transpose(0, 1).is_contiguous());
        CHECK_THROWS_KIND_WITH(m.transpose(0, 2), normtape::Error, "transpose");
        CHECK_THROWS_AS(m.transpose(-3, 0), normtape::Error);

        Tensor c = mt.contiguous();
        CHECK(c.is_contiguous());
        CHECK(c.storage() != m.storage());
        CHECK(c.shape() == Shape{3, 2});
        std::vector<double> vm = m.to_vector<double>(), vc = c.to_vector<double>();
        for (int64_t i = 0; i < 3; ++i)
            for (int64_t j = 0; j < 2; ++j) CHECK(vc[i * 2 + j] == vm[j * 3 + i]);
        // contiguous() of a contiguous tensor is the tensor itself; clone() always copies.
        CHECK(m.contiguous().storage() == m.storage());
        Tensor k = m.clone();
        CHECK(k.storage() != m.storage());
        CHECK(k.to_vector<double>() == vm);

        // 3-D: swap the outer two dims.
        Tensor t = arange(24, opts(DType::F64)).view({2, 3, 4});
        Tensor tt = t.transpose(0, 2).contiguous();  // [4, 3, 2]
        std::vector<double> vt = tt.to_vector<double>();
        bool all_match = true;
        for (int64_t a = 0; a < 4; ++a)
            for (int64_t b = 0; b < 3; ++b)
                for (int64_t d = 0; d < 2; ++d) all_match = all_match && vt[(a * 3 + b) * 2 + d] == (d * 3 + b) * 4 + a;
        CHECK(all_match);
    }

    TEST_CASE("tensor: to_vector on a transposed tensor is in row-major order of the view") {
        Tensor m = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
        CHECK(m.transpose(0, 1).to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});
        CHECK_THROWS_AS(m.to_vector<double>(), normtape::Error);
    }

    TEST_CASE("tensor: detach shares storage and drops requires_grad") {
        Tensor x = ones({3}, TensorOptions().dtype(DType::F64).requires_grad(true));
        Tensor d = x.detach();
        CHECK(d.storage() == x.storage());
        CHECK_FALSE(d.requires_grad());
    }

    TEST_CASE("tensor: to(DType) converts and copies") {
        Tensor f = from_vector<float>({1.5f, -2.25f, 3.0f});
        Tensor d = f.to(DType::F64);
        CHECK(d.dtype() == DType::F64);
        CHECK(d.to_vector<double>() == std::vector<double>{1.5, -2.25, 3.0});
        CHECK(d.storage() != f.storage());

        // f64 -> i64 truncates toward zero, as a C++ cast.
        Tensor i = from_vector<double>({2.7, -2.7, 0.0, 5.0}).to(DType::I64);
        CHECK(i.dtype() == DType::I64);
        CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{2, -2, 0, 5});
        CHECK(arange(3).to(DType::F32).to_vector<float>() == std::vector<float>{0, 1, 2});

        // Same dtype: still a copy.
        Tensor same = f.to(DType::F32);
        CHECK(same.storage() != f.storage());
        CHECK(same.to_vector<float>() == f.to_vector<float>());

        // From a transposed tensor: contiguous, values in the view's order.
        Tensor m = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);
        Tensor mf = m.to(DType::F32);
        CHECK(mf.is_contiguous());
        CHECK(mf.shape() == Shape{3, 2});
        CHECK(mf.to_vector<float>() == std::vector<float>{1, 4, 2, 5, 3, 6});

        // Not differentiable.
        Tensor g = ones({2}, TensorOptions().dtype(DType::F64).requires_grad(true));
        CHECK_FALSE(g.to(DType::F32).requires_grad());
    }

    TEST_CASE("tensor: item<T>") {
        CHECK(full({}, 3.5, opts(DType::F64)).item<double>() == 3.5);
        CHECK(full({1, 1}, -2.0).item<float>() == -2.0f);
        CHECK(full({1}, 9, opts(DType::I64)).item<int64_t>() == 9);
        CHECK_THROWS_KIND_WITH(zeros({2}).item<float>(), normtape::Error, "item", "[2]");
        CHECK_THROWS_AS(zeros({0}).item<float>(), normtape::Error);
        CHECK(full({}, 0.1).item<double>() == static_cast<double>(0.1f));  // converts, as libtorch's item<T>
        CHECK(full({}, 7, opts(DType::I64)).item<float>() == 7.0f);
        CHECK(full({}, 1.7, opts(DType::BF16)).item<float>() == static_cast<float>(bf16(1.7f)));
    }

    TEST_CASE("tensor: item<T> converting NaN to i64 names the conversion") {
        CHECK_THROWS_KIND_WITH(full({}, std::nan("")).item<int64_t>(), normtape::Error, "does not fit in i64");
    }

    TEST_CASE("tensor: data_ptr<T> checks the dtype") {
        Tensor f = zeros({3});
        CHECK(f.data_ptr<float>() != nullptr);
        CHECK_THROWS_KIND_WITH(f.data_ptr<double>(), normtape::Error, "data_ptr", "f64", "f32");
        CHECK_THROWS_AS(f.data_ptr<int64_t>(), normtape::Error);
        CHECK_THROWS_AS(zeros({3}, opts(DType::I64)).data_ptr<float>(), normtape::Error);
        // A transposed view points at the same first element.
        Tensor m = from_vector<double>({1, 2, 3, 4}, {2, 2});
        CHECK(m.transpose(0, 1).data_ptr<double>() == m.data_ptr<double>());
    }

    TEST_CASE("tensor: operator<< prints values, shape and dtype") {
        Tensor t = from_vector<float>({1.5f, -2.25f, 3, 4, 5, 6}, {2, 3});
        std::string s = printed(t);
        CHECK(s.find("shape=[2, 3]") != std::string::npos);
        CHECK(s.find("dtype=f32") != std::string::npos);
        CHECK(s.find("-2.25") != std::string::npos);
        CHECK(s.find("1.5") != std::string::npos);
        CHECK(printed(zeros({4}, opts(DType::F64))).find("dtype=f64") != std::string::npos);
        CHECK(printed(arange(3)).find("dtype=i64") != std::string::npos);
        CHECK(printed(ones({2}, TensorOptions().requires_grad(true))).find("requires_grad") != std::string::npos);
        // The shape of a transposed tensor is the view's.
        CHECK(printed(t.transpose(0, 1)).find("shape=[3, 2]") != std::string::npos);
        // A large tensor is abbreviated: not every value is printed.
        std::string big = printed(arange(1000));
        CHECK(big.find("500") == std::string::npos);
        CHECK(big.find("999") != std::string::npos);
        CHECK_NOTHROW(printed(Tensor()));
        CHECK_NOTHROW(printed(zeros({0, 4})));
    }

    TEST_CASE("tensor: manual_seed makes randn reproducible") {
        manual_seed(1234);
        std::vector<double> a = randn({100}, opts(DType::F64)).to_vector<double>();
        manual_seed(1234);
        std::vector<double> b = randn({100}, opts(DType::F64)).to_vector<double>();
        CHECK(a == b);
        manual_seed(1235);
        std::vector<double> c = randn({100}, opts(DType::F64)).to_vector<double>();
        CHECK(a != c);
        // Successive draws differ.
        manual_seed(1234);
        randn({100}, opts(DType::F64));
        CHECK(randn({100}, opts(DType::F64)).to_vector<double>() != a);
    }

    TEST_CASE("tensor: randn: mean about 0, std about 1 over 10^5 samples") {
        manual_seed(7);
        const int64_t n = 100000;
        for (DType dt : {DType::F64, DType::F32}) {
            INFO("dtype ", std::string(dtype_name(dt)));
            std::vector<double> v = as_f64(randn({n}, opts(dt)));
            double m = 0.0;
            for (double x : v) m += x;
            m /= n;
            double var = 0.0;
            for (double x : v) var += (x - m) * (x - m);
            double sd = std::sqrt(var / (n - 1));
            // The standard error of the mean is 1/sqrt(n) = 0.003; of the std about 0.002.
            CHECK(std::abs(m) < 0.015);
            CHECK(std::abs(sd - 1.0) < 0.015);
            // Not all the same value, and tails present.
            int64_t beyond2 = 0;
            for (double x : v) beyond2 += std::abs(x) > 2.0;
            // P(|z| > 2) = 0.0455.
            CHECK(beyond2 > n * 0.040);
            CHECK(beyond2 < n * 0.051);
        }
    }

    TEST_CASE("tensor: allocator: allocated_bytes rises by numel * element_size and falls back") {
        int64_t before = cpu_allocated();
        int64_t allocs = memory_stats(Device::CPU).num_allocs;
        {
            Tensor a = empty({3, 5});
            CHECK(cpu_allocated() == before + 3 * 5 * 4);
            Tensor b = zeros({7}, opts(DType::F64));
            CHECK(cpu_allocated() == before + 60 + 56);
            Tensor c = arange(9);
            CHECK(cpu_allocated() == before + 60 + 56 + 72);
            CHECK(memory_stats(Device::CPU).num_allocs == allocs + 3);
            // A tensor of zero elements takes no bytes.
            Tensor z = zeros({0, 4});
            CHECK(cpu_allocated() == before + 60 + 56 + 72);
            b = Tensor();
            CHECK(cpu_allocated() == before + 60 + 72);
        }
        CHECK(cpu_allocated() == before);
        // A copied handle keeps the storage alive; the bytes go when the last handle goes.
        {
            Tensor a = ones({10});
            Tensor* b = new Tensor(a);
            a = Tensor();
            CHECK(cpu_allocated() == before + 40);
            delete b;
            CHECK(cpu_allocated() == before);
        }
    }

    TEST_CASE("tensor: allocator: peak_allocated_bytes and reset_peak_memory_stats") {
        reset_peak_memory_stats(Device::CPU);
        int64_t before = cpu_allocated();
        CHECK(memory_stats(Device::CPU).peak_allocated_bytes == before);
        {
            Tensor a = zeros({1000});  // 4000 bytes
            Tensor b = zeros({500});   // 2000 bytes
        }
        CHECK(cpu_allocated() == before);
        CHECK(memory_stats(Device::CPU).peak_allocated_bytes == before + 6000);
        { Tensor c = zeros({10}); }
        CHECK(memory_stats(Device::CPU).peak_allocated_bytes == before + 6000);  // the peak stays
        reset_peak_memory_stats(Device::CPU);
        CHECK(memory_stats(Device::CPU).peak_allocated_bytes == before);
        Tensor keep = zeros({25});
        reset_peak_memory_stats(Device::CPU);
        CHECK(memory_stats(Device::CPU).peak_allocated_bytes == before + 100);
    }

    TEST_CASE("tensor: views share storage: no new bytes") {
        Tensor t = zeros({4, 6});
        int64_t before = cpu_allocated();
        Tensor v = t.view({24});
        Tensor r = t.reshape({2, 12});
        Tensor tr = t.transpose(0, 1);
        Tensor d = t.detach();
        Tensor h = t;  // a handle copy
        CHECK(cpu_allocated() == before);
        CHECK(v.storage() == t.storage());
        CHECK(r.storage() == t.storage());
        CHECK(tr.storage() == t.storage());
        CHECK(d.storage() == t.storage());
        // A write through a view is seen by the base.
        v.data_ptr<float>()[7] = 5.0f;
        CHECK(t.to_vector<float>()[7] == 5.0f);
        CHECK(tr.to_vector<float>()[1 * 4 + 1] == 5.0f);  // t[1][1] is tr[1][1]
        // The copies do allocate.
        Tensor c = tr.contiguous();
        CHECK(cpu_allocated() == before + 96);
    }

    TEST_CASE("tensor: in-place add_, mul_, fill_, copy_: values and version") {
        Tensor a = from_vector<double>({1, 2, 3, 4}, {2, 2});
        Tensor b = from_vector<double>({10, 20, 30, 40}, {2, 2});
        uint64_t v0 = a.storage()->version();

        a.add_(b);
        CHECK(a.to_vector<double>() == std::vector<double>{11, 22, 33, 44});
        CHECK(a.storage()->version() == v0 + 1);
        a.add_(b, -0.5);
        CHECK(a.to_vector<double>() == std::vector<double>{6, 12, 18, 24});
        CHECK(a.storage()->version() == v0 + 2);
        a.mul_(0.5);
        CHECK(a.to_vector<double>() == std::vector<double>{3, 6, 9, 12});
        CHECK(a.storage()->version() == v0 + 3);
        a.fill_(-1.5);
        CHECK(a.to_vector<double>() == std::vector<double>{-1.5, -1.5, -1.5, -1.5});
        CHECK(a.storage()->version() == v0 + 4);
        a.zero_();
        CHECK(a.to_vector<double>() == std::vector<double>{0, 0, 0, 0});
        CHECK(a.storage()->version() == v0 + 5);
        a.copy_(b.transpose(0, 1));  // a strided source
        CHECK(a.to_vector<double>() == std::vector<double>{10, 30, 20, 40});
        CHECK(a.storage()->version() == v0 + 6);
        // b was only read.
        CHECK(b.to_vector<double>() == std::vector<double>{10, 20, 30, 40});

        // The version belongs to the storage: a write through a view is seen from the base.
        Tensor view = a.view({4});
        view.fill_(2.0);
        CHECK(a.storage()->version() == v0 + 7);
        CHECK(a.to_vector<double>() == std::vector<double>{2, 2, 2, 2});

        // fill_ works on i64 too.
        Tensor i = zeros({3}, opts(DType::I64));
        i.fill_(4);
        CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{4, 4, 4});
    }

    TEST_CASE("tensor: in-place: shape and dtype mismatches throw") {
        Tensor a = zeros({2, 2}, opts(DType::F64));
        CHECK_THROWS_KIND_WITH(a.add_(zeros({4}, opts(DType::F64))), normtape::Error, "add_");
        CHECK_THROWS_KIND_WITH(a.add_(zeros({2, 2})), normtape::Error, "add_");
        CHECK_THROWS_KIND_WITH(a.copy_(zeros({2, 3}, opts(DType::F64))), normtape::Error, "copy_", "[2, 3]");
        CHECK_THROWS_KIND_WITH(a.copy_(zeros({2, 2})), normtape::Error, "copy_");
        // A failed update leaves values and version alone.
        uint64_t v = a.storage()->version();
        CHECK_THROWS_AS(a.add_(zeros({3}, opts(DType::F64))), normtape::Error);
        CHECK(a.storage()->version() == v);
    }

    TEST_CASE("tensor: in-place on a tensor that requires grad throws unless under NoGradGuard") {
        Tensor x = ones({3}, TensorOptions().dtype(DType::F64).requires_grad(true));
        Tensor y = ones({3}, opts(DType::F64));
        CHECK_THROWS_KIND_WITH(x.add_(y), normtape::Error, "add_");
        CHECK_THROWS_KIND_WITH(x.mul_(2.0), normtape::Error, "mul_");
        CHECK_THROWS_KIND_WITH(x.fill_(2.0), normtape::Error, "fill_");
        CHECK_THROWS_KIND_WITH(x.copy_(y), normtape::Error, "copy_");
        CHECK(x.to_vector<double>() == std::vector<double>{1, 1, 1});
        {
            NoGradGuard no_grad;
            x.add_(y, 2.0);
            x.mul_(2.0);
            CHECK(x.to_vector<double>() == std::vector<double>{6, 6, 6});
            x.fill_(0.5);
            x.copy_(from_vector<double>({1, 2, 3}));
            CHECK(x.to_vector<double>() == std::vector<double>{1, 2, 3});
        }
        // Grad mode is back on after the guard.
        CHECK_THROWS_AS(x.mul_(2.0), normtape::Error);
        CHECK(x.requires_grad());
    }

    TEST_CASE("tensor: requires_grad_") {
        Tensor f = zeros({2});
        f.requires_grad_();
        CHECK(f.requires_grad());
        f.requires_grad_(false);
        CHECK_FALSE(f.requires_grad());
        Tensor i = arange(3);
        CHECK_THROWS_KIND_WITH(i.requires_grad_(), normtape::Error, "requires_grad_", "i64");
        CHECK_FALSE(i.requires_grad());
        // A non-leaf cannot change it.
        Tensor x = ones({2}, TensorOptions().dtype(DType::F64).requires_grad(true));
        Tensor y = x.transpose(0, 0);
        REQUIRE_FALSE(y.is_leaf());
        CHECK_THROWS_AS(y.requires_grad_(false), normtape::Error);
    }
}

TEST_SUITE("tensor") {

TEST_CASE("tensor: shapes whose bytes overflow are refused, not wrapped") {
    const int64_t big = int64_t(1) << 32;
    CHECK_THROWS_KIND_WITH(empty({big, big}), Error, "more elements than fit");
    CHECK_THROWS_KIND_WITH(zeros({(int64_t(1) << 61) - 1}, TensorOptions().dtype(DType::I64)), Error,
                           "more elements than fit");
    CHECK_THROWS_KIND_WITH(zeros({0}).view({big, big, 0, big}), Error, "view");
}

TEST_CASE("tensor: copy_ from an overlapping view copies the values it had") {
    Tensor x = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2});
    x.copy_(x.transpose(0, 1));
    CHECK(x.to_vector<double>() == std::vector<double>{1, 3, 2, 4});
}

TEST_CASE("tensor: converting NaN or huge floats to i64 throws") {
    Tensor x = from_vector(std::vector<double>{1.0, std::nan("")});
    CHECK_THROWS_KIND_WITH(x.to(DType::I64), Error, "does not fit in i64");
    CHECK_THROWS_KIND_WITH(zeros({2}, TensorOptions().dtype(DType::I64)).fill_(1e30), Error, "does not fit in i64");
}

}  // TEST_SUITE

TEST_SUITE("tensor") {

TEST_CASE("tensor: Event times the work between two records, and refuses what it cannot time") {
    Event start(Device::CPU), end(Device::CPU), never(Device::CPU);
    start.record();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    end.record();
    const double ms = Event::elapsed_ms(start, end);
    CHECK(ms >= 19.0);
    CHECK(ms < 2000.0);
    Event moved = std::move(end);
    CHECK(Event::elapsed_ms(start, moved) == ms);
    CHECK_THROWS_KIND_WITH(Event::elapsed_ms(start, never), Error, "Event::elapsed_ms", "never recorded");
    CHECK_THROWS_KIND_WITH(Event::elapsed_ms(never, start), Error, "Event::elapsed_ms", "never recorded");
    if (!cuda_is_built()) CHECK_THROWS_KIND_WITH(Event(Device::CUDA), DeviceError, "Event", "no CUDA backend");
    if (cuda_is_available()) {
        Event g0(Device::CUDA), g1(Device::CUDA);
        g0.record();
        Tensor x = randn({1 << 20}, TensorOptions().device(Device::CUDA));
        for (int i = 0; i < 10; ++i) x = gelu(x);
        g1.record();
        CHECK(Event::elapsed_ms(g0, g1) > 0.0);
        CHECK_THROWS_KIND_WITH(Event::elapsed_ms(g0, start), Error, "events of one device", "cuda and cpu");
    }
}

}  // TEST_SUITE
