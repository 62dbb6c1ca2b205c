// tests/test_errors.cpp: the bad inputs a user can give, op by op. Each must throw the kind of
// normtape::Error that names the fault (exactly that class, not merely a subclass of Error), with
// a message that names the op, what it expected and what it got; leave the cpu allocator's
// allocated bytes where they were; and leave the library usable. Also: absurd sizes, anomaly
// detection (core/anomaly.h, Note [Anomaly detection]). train_gpt's error exits: tests/test_cli.cpp.
#include <cmath>
#include <initializer_list>
#include <limits>
#include <source_location>
#include <string>
#include <vector>

#include "ops/checks.h"
#include "test_util.h"

namespace {

using namespace normtape;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A small valid computation: the library still works after a failure.
void check_still_usable() {
    Tensor a = from_vector<float>({1, 2, 3});
    CHECK(sum(mul(a, a)).item<float>() == 14.0f);  // 1 + 4 + 9
}

// fn() must throw exactly Kind (not a kind derived from it), with every one of `words` in its
// message; afterwards the cpu allocator holds the bytes it held before and a small op still works.
template <class Kind, class F>
void check_error(F&& fn, std::initializer_list<std::string> words,
                 std::source_location where = std::source_location::current()) {
    const int64_t before = memory_stats(Device::CPU).allocated_bytes;
    testing::check_throws<Kind>(fn, words, testing::KindMatch::Exactly, where);
    CHECK(memory_stats(Device::CPU).allocated_bytes == before);
    check_still_usable();
}

Tensor f32(std::initializer_list<float> v, const Shape& shape = {}) { return from_vector(std::vector<float>(v), shape); }
Tensor i64(std::initializer_list<int64_t> v, const Shape& shape = {}) {
    return from_vector(std::vector<int64_t>(v), shape);
}

}  // namespace

