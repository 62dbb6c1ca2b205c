// tests/test_save_on_cpu.cpp: SaveOnCpu (core/save_on_cpu.h) and the pinned host memory behind it
// (allocate_pinned, core/allocator.h): a GPT's gradients bit-identical with and without it (cpu
// tensors kept as they are; CUDA ones moved to the host and back) under each norm and policy, what
// the report and the cpu counters see after a forward under it, retain_graph, one copy of a storage
// saved twice, views, prefetching in and out of order, the version check, bad arguments.
#include <optional>

#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

GPTConfig offload_config(DType dtype, Device device, NormKind norm, SavePolicy policy) {
    GPTConfig c{.block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 32, .norm = norm, .policy = policy,
                .dtype = dtype, .device = device};
    return c;
}

// What one run gives: the loss, every parameter's gradient (as f64, which holds f32 and bf16
// exactly), and what the report and the cpu counters saw right after the forward.
struct Run {
    double loss = 0;
    std::vector<std::vector<double>> grads;
    SavedTensorsReport report;
    int64_t cpu_bytes_after_forward = 0;  // cpu allocated_bytes after the forward, less before it
    int64_t cpu_bytes_after_backward = 0;
};

// A fresh GPT(c) with the same weights, one forward (under SaveOnCpu if `offload`), then
// `backwards` backwards (all but the last with retain_graph), gradients accumulating.
Run run(const GPTConfig& c, bool offload, int backwards = 1) {
    manual_seed(17);
    GPT model(c);
    TokenBatch b = token_batch(c, 2, 12);
    Run r;
    const int64_t before = cpu_allocated();
    Tensor loss;
    {
        std::optional<SaveOnCpu> guard;
        if (offload) guard.emplace();
        loss = model.loss(b.idx, b.targets);
    }
    r.report = saved_tensors_report();
    r.cpu_bytes_after_forward = cpu_allocated() - before;
    for (int k = 0; k < backwards; ++k) loss.backward(Tensor(), /*retain_graph=*/k + 1 < backwards);
    r.loss = as_f64(loss.to(Device::CPU))[0];
    for (const Tensor& p : model.parameters()) r.grads.push_back(as_f64(p.grad().to(Device::CPU)));
    loss = Tensor();
    r.cpu_bytes_after_backward = cpu_allocated() - before;
    return r;
}

int64_t shared_entries(const SavedTensorsReport& r) {
    int64_t n = 0;
    for (const SavedTensorEntry& e : r.entries) n += e.shared() ? 1 : 0;
    return n;
}

// x -> h = 1.5 x -> linear(h, w) and gelu(h), both saving h, on `device`: with and without SaveOnCpu
// the same gradients; under it one saved entry (h, on the host), with two holders; the host copy
// counted once by the cpu allocator (CUDA) and gone after backward.
void check_saved_by_two_nodes(Device device) {
    manual_seed(3);
    const TensorOptions f32 = TensorOptions().device(device);
    Tensor x = randn({8, 4}, f32).requires_grad_(), w = randn({5, 4}, f32).requires_grad_();
    auto forward = [&] {
        Tensor h = scale(x, 1.5);                     // 8*4 f32, not a parameter
        return add(sum(linear(h, w)), sum(gelu(h)));  // linear and gelu both save h
    };
    Tensor plain = forward();
    plain.backward();
    std::vector<double> dx = as_f64(x.grad().to(Device::CPU)), dw = as_f64(w.grad().to(Device::CPU));
    x.zero_grad();
    w.zero_grad();
    const int64_t before = cpu_allocated();
    Tensor y;
    {
        SaveOnCpu guard;
        y = forward();
    }
    SavedTensorsReport r = saved_tensors_report();
    REQUIRE(r.entries.size() == 1);
    CHECK(r.entries[0].packed);
    CHECK(r.entries[0].shared());
    CHECK(r.entries[0].device == Device::CPU);
    CHECK(r.total_bytes == 8 * 4 * 4);
    if (device.is_cuda()) CHECK(cpu_allocated() - before == 8 * 4 * 4);  // the pinned copy, once
    y.backward();
    CHECK(as_f64(x.grad().to(Device::CPU)) == dx);
    CHECK(as_f64(w.grad().to(Device::CPU)) == dw);
    y = Tensor();
    CHECK(cpu_allocated() - before == (device.is_cuda() ? 0 : x.grad().nbytes() + w.grad().nbytes()));
}

}  // namespace

TEST_SUITE("save_on_cpu") {

TEST_CASE("SaveOnCpu: cpu tensors are kept as they are, gradients bit-identical (f64, f32, each policy)") {
    for (DType dtype : kFloatTypes)
        for (NormKind norm : {NormKind::Layer, NormKind::RMS})
            for (SavePolicy policy : kSavePolicies) {
                INFO(dtype_name(dtype), " ", norm_kind_name(norm), " policy ", static_cast<int>(policy));
                GPTConfig c = offload_config(dtype, Device::CPU, norm, policy);
                Run plain = run(c, false), offloaded = run(c, true);
                CHECK(offloaded.loss == plain.loss);
                CHECK(offloaded.grads == plain.grads);
                // Nothing was copied: the same storages are saved, and no byte more is allocated.
                CHECK(offloaded.report.total_bytes == plain.report.total_bytes);
                CHECK(offloaded.report.entries.size() == plain.report.entries.size());
                CHECK(offloaded.cpu_bytes_after_forward == plain.cpu_bytes_after_forward);
                CHECK(offloaded.cpu_bytes_after_backward == plain.cpu_bytes_after_backward);
            }
}

TEST_CASE("SaveOnCpu: a cpu tensor saved under it is the tensor itself") {
    Tensor x = leaf({4, 3});
    Tensor h = scale(x, 2.0);
    SaveOnCpu guard;
    SavedTensor s(h);
    CHECK(s.data().storage() == h.storage());
    Tensor u = s.unpack("test");
    CHECK(u.storage() == h.storage());
}

TEST_CASE("SaveOnCpu: prefetch < 0 throws") {
    CHECK_THROWS_KIND_WITH(SaveOnCpu(-1), Error, "SaveOnCpu", "prefetch >= 0", "-1");
    SaveOnCpu none(0);  // 0: no copy ahead of time
}

TEST_CASE("SaveOnCpu: pinned host memory is refused without a GPU") {
    if (cuda_is_available()) SKIP_TEST("a CUDA GPU is visible: pinned memory can be had here");
    CHECK_THROWS_KIND_WITH(allocate_pinned(64), DeviceError, "allocate_pinned");
    CHECK_THROWS_KIND_WITH(Storage(64, Device::CPU, /*pinned=*/true), DeviceError, "allocate_pinned");
    empty_cache(Device::CPU);  // nothing cached: does nothing
}

TEST_CASE("SaveOnCpu: pinned host memory is counted as cpu bytes, and cached by size") {
    REQUIRE_CUDA_OR_SKIP();
    const MemoryStats s0 = memory_stats(Device::CPU);
    {
        Storage a(1000, Device::CPU, /*pinned=*/true);
        CHECK(a.is_pinned());
        CHECK(a.data() != nullptr);
        CHECK(memory_stats(Device::CPU).allocated_bytes - s0.allocated_bytes == 1000);
        CHECK(memory_stats(Device::CPU).num_allocs - s0.num_allocs == 1);
    }
    CHECK(memory_stats(Device::CPU).allocated_bytes == s0.allocated_bytes);
    void* p = allocate_pinned(1000);  // the block just freed, from the cache
    CHECK(memory_stats(Device::CPU).allocated_bytes - s0.allocated_bytes == 1000);
    deallocate_pinned(p, 1000);
    CHECK(allocate_pinned(0) == nullptr);
    empty_cache(Device::CPU);
    CHECK(memory_stats(Device::CPU).allocated_bytes == s0.allocated_bytes);
    CHECK_THROWS_KIND_WITH(Storage(64, Device::CUDA, /*pinned=*/true), DeviceError, "pinned", "cuda");
}

TEST_CASE("SaveOnCpu: a bf16 GPT on CUDA, each norm and policy: nothing saved on the GPU, gradients bit-identical") {
    REQUIRE_CUDA_OR_SKIP();
    for (NormKind norm : {NormKind::Layer, NormKind::RMS})
        for (SavePolicy policy : kSavePolicies) {
            INFO(norm_kind_name(norm), " policy ", static_cast<int>(policy));
            GPTConfig c = offload_config(DType::BF16, Device::CUDA, norm, policy);
            Run plain = run(c, false), offloaded = run(c, true);
            CHECK(offloaded.loss == plain.loss);
            CHECK(offloaded.grads == plain.grads);
            // After the forward: every saved tensor but the parameters is a pinned host copy, counted
            // by the cpu allocator, one per storage, as many bytes as the GPU kept without it.
            const SavedTensorsReport& r = offloaded.report;
            CHECK(plain.report.bytes_on(Device::CUDA) == plain.report.total_bytes);
            CHECK(r.bytes_on(Device::CUDA) == 0);
            CHECK(r.bytes_on(Device::CPU) == r.total_bytes);
            CHECK(r.total_bytes == plain.report.total_bytes);
            CHECK(r.entries.size() == plain.report.entries.size());
            for (const SavedTensorEntry& e : r.entries) CHECK(e.packed);
            CHECK(offloaded.cpu_bytes_after_forward - plain.cpu_bytes_after_forward == r.total_bytes);
            // A storage saved by two nodes is still one entry, with both holders.
            CHECK(shared_entries(r) == shared_entries(plain.report));
            CHECK(offloaded.cpu_bytes_after_backward == plain.cpu_bytes_after_backward);
        }
}

TEST_CASE("SaveOnCpu: retain_graph, two backwards on CUDA accumulate what they do without it") {
    REQUIRE_CUDA_OR_SKIP();
    for (SavePolicy policy : kSavePolicies) {
        INFO("policy ", static_cast<int>(policy));
        GPTConfig c = offload_config(DType::BF16, Device::CUDA, NormKind::Layer, policy);
        Run plain = run(c, false, 2), offloaded = run(c, true, 2);
        CHECK(offloaded.grads == plain.grads);
        CHECK(offloaded.grads != run(c, true, 1).grads);  // the second backward did add
    }
}

TEST_CASE("SaveOnCpu: a storage saved by two nodes, on the cpu: one entry, kept as it is") {
    check_saved_by_two_nodes(Device::CPU);
}

TEST_CASE("SaveOnCpu: a storage saved by two nodes, on CUDA: copied once, and comes back to each") {
    REQUIRE_CUDA_OR_SKIP();
    check_saved_by_two_nodes(Device::CUDA);
}

TEST_CASE("SaveOnCpu: views, copies in and out of packing order, and each prefetch depth give the saved values") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(4);
    for (int64_t prefetch : {0, 1, 3, 8}) {
        INFO("prefetch ", prefetch);
        std::vector<Tensor> tensors;
        for (int k = 0; k < 10; ++k) {
            Tensor t = randn({6, 5 + k}, TensorOptions().device(Device::CUDA));
            if (k % 4 == 1) t = t.transpose(0, 1);   // not contiguous
            if (k % 4 == 2) t = t.narrow(0, 1, 4);   // contiguous, at an offset into its storage
            if (k % 4 == 3) t = t.narrow(1, 1, 3);   // neither
            if (k == 9) t = randn({6, 4}, TensorOptions().device(Device::CUDA).dtype(DType::BF16));
            tensors.push_back(t);
        }
        tensors.push_back(tensors[0]);  // saved twice: one host copy
        std::vector<SavedTensor> saved;
        {
            SaveOnCpu guard(prefetch);
            for (const Tensor& t : tensors) saved.emplace_back(t);
        }
        for (const SavedTensor& s : saved) CHECK(s.data().device() == Device::CPU);
        CHECK(saved.back().data().storage() == saved.front().data().storage());
        CHECK(saved[1].data().storage() != saved.front().data().storage());
        auto check_all = [&](bool reverse) {
            for (size_t n = 0; n < saved.size(); ++n) {
                size_t i = reverse ? saved.size() - 1 - n : n;
                Tensor u = saved[i].unpack("test");
                CHECK(u.device() == Device::CUDA);
                CHECK(u.shape() == tensors[i].shape());
                CHECK(u.dtype() == tensors[i].dtype());
                CHECK(as_f64(u.to(Device::CPU)) == as_f64(tensors[i].to(Device::CPU)));
            }
        };
        check_all(true);   // the backward's order: prefetched
        check_all(false);  // again, the other way: copied on demand
        check_all(true);
    }
}

TEST_CASE("SaveOnCpu: a tensor modified in place after it was saved is caught on CUDA") {
    REQUIRE_CUDA_OR_SKIP();
    manual_seed(5);
    Tensor x = randn({3, 8}, TensorOptions().device(Device::CUDA)).requires_grad_();
    Tensor h, y;
    {
        SaveOnCpu guard;
        h = scale(x, 1.0);  // non-leaf, saved by gelu: packed to the host
        y = sum(gelu(h));
    }
    CHECK(saved_tensors_report().bytes_on(Device::CUDA) == 0);
    {
        NoGradGuard no_grad;
        h.add_(ones({3, 8}, TensorOptions().device(Device::CUDA)));
    }
    CHECK_THROWS_KIND_WITH(y.backward(), Error, "modified by an in-place operation");
}

}  // TEST_SUITE