TEST_SUITE("errors") {

TEST_CASE("errors: the kinds are all normtape::Error, and AnomalyError is one of them") {
    CHECK_THROWS_AS(throw ShapeError("x"), Error);
    CHECK_THROWS_AS(throw DTypeError("x"), Error);
    CHECK_THROWS_AS(throw DeviceError("x"), Error);
    CHECK_THROWS_AS(throw OutOfMemoryError("x"), Error);
    CHECK_THROWS_AS(throw IOError("x"), Error);
    CHECK_THROWS_AS(throw FormatError("x"), Error);
    CHECK_THROWS_AS(throw AnomalyError("x"), Error);
    CHECK_THROWS_AS([] { NT_CHECK_AS(ShapeError, 1 + 1 == 3, "op: expected 3, got ", 1 + 1); }(), ShapeError);
    CHECK_THROWS_WITH([] { NT_CHECK(false, "op: expected ", 3, ", got ", 2); }(), "op: expected 3, got 2");
}

TEST_CASE("errors: factories refuse negative sizes, bad dtypes and sizes whose bytes or strides overflow") {
    check_error<ShapeError>([] { empty({2, -1}); }, {"empty", "expected sizes >= 0", "[2, -1]"});
    check_error<ShapeError>([] { zeros({-3}); }, {"zeros", "expected sizes >= 0", "[-3]"});
    check_error<ShapeError>([] { ones({-3}); }, {"ones", "[-3]"});
    check_error<ShapeError>([] { full({-3}, 1.0); }, {"full", "[-3]"});
    check_error<ShapeError>([] { randn({-3}); }, {"randn", "[-3]"});
    check_error<ShapeError>([] { arange(-1); }, {"arange", "expected end >= 0", "got -1"});
    check_error<ShapeError>([] { from_vector(std::vector<float>(5), {2, 3}); },
                            {"from_vector", "expected 6 values", "[2, 3]", "got 5"});
    check_error<DTypeError>([] { randn({2}, TensorOptions().dtype(DType::I64)); }, {"randn", "floating", "got i64"});
    check_error<DTypeError>([] { zeros({2}, TensorOptions().dtype(DType::I64).requires_grad(true)); },
                            {"zeros", "floating", "got i64"});
    // numel overflows int64
    int64_t big = int64_t(1) << 62;
    check_error<ShapeError>([&] { empty({big, big}); }, {"empty", "more elements than fit", "[4611686018427387904, 4611686018427387904]"});
    // numel fits, numel * 4 bytes does not
    check_error<ShapeError>([] { empty({int64_t(1) << 61}); }, {"empty", "numel * 4 bytes to fit in int64", "got an overflow"});
    check_error<ShapeError>([] { zeros({int64_t(1) << 31, int64_t(1) << 31, 4}, TensorOptions().dtype(DType::F64)); },
                            {"zeros", "numel * 8 bytes to fit in int64"});
    // no elements, but strides that overflow int64 (stride 0 of [0, 2^62, 2^62] is 2^124)
    check_error<ShapeError>([&] { empty({0, big, big}); },
                            {"empty", "strides that overflow int64", "[0, 4611686018427387904, 4611686018427387904]"});
    check_error<ShapeError>([] { zeros({int64_t(1) << 40, 0, int64_t(1) << 30}); }, {"zeros", "strides that overflow"});
    CHECK(empty({0, big, 1}).strides() == Shape{big, 1, 1});  // the largest stride that fits
}

TEST_CASE("errors: an allocation no host can satisfy throws OutOfMemoryError with the bytes, and leaks nothing") {
    // 2^58 f32 elements = 2^60 bytes (1 EiB): the byte count fits int64, no address space holds it.
    const int64_t n = int64_t(1) << 58;
    const std::string bytes = std::to_string(n * 4);
    check_error<OutOfMemoryError>([&] { empty({n}); }, {"empty", "out of memory", bytes + " bytes", "[" + std::to_string(n) + "]"});
    check_error<OutOfMemoryError>([&] { zeros({n / 2, 2}); }, {"zeros", "out of memory", bytes + " bytes"});
    check_error<OutOfMemoryError>([&] { randn({n}); }, {"randn", "out of memory", bytes});
    check_error<OutOfMemoryError>([&] { Linear(int64_t(1) << 29, int64_t(1) << 29); },
                                  {"randn", "out of memory", bytes, "[536870912, 536870912]"});
    // And then ordinary allocations still work and are counted.
    MemoryStats s0 = memory_stats(Device::CPU);
    {
        Tensor t = zeros({1024});
        CHECK(memory_stats(Device::CPU).allocated_bytes == s0.allocated_bytes + 4096);
    }
    CHECK(memory_stats(Device::CPU).allocated_bytes == s0.allocated_bytes);
}

TEST_CASE("errors: view, reshape, transpose, size, item, data_ptr, to and undefined tensors") {
    Tensor x = randn({2, 3});
    check_error<ShapeError>([&] { x.view({4, 2}); }, {"view", "expected a shape of 6 elements", "[2, 3]", "got [4, 2]"});
    check_error<ShapeError>([&] { x.reshape({4, -1}); }, {"reshape", "expected a shape of 6 elements", "got [4, -1]"});
    check_error<ShapeError>([&] { x.view({-1, -1}); }, {"view", "at most one dimension of -1", "[-1, -1]"});
    check_error<ShapeError>([&] { x.view({-2, 3}); }, {"view", "sizes >= 0 or -1", "[-2, 3]"});
    int64_t big = int64_t(1) << 62;
    check_error<ShapeError>([&] { x.view({big, big, 0}); }, {"view", "overflows", "6 elements"});
    check_error<ShapeError>([&] { empty({0}).view({0, big, big}); }, {"view", "strides that overflow int64"});
    check_error<ShapeError>([&] { empty({0}).reshape({0, big, big}); }, {"reshape", "strides that overflow"});
    check_error<ShapeError>([&] { x.transpose(0, 1).view({6}); }, {"view", "contiguous", "strides [1, 3]"});
    check_error<ShapeError>([&] { x.transpose(0, 2); }, {"transpose", "dimensions in [-2, 2)", "got (0, 2)"});
    check_error<ShapeError>([&] { x.size(2); }, {"Tensor::size", "[-2, 2)", "got 2"});
    check_error<ShapeError>([&] { x.item<float>(); }, {"Tensor::item", "one element", "[2, 3]"});
    check_error<DTypeError>([&] { x.data_ptr<double>(); }, {"Tensor::data_ptr", "f32", "f64"});
    check_error<DTypeError>([&] { x.to_vector<int64_t>(); }, {"Tensor::data_ptr", "f32", "i64"});
    check_error<Error>([] { f32({1, kNaN}).to(DType::I64); }, {"to", "value nan does not fit in i64", "expected a value in [-2^63, 2^63)"});
    check_error<Error>([] { Tensor().shape(); }, {"Tensor", "expected a defined tensor", "undefined"});
    check_error<Error>([] { Tensor().to(DType::F64); }, {"undefined"});
}

TEST_CASE("errors: in-place updates and requires_grad") {
    Tensor x = zeros({2, 3});
    check_error<ShapeError>([&] { x.add_(zeros({3, 2})); }, {"add_", "shape [2, 3]", "got [3, 2]"});
    check_error<DTypeError>([&] { x.add_(zeros({2, 3}, TensorOptions().dtype(DType::F64))); }, {"add_", "f32", "got f64"});
    check_error<ShapeError>([&] { x.copy_(zeros({6})); }, {"copy_", "[2, 3]", "got [6]"});
    check_error<DTypeError>([&] { x.copy_(zeros({2, 3}, TensorOptions().dtype(DType::BF16))); }, {"copy_", "f32", "got bf16"});
    check_error<ShapeError>([&] { x.transpose(0, 1).fill_(1.0); }, {"fill_", "contiguous", "[3, 2]"});
    Tensor ids = zeros({2}, TensorOptions().dtype(DType::I64));
    check_error<DTypeError>([&] { ids.mul_(2.0); }, {"mul_", "floating", "got i64"});
    check_error<Error>([&] { ids.fill_(1e30); }, {"fill_", "value 1e+30 does not fit in i64", "expected a value in"});
    check_error<DTypeError>([&] { ids.requires_grad_(true); }, {"requires_grad_", "floating", "got i64"});
    Tensor w = ones({3}).requires_grad_(true);
    check_error<Error>([&] { w.fill_(2.0); }, {"fill_", "does not require grad", "NoGradGuard"});
    Tensor y = mul(w, w);
    check_error<Error>([&] { y.requires_grad_(false); }, {"requires_grad_", "leaf", "MulBackward"});
}

TEST_CASE("errors: CUDA tensors without a GPU throw DeviceError, naming the op") {
    if (cuda_is_available()) SKIP_TEST("a CUDA GPU is visible (this case is about machines without one)");
    TensorOptions cuda = TensorOptions().device(Device::CUDA);
    check_error<DeviceError>([&] { empty({2}, cuda); }, {"empty", "cuda"});
    check_error<DeviceError>([&] { empty({0}, cuda); }, {"empty", "cuda"});
    check_error<DeviceError>([&] { zeros({2}, cuda); }, {"zeros", "cuda"});
    check_error<DeviceError>([&] { ones({2}, cuda); }, {"ones", "cuda"});
    check_error<DeviceError>([&] { full({2}, 1.0, cuda); }, {"full", "cuda"});
    check_error<DeviceError>([&] { randn({2}, cuda); }, {"randn", "cuda"});
    check_error<DeviceError>([&] { arange(3, cuda); }, {"arange", "cuda"});
    check_error<DeviceError>([&] { from_vector<float>({1, 2}, {}, cuda); }, {"from_vector", "cuda"});
    check_error<DeviceError>([] { ones({2}).to(Device::CUDA); }, {"to", "cuda"});
    check_error<DeviceError>([] { ones({2}).to(Device::cuda(1)); }, {"to", "cuda:1"});
    check_error<DeviceError>([&] { Linear(4, 4, true, cuda); }, {"cuda"});
    check_error<DeviceError>([&] { Embedding(4, 4, cuda); }, {"cuda"});
    NormOptions on_gpu;
    on_gpu.device = Device::CUDA;
    check_error<DeviceError>([&] { LayerNorm(4, on_gpu); }, {"cuda"});
    check_error<DeviceError>([&] { RMSNorm(4, on_gpu); }, {"cuda"});
    GPTConfig c{.device = Device::CUDA};
    check_error<DeviceError>([&] { GPT model(c); }, {"cuda"});
    check_error<DeviceError>([] { synchronize(Device::CUDA); }, {"cuda"});
    if (!cuda_is_built()) {
        check_error<DeviceError>([] { memory_stats(Device::CUDA); }, {"memory_stats", "expected device cpu", "got cuda"});
        check_error<DeviceError>([] { empty_cache(Device::CUDA); }, {"empty_cache", "CUDA backend"});
        check_error<DeviceError>([] { reset_peak_memory_stats(Device::CUDA); }, {"cuda"});
        check_error<DeviceError>([] { ones({2}).to(Device::CUDA); }, {"to", "expected device cpu", "got cuda", "CUDA backend"});
    }
}

TEST_CASE("errors: bf16 on a GPU below compute capability 8.0 is refused naming the op and the capability") {
    // The rule every op applies to a bf16 input on a GPU (check_floating_input); the GPU's
    // capability is given, so that the refusal is tested where no such GPU is.
    check_error<DTypeError>([] { detail::check_dtype_on_gpu("linear", "x", DType::BF16, Device::CUDA, 75); },
                            {"linear", "x", "compute capability 7.5", "8.0", "f32", "got bf16"});
    check_error<DTypeError>([] { detail::check_dtype_on_gpu("gelu", "x", DType::BF16, Device::cuda(1), 70); },
                            {"gelu", "cuda:1", "compute capability 7.0"});
    CHECK_NOTHROW(detail::check_dtype_on_gpu("linear", "x", DType::F32, Device::CUDA, 75));
    for (int cc : {80, 86, 89, 90, 120}) CHECK_NOTHROW(detail::check_dtype_on_gpu("linear", "x", DType::BF16, Device::CUDA, cc));
    check_error<DeviceError>([] { cuda_compute_capability(Device::CPU); }, {"cuda_compute_capability", "cpu"});
}

TEST_CASE("errors: mixed devices throw DeviceError naming both devices") {
    REQUIRE_CUDA_OR_SKIP();
    Tensor a = ones({2, 3}), g = ones({2, 3}, TensorOptions().device(Device::CUDA));
    check_error<DeviceError>([&] { add(a, g); }, {"add", "expected b on cpu", "got cuda"});
    check_error<DeviceError>([&] { mul(g, a); }, {"mul", "expected b on cuda", "got cpu"});
    check_error<DeviceError>([&] { matmul(a, ones({3, 2}, TensorOptions().device(Device::CUDA))); }, {"matmul", "got cuda"});
    check_error<DeviceError>([&] { layer_norm(a, ones({3}, TensorOptions().device(Device::CUDA)), Tensor()); },
                             {"layer_norm", "weight on cpu", "got cuda"});
    check_error<DeviceError>([&] { rms_norm(g, ones({3})); }, {"rms_norm", "weight on cuda", "got cpu"});
    check_error<DeviceError>([&] { cross_entropy(g, zeros({2}, TensorOptions().dtype(DType::I64))); },
                             {"cross_entropy", "targets on cuda", "got cpu"});
    check_error<DeviceError>([&] { embedding(zeros({2}, TensorOptions().dtype(DType::I64)), g); },
                             {"embedding", "ids on cuda", "got cpu"});
    check_error<DeviceError>([&] { Tensor(a).copy_(g); }, {"copy_", "src on cpu", "got cuda"});
    check_error<DeviceError>([&] { Tensor(a).add_(g); }, {"add_", "on cpu", "got cuda"});
    Tensor w = ones({3}, TensorOptions().device(Device::CUDA).requires_grad(true));
    check_error<DeviceError>([&] { sum(w).backward(ones({})); }, {"backward", "gradient on cuda", "got cpu"});
}

TEST_CASE("errors: elementwise ops: undefined, empty, non-floating, mixed dtypes, mismatched shapes") {
    Tensor a = randn({2, 3}), a64 = randn({2, 3}, TensorOptions().dtype(DType::F64));
    Tensor ids = zeros({2, 3}, TensorOptions().dtype(DType::I64)), none, empty04 = zeros({0, 4});
    check_error<Error>([&] { add(none, a); }, {"add", "expected a tensor a", "undefined"});
    check_error<Error>([&] { add(a, none); }, {"add", "expected a tensor b", "undefined"});
    check_error<ShapeError>([&] { add(empty04, empty04); }, {"add", "non-empty a", "got shape [0, 4]"});
    check_error<DTypeError>([&] { add(ids, a); }, {"add", "floating", "got i64"});
    check_error<DTypeError>([&] { add(a, a64); }, {"add", "b of dtype f32", "got f64"});
    check_error<ShapeError>([&] { add(a, randn({3, 2})); }, {"add", "b of shape [2, 3]", "got [3, 2]"});
    check_error<ShapeError>([&] { add(a, randn({2})); }, {"add", "suffix", "got [2]"});
    check_error<DTypeError>([&] { mul(a64, a); }, {"mul", "b of dtype f64", "got f32"});
    check_error<ShapeError>([&] { mul(a, randn({3})); }, {"mul", "b of shape [2, 3]", "got [3]"});
    check_error<ShapeError>([&] { mul(empty04, empty04); }, {"mul", "non-empty", "[0, 4]"});
    check_error<Error>([&] { scale(none, 2.0); }, {"scale", "undefined"});
    check_error<DTypeError>([&] { scale(ids, 2.0); }, {"scale", "floating", "got i64"});
    check_error<ShapeError>([&] { gelu(empty04); }, {"gelu", "non-empty x", "[0, 4]"});
    check_error<DTypeError>([&] { gelu(ids); }, {"gelu", "floating", "got i64"});
    check_error<ShapeError>([&] { sum(empty04); }, {"sum", "non-empty x", "[0, 4]"});
    check_error<DTypeError>([&] { mean(ids); }, {"mean", "floating", "got i64"});
    check_error<Error>([&] { mean(none); }, {"mean", "undefined"});
}

TEST_CASE("errors: matmul and linear") {
    Tensor a = randn({2, 3}), s = randn({});
    check_error<ShapeError>([&] { matmul(a, randn({4, 2})); }, {"matmul", "b of shape [3, N]", "[2, 3]", "got [4, 2]"});
    check_error<ShapeError>([&] { matmul(a, randn({3})); }, {"matmul", "[3, N]", "got [3]"});
    check_error<ShapeError>([&] { matmul(s, randn({1, 1})); }, {"matmul", "[..., K]", "scalar"});
    check_error<DTypeError>([&] { matmul(a, randn({3, 2}, TensorOptions().dtype(DType::F64))); }, {"matmul", "f32", "got f64"});
    check_error<DTypeError>([&] { matmul(zeros({2, 3}, TensorOptions().dtype(DType::I64)), randn({3, 2})); },
                            {"matmul", "floating", "got i64"});
    check_error<ShapeError>([&] { linear(a, randn({4, 2})); }, {"linear", "weight of shape [N, 3]", "got [4, 2]"});
    check_error<ShapeError>([&] { linear(a, randn({4, 3}), randn({3})); }, {"linear", "bias of shape [4]", "got [3]"});
    check_error<DTypeError>([&] { linear(a, randn({4, 3}), randn({4}, TensorOptions().dtype(DType::F64))); },
                            {"linear", "bias of dtype f32", "got f64"});
    check_error<ShapeError>([&] { linear(zeros({0, 3}), randn({4, 3})); }, {"linear", "non-empty x", "[0, 3]"});
    check_error<ShapeError>([&] { Linear(0, 3); }, {"Linear", "positive", "got 0 and 3"});
    check_error<DTypeError>([&] { Linear(2, 3, true, TensorOptions().dtype(DType::I64)); }, {"Linear", "floating", "got i64"});
    Linear layer(3, 4);
    check_error<ShapeError>([&] { layer.forward(randn({2, 5})); }, {"linear", "[N, 5]", "got [4, 3]"});
}

TEST_CASE("errors: causal_self_attention") {
    check_error<ShapeError>([] { causal_self_attention(randn({2, 6}), 1); }, {"causal_self_attention", "[B, T, 3C]", "got [2, 6]"});
    check_error<ShapeError>([] { causal_self_attention(randn({1, 2, 7}), 1); }, {"causal_self_attention", "3C", "got shape [1, 2, 7]"});
    check_error<ShapeError>([] { causal_self_attention(randn({1, 2, 12}), 3); },
                            {"causal_self_attention", "divisible by n_head = 3", "[1, 2, 12]"});
    check_error<Error>([] { causal_self_attention(randn({1, 2, 6}), 0); }, {"causal_self_attention", "n_head >= 1", "got 0"});
    check_error<ShapeError>([] { causal_self_attention(zeros({1, 0, 6}), 1); }, {"causal_self_attention", "non-empty", "[1, 0, 6]"});
    check_error<DTypeError>([] { causal_self_attention(zeros({1, 2, 6}, TensorOptions().dtype(DType::I64)), 1); },
                            {"causal_self_attention", "floating", "i64"});
}

TEST_CASE("errors: embedding and cross_entropy, including out-of-range ids") {
    Tensor table = randn({5, 4});
    check_error<Error>([&] { embedding(i64({0, 5, 1}), table); }, {"embedding", "ids in [0, 5)", "got 5", "flat position 1"});
    check_error<Error>([&] { embedding(i64({-1}), table); }, {"embedding", "ids in [0, 5)", "got -1"});
    check_error<DTypeError>([&] { embedding(f32({0, 1}), table); }, {"embedding", "ids of dtype i64", "got f32"});
    check_error<ShapeError>([&] { embedding(i64({0}), randn({5})); }, {"embedding", "[V, C]", "got [5]"});
    check_error<DTypeError>([&] { embedding(i64({0}), zeros({5, 4}, TensorOptions().dtype(DType::I64))); },
                            {"embedding", "floating", "got i64"});
    check_error<ShapeError>([&] { embedding(zeros({0}, TensorOptions().dtype(DType::I64)), table); },
                            {"embedding", "non-empty ids", "[0]"});
    check_error<ShapeError>([] { Embedding(0, 4); }, {"Embedding", "positive", "got 0 and 4"});
    Tensor logits = randn({2, 4});
    check_error<ShapeError>([&] { cross_entropy(logits, i64({0, 1, 2})); }, {"cross_entropy", "targets of shape [2]", "got [3]"});
    check_error<Error>([&] { cross_entropy(logits, i64({0, 7})); }, {"cross_entropy", "targets in [0, 4)", "got 7"});
    check_error<DTypeError>([&] { cross_entropy(logits, f32({0, 1})); }, {"cross_entropy", "targets of dtype i64", "got f32"});
    check_error<DTypeError>([&] { cross_entropy(zeros({2, 4}, TensorOptions().dtype(DType::I64)), i64({0, 1})); },
                            {"cross_entropy", "floating", "got i64"});
    check_error<ShapeError>([&] { cross_entropy(randn({}), i64({0})); }, {"cross_entropy", "[..., V]", "scalar"});
    check_error<Error>([&] { cross_entropy(Tensor(), i64({0})); }, {"cross_entropy", "undefined"});
}

TEST_CASE("errors: layer_norm and rms_norm, and their modules") {
    Tensor x = randn({2, 4}), w = ones({4}), b = zeros({4});
    check_error<ShapeError>([&] { layer_norm(x, ones({3}), b); }, {"layer_norm", "weight of shape [4]", "normalized_shape", "got [3]"});
    check_error<ShapeError>([&] { layer_norm(x, w, zeros({4, 1})); }, {"layer_norm", "bias of shape [4]", "got [4, 1]"});
    check_error<DTypeError>([&] { layer_norm(x, ones({4}, TensorOptions().dtype(DType::F64)), b); },
                            {"layer_norm", "weight of dtype f32", "got f64"});
    check_error<Error>([&] { layer_norm(x, w, b, -1.0); }, {"layer_norm", "eps > 0", "got -1"});
    check_error<Error>([&] { layer_norm(x, w, b, std::nan("")); }, {"layer_norm", "eps > 0", "got nan"});
    check_error<ShapeError>([&] { layer_norm(randn({}), Tensor(), Tensor()); }, {"layer_norm", "[..., N]", "scalar"});
    check_error<ShapeError>([&] { layer_norm(zeros({0, 4}), w, b); }, {"layer_norm", "non-empty x", "[0, 4]"});
    check_error<DTypeError>([&] { layer_norm(zeros({2, 4}, TensorOptions().dtype(DType::I64)), w, b); },
                            {"layer_norm", "floating", "got i64"});
    check_error<Error>([&] { layer_norm(Tensor(), w, b); }, {"layer_norm", "undefined"});
    check_error<ShapeError>([&] { rms_norm(x, ones({5})); }, {"rms_norm", "weight of shape [4]", "normalized_shape", "got [5]"});
    check_error<DTypeError>([&] { rms_norm(x, ones({4}, TensorOptions().dtype(DType::BF16))); },
                            {"rms_norm", "weight of dtype f32", "got bf16"});
    check_error<Error>([&] { rms_norm(x, w, 0.0); }, {"rms_norm", "eps > 0", "got 0"});
    check_error<ShapeError>([] { LayerNorm(0); }, {"LayerNorm", "normalized_shape > 0", "got 0"});
    check_error<ShapeError>([] { RMSNorm(-2); }, {"RMSNorm", "normalized_shape > 0", "got -2"});
    NormOptions ints;
    ints.dtype = DType::I64;
    check_error<DTypeError>([&] { LayerNorm(4, ints); }, {"LayerNorm", "floating", "got i64"});
    LayerNorm ln(4);
    check_error<ShapeError>([&] { ln.forward(randn({2, 3})); }, {"layer_norm", "normalized_shape", "got [4]"});
}

TEST_CASE("errors: GPT configuration and input") {
    GPTConfig c{.vocab_size = 16, .block_size = 4, .n_layer = 1, .n_head = 2, .n_embd = 8};
    GPTConfig bad = c;
    bad.n_head = 3;
    check_error<ShapeError>([&] { GPT{bad}; }, {"GPTConfig", "divisible by n_head", "got n_embd 8 and n_head 3"});
    bad = c;
    bad.vocab_size = 0;
    check_error<ShapeError>([&] { GPT{bad}; }, {"GPTConfig", "positive sizes", "vocab_size 0"});
    bad = c;
    bad.dtype = DType::I64;
    check_error<DTypeError>([&] { GPT{bad}; }, {"GPTConfig", "floating", "got i64"});
    bad = c;
    bad.norm_eps = 0.0;
    check_error<Error>([&] { GPT{bad}; }, {"GPTConfig", "norm_eps > 0", "got 0"});
    GPT model(c);
    check_error<DTypeError>([&] { model.forward(zeros({2, 4})); }, {"GPT", "[B, T] i64", "got [2, 4] f32"});
    check_error<ShapeError>([&] { model.forward(i64({1, 2})); }, {"GPT", "[B, T] i64", "got [2] i64"});
    check_error<ShapeError>([&] { model.forward(zeros({1, 5}, TensorOptions().dtype(DType::I64))); },
                            {"GPT", "block_size = 4", "got 5"});
    check_error<Error>([&] { model.forward(i64({1, 16}, {1, 2})); }, {"embedding", "ids in [0, 16)", "got 16"});
    check_error<Error>([&] { model.forward(Tensor()); }, {"GPT", "undefined"});
    check_error<ShapeError>([&] { model.loss(i64({1, 2}, {1, 2}), i64({1, 2, 3}, {1, 3})); },
                            {"cross_entropy", "targets of shape [1, 2]", "got [1, 3]"});
}

TEST_CASE("errors: AdamW, clip_grad_norm_ and Module::to") {
    Tensor p = ones({3}).requires_grad_(true);
    AdamWOptions o;
    o.lr = -1;
    check_error<Error>([&] { AdamW({p}, o); }, {"AdamW", "lr >= 0", "got lr -1"});
    o = AdamWOptions();
    o.beta1 = 1.0;
    check_error<Error>([&] { AdamW({p}, o); }, {"AdamW", "betas in [0, 1)", "betas (1, "});
    check_error<Error>([&] { AdamW({ones({3})}, AdamWOptions()); }, {"AdamW", "require grad", "got one that does not"});
    check_error<Error>([&] { AdamW({mul(p, p)}, AdamWOptions()); }, {"AdamW", "leaf", "got a non-leaf"});
    check_error<Error>([&] { clip_grad_norm_({p}, 0.0); }, {"clip_grad_norm_", "max_norm > 0", "got 0"});
    Linear layer(2, 2);
    check_error<DTypeError>([&] { layer.to(Device::CPU, DType::I64); }, {"Module::to", "floating", "got i64"});
    AdamW opt(layer.parameters(), AdamWOptions());
    layer.to(Device::CPU, DType::F64);  // after the optimizer: its f32 state no longer fits
    sum(layer.forward(randn({1, 2}, TensorOptions().dtype(DType::F64)))).backward();
    check_error<DTypeError>([&] { opt.step(); }, {"AdamW", "dtype", "got f64", "after Module::to"});
    check_error<Error>([&] { opt.set_lr(-0.5); }, {"set_lr", "lr >= 0", "-0.5"});
    // A step that throws on its second parameter group has changed nothing in the first.
    Linear first(2, 2), second(2, 2);
    std::vector<Tensor> both = first.parameters();
    for (const Tensor& t : second.parameters()) both.push_back(t);
    AdamW two(both, AdamWOptions());
    second.to(Device::CPU, DType::F64);
    sum(first.forward(randn({1, 2}))).backward();
    sum(second.forward(randn({1, 2}, TensorOptions().dtype(DType::F64)))).backward();
    std::vector<float> before = first.weight.to_vector<float>();
    check_error<DTypeError>([&] { two.step(); }, {"AdamW", "got f64"});
    CHECK(first.weight.to_vector<float>() == before);
    CHECK(two.step_count() == 0);
}

TEST_CASE("errors: AdamW refuses every option that is not finite or out of range, in the constructor, a group and set_lr") {
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    Tensor p = ones({3}).requires_grad_(true);
    struct Bad {
        double AdamWOptions::*option;
        double value;
        std::string words;
    };
    for (const Bad& bad : {Bad{&AdamWOptions::lr, inf, "lr >= 0 and finite, got lr inf"},
                           Bad{&AdamWOptions::lr, nan, "lr >= 0 and finite, got lr nan"},
                           Bad{&AdamWOptions::lr, -1.0, "lr >= 0 and finite, got lr -1"},
                           Bad{&AdamWOptions::beta1, -0.1, "betas in [0, 1), got betas (-0.1, 0.999)"},
                           Bad{&AdamWOptions::beta2, 1.0, "betas in [0, 1), got betas (0.9, 1)"},
                           Bad{&AdamWOptions::beta2, nan, "betas in [0, 1), got betas (0.9, nan)"},
                           Bad{&AdamWOptions::eps, 0.0, "eps > 0 and finite, got eps 0"},
                           Bad{&AdamWOptions::eps, inf, "eps > 0 and finite, got eps inf"},
                           Bad{&AdamWOptions::weight_decay, nan, "weight_decay >= 0 and finite, got weight_decay nan"},
                           Bad{&AdamWOptions::weight_decay, -0.1, "weight_decay >= 0 and finite, got weight_decay -0.1"},
                           Bad{&AdamWOptions::weight_decay, inf, "weight_decay >= 0 and finite, got weight_decay inf"}}) {
        AdamWOptions o;
        o.*bad.option = bad.value;
        check_error<Error>([&] { AdamW({p}, o); }, {"AdamW: expected", bad.words});
    }
    // A group's own weight_decay, by the same rule, naming the group.
    for (double wd : {nan, -1.0, inf})
        check_error<Error>([&] { AdamW(std::vector<ParamGroup>{{{p}, 0.0}, {{}, wd}}, AdamWOptions()); },
                           {"AdamW: expected", "group 1", "weight_decay >= 0 and finite, got weight_decay"});
    // set_lr, by the same rule as the constructor; the lr is left as it was.
    AdamW opt({p}, AdamWOptions());
    for (double lr : {inf, nan, -0.5}) check_error<Error>([&] { opt.set_lr(lr); }, {"AdamW::set_lr: expected", "lr >= 0 and finite, got lr"});
    CHECK(opt.lr() == AdamWOptions().lr);
    // The edges PyTorch allows are allowed: lr 0, betas 0, weight_decay 0.
    AdamWOptions edge;
    edge.lr = 0.0;
    edge.beta1 = 0.0;
    edge.beta2 = 0.0;
    edge.weight_decay = 0.0;
    CHECK_NOTHROW(AdamW({p}, edge));
}

TEST_CASE("errors: autograd misuse") {
    Tensor w = f32({1, 2, 3}).requires_grad_(true);
    check_error<Error>([] { sum(f32({1, 2})).backward(); }, {"backward", "requires grad", "does not"});
    check_error<ShapeError>([&] { mul(w, w).backward(); }, {"backward", "one-element", "[3]"});
    check_error<ShapeError>([&] { mul(w, w).backward(ones({2})); }, {"backward", "gradient of shape [3]", "got [2]"});
    check_error<DTypeError>([&] { mul(w, w).backward(ones({3}, TensorOptions().dtype(DType::F64))); },
                            {"backward", "dtype f32", "got f64"});
    Tensor y = sum(mul(w, w));
    y.backward();
    check_error<Error>([&] { y.backward(); }, {"Backward", "second time", "retain_graph"});
    Tensor x = f32({1, 2}).requires_grad_(true);
    check_error<Error>(
        [&] {
            Tensor saved = f32({3, 4});
            Tensor z = sum(mul(x, saved));  // MulBackward saves `saved` at version 0
            {
                NoGradGuard no_grad;
                saved.add_(saved);
            }
            z.backward();
        },
        {"MulBackward", "in-place", "expected version 0", "got version 1"});
}

TEST_CASE("errors: anomaly detection is off by default and DetectAnomalyGuard restores the previous state") {
    CHECK_FALSE(is_anomaly_enabled());
    {
        DetectAnomalyGuard on;
        CHECK(is_anomaly_enabled());
        {
            DetectAnomalyGuard off(false);
            CHECK_FALSE(is_anomaly_enabled());
        }
        CHECK(is_anomaly_enabled());
    }
    CHECK_FALSE(is_anomaly_enabled());
    set_detect_anomaly(true);
    CHECK(is_anomaly_enabled());
    set_detect_anomaly(false);
    CHECK_FALSE(is_anomaly_enabled());
}

TEST_CASE("errors: a NaN fed to layer_norm under DetectAnomalyGuard names layer_norm and the input") {
    Tensor x = f32({1, 2, kNaN, 4, 5, 6, 7, 8}, {2, 4});
    Tensor w = ones({4}).requires_grad_(true), b = zeros({4}).requires_grad_(true);
    // Without the guard the NaN passes silently: row 0 of y is all NaN (its mean is), row 1 finite.
    Tensor y = layer_norm(x, w, b);
    std::vector<float> v = y.to_vector<float>();
    for (int j = 0; j < 4; ++j) CHECK(std::isnan(v[j]));
    for (int j = 4; j < 8; ++j) CHECK(std::isfinite(v[j]));
    DetectAnomalyGuard guard;
    check_error<AnomalyError>([&] { layer_norm(x, w, b); },
                              {"layer_norm", "anomaly in forward", "output y [2, 4] f32", "found 4 non-finite",
                               "first at flat index 0", "already in its input x (1, the first at flat index 2)"});
    check_error<AnomalyError>([&] { rms_norm(x, w, 1e-5, SavePolicy::Output); }, {"rms_norm", "output y", "input x"});
    // Finite inputs raise nothing, and give what they give without the guard.
    Tensor ok = f32({1, 2, 3, 4}, {1, 4});
    Tensor with_guard = layer_norm(ok, w, b);
    DetectAnomalyGuard off(false);
    CHECK(layer_norm(ok, w, b).to_vector<float>() == with_guard.to_vector<float>());
}

TEST_CASE("errors: an op that makes Inf from finite inputs is named as its producer") {
    DetectAnomalyGuard guard;
    Tensor x = f32({1, 1e30f, 2});
    check_error<AnomalyError>([&] { scale(x, 1e30); },
                              {"scale", "anomaly in forward", "found 1 non-finite", "first at flat index 1 (inf)",
                               "inputs were finite, so scale produced them"});
    check_error<AnomalyError>([&] { sum(f32({3e38f, 3e38f})); }, {"sum", "found 1 non-finite", "sum produced them"});
    check_error<AnomalyError>([&] { mul(x, f32({1, -1e30f, 1})); }, {"mul", "(-inf)", "mul produced them"});
    // an Inf in a leaf reaches the first op that reads it
    check_error<AnomalyError>([&] { gelu(f32({0, kInf})); }, {"gelu", "already in its input x"});
}

TEST_CASE("errors: a backward node that makes Inf from a finite grad_output is named") {
    // Forward is finite: prod = a * 1e30 = [1e10, 2e10], loss = sum(prod * 1e10) = 3e20.
    // Backward: ScaleBackward gives 1e10 (finite); MulBackward gives da = 1e10 * 1e30 = inf in f32.
    Tensor a = f32({1e-20f, 2e-20f}).requires_grad_(true);
    Tensor big = f32({1e30f, 1e30f});
    auto loss_of = [&] { return sum(scale(mul(a, big), 1e10)); };
    {
        Tensor loss = loss_of();
        CHECK(std::isfinite(loss.item<float>()));
        loss.backward();  // without the guard: no error, and the gradient is silently inf
        std::vector<float> g = a.grad().to_vector<float>();
        CHECK(std::isinf(g[0]));
        CHECK(std::isinf(g[1]));
        a.zero_grad();
    }
    DetectAnomalyGuard guard;
    check_error<AnomalyError>([&] { loss_of().backward(); },
                              {"MulBackward", "anomaly in backward", "gradient for input 0 [2] f32", "found 2 non-finite",
                               "first at flat index 0 (inf)", "grad_output was finite, so MulBackward produced them"});
    CHECK_FALSE(a.grad().defined());  // the failing backward accumulated nothing into the leaf
    // A finite graph runs to the end under the guard.
    Tensor c = f32({1, 2}).requires_grad_(true);
    sum(mul(c, c)).backward();
    CHECK(c.grad().to_vector<float>() == std::vector<float>{2, 4});
}

TEST_CASE("errors: a NaN injected into one GPT parameter is reported at the first op that reads it") {
    GPTConfig c{.vocab_size = 16, .block_size = 4, .n_layer = 2, .n_head = 2, .n_embd = 8};
    manual_seed(3);
    GPT model(c);
    Tensor idx = i64({1, 2, 3, 4}, {1, 4}), targets = i64({2, 3, 4, 5}, {1, 4});
    {
        NoGradGuard no_grad;
        model.h[1]->mlp->c_fc->weight.data_ptr<float>()[5] = kNaN;
    }
    CHECK(std::isnan(model.loss(idx, targets).item<float>()));  // without the guard: a NaN loss, no error
    DetectAnomalyGuard guard;
    // Everything before block 1's MLP is finite: linear (c_fc) is the first op to see the NaN.
    check_error<AnomalyError>([&] { model.loss(idx, targets); },
                              {"linear", "anomaly in forward", "output out [1, 4, 32]", "already in its input weight"});
}

}  // TEST_SUITE
