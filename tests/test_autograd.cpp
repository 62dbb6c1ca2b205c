// tests/test_autograd.cpp: the engine's contract (core/autograd.h): accumulation, grad mode,
// release after backward, in-place detection, saved-tensor bookkeeping, no cycles, nodes of several
// outputs.
#include "test_util.h"

using namespace normtape;
using namespace normtape::testing;

namespace {

// A node of two outputs for the engine's tests: u = x * x and v = 3x from one x; dx = 2x du + 3 dv,
// each term only where its output got a gradient. Remembers which ones did, on its last run.
struct SquareAndTripleBackward : MultiOutputNode {
    SavedTensor x;
    bool got_du = false, got_dv = false;
    const char* name() const override { return "SquareAndTripleBackward"; }
    std::vector<SavedSlot> saved_tensors() override { return {{"x", &x}}; }
    std::vector<Tensor> apply_outputs(const std::vector<Tensor>& grad_outputs) override {
        const Tensor &du = grad_outputs[0], &dv = grad_outputs[1];
        got_du = du.defined();
        got_dv = dv.defined();
        Tensor dx;
        if (got_du) dx = mul(scale(x.unpack(name()), 2.0), du);
        if (got_dv) dx = dx.defined() ? add(dx, scale(dv, 3.0)) : scale(dv, 3.0);
        return {dx};
    }
};

// (u, v) of SquareAndTripleBackward; `node`, when given, receives the recorded node.
std::pair<Tensor, Tensor> square_and_triple(const Tensor& x,
                                            std::shared_ptr<SquareAndTripleBackward>* node = nullptr) {
    Tensor u, v;
    {
        NoGradGuard no_grad;
        u = mul(x, x);
        v = scale(x, 3.0);
    }
    if (should_record(x)) {
        auto n = std::make_shared<SquareAndTripleBackward>();
        n->x = SavedTensor(x);
        record_outputs(n, {&u, &v}, x);
        if (node) *node = n;
    }
    return {u, v};
}

// A node that returns `gradient` (its apply's result) and keeps it in `kept` when asked: y = x,
// dx = a fresh copy of g, whose storage the test can find again in x.grad().
struct HandOverBackward : Node {
    bool keep = false;
    Tensor kept;
    const void* returned = nullptr;
    const char* name() const override { return "HandOverBackward"; }
    std::vector<Tensor> apply(const Tensor& g) override {
        Tensor dx = g.clone();
        returned = dx.storage()->data();
        if (keep) kept = dx;
        return {dx};
    }
};
Tensor hand_over(const Tensor& x, const std::shared_ptr<HandOverBackward>& node) {
    Tensor y;
    {
        NoGradGuard no_grad;
        y = x.clone();
    }
    record(node, y, x);
    return y;
}

}  // namespace

TEST_SUITE("autograd") {

TEST_CASE("autograd: a leaf takes over its first gradient when the engine holds it alone, else copies it") {
    manual_seed(4);
    for (bool keep : {false, true}) {
        CAPTURE(keep);
        Tensor x = leaf({5});
        auto node = std::make_shared<HandOverBackward>();
        node->keep = keep;
        sum(hand_over(x, node)).backward();
        REQUIRE(x.grad().defined());
        // Taken over: the leaf's gradient is the node's tensor; kept by the node: a copy of its own.
        CHECK((x.grad().storage()->data() == node->returned) == !keep);
        CHECK_CLOSE(x.grad(), ones({5}, TensorOptions().dtype(DType::F64)), tolerance(DType::F64));
        if (keep) {  // += on the leaf's copy leaves the node's tensor alone
            sum(hand_over(x, std::make_shared<HandOverBackward>())).backward();
            CHECK_CLOSE(node->kept, ones({5}, TensorOptions().dtype(DType::F64)), tolerance(DType::F64));
            CHECK_CLOSE(x.grad(), full({5}, 2.0, TensorOptions().dtype(DType::F64)), tolerance(DType::F64));
        }
    }
    // add's backward passes one gradient to both leaves: each gets a copy of its own.
    Tensor a = leaf({4}), b = leaf({4});
    sum(add(a, b)).backward();
    CHECK(a.grad().storage() != b.grad().storage());
    a.grad().fill_(7.0);
    CHECK_CLOSE(b.grad(), ones({4}, TensorOptions().dtype(DType::F64)), tolerance(DType::F64));
}


TEST_CASE("autograd: a diamond graph sums the gradients of both paths") {
    manual_seed(1);
    Tensor x = leaf({4});
    // y = sum((2x) * (3x)) = sum(6 x^2), dy/dx = 12 x
    Tensor y = sum(mul(scale(x, 2.0), scale(x, 3.0)));
    y.backward();
    CHECK_CLOSE(x.grad(), scale(x.detach(), 12.0), tolerance(DType::F64));
}

TEST_CASE("autograd: leaf gradients accumulate across backward calls until zero_grad") {
    manual_seed(2);
    Tensor x = leaf({3});
    sum(scale(x, 5.0)).backward();
    sum(scale(x, 5.0)).backward();
    CHECK_CLOSE(x.grad(), full({3}, 10.0, TensorOptions().dtype(DType::F64)), tolerance(DType::F64));
    x.zero_grad();
    CHECK_FALSE(x.grad().defined());
    sum(scale(x, 5.0)).backward();
    CHECK_CLOSE(x.grad(), full({3}, 5.0, TensorOptions().dtype(DType::F64)), tolerance(DType::F64));
}

TEST_CASE("autograd: a post-accumulate-grad hook runs once per backward, after the leaf's last gradient") {
    manual_seed(3);
    Tensor x = leaf({3}), w = leaf({3}), unused = leaf({3});
    std::vector<std::vector<double>> seen;  // x.grad() as each call of the hook saw it
    int w_calls = 0, unused_calls = 0;
    const int64_t hx = x.register_post_accumulate_grad_hook([&](const Tensor& t) { seen.push_back(as_f64(t.grad())); });
    w.register_post_accumulate_grad_hook([&](const Tensor&) { ++w_calls; });
    unused.register_post_accumulate_grad_hook([&](const Tensor&) { ++unused_calls; });
    // x reaches the loss by three paths (two edges of mul, one of scale): the hook sees their sum,
    // 2 x w + 4 = d/dx (x^2 w + 4 x), once.
    Tensor loss = sum(add(mul(mul(x, x), w), scale(x, 4.0)));
    loss.backward();
    REQUIRE(seen.size() == 1);
    CHECK_CLOSE(x.grad(), add(scale(mul(x, w), 2.0), full({3}, 4.0, TensorOptions().dtype(DType::F64))).detach(),
                tolerance(DType::F64));
    CHECK(seen[0] == as_f64(x.grad()));
    CHECK(w_calls == 1);
    CHECK(unused_calls == 0);  // no path from the loss
    // Accumulating: the second backward's hook sees both gradients summed.
    sum(scale(x, 1.0)).backward();
    REQUIRE(seen.size() == 2);
    CHECK(seen[1] == as_f64(x.grad()));
    // A leaf as the root runs its hooks too; a removed hook does not run.
    x.remove_post_accumulate_grad_hook(hx);
    x.backward(ones({3}, TensorOptions().dtype(DType::F64)));
    CHECK(seen.size() == 2);
    int root_calls = 0;
    w.register_post_accumulate_grad_hook([&](const Tensor&) { ++root_calls; });
    w.backward(ones({3}, TensorOptions().dtype(DType::F64)));
    CHECK(root_calls == 1);
    CHECK(w_calls == 2);
    // What a hook throws comes out of backward().
    unused.register_post_accumulate_grad_hook([](const Tensor&) { throw Error("hook failed"); });
    CHECK_THROWS_KIND_WITH(sum(unused).backward(), Error, "hook failed");
    Tensor plain = zeros({3});
    CHECK_THROWS_KIND_WITH(plain.register_post_accumulate_grad_hook([](const Tensor&) {}), Error,
                           "register_post_accumulate_grad_hook", "requires grad");
    CHECK_THROWS_KIND_WITH(scale(x, 2.0).register_post_accumulate_grad_hook([](const Tensor&) {}), Error, "grad_fn");
}

TEST_CASE("autograd: NoGradGuard records nothing and restores grad mode") {
    Tensor x = leaf({2, 3});
    int64_t before = saved_bytes();
    {
        NoGradGuard guard;
        CHECK_FALSE(grad_mode_enabled());
        {
            NoGradGuard inner;
        }
        CHECK_FALSE(grad_mode_enabled());
        Tensor y = gelu(x);
        CHECK_FALSE(y.requires_grad());
        CHECK(y.grad_fn() == nullptr);
        CHECK(saved_bytes() == before);
    }
    CHECK(grad_mode_enabled());
    CHECK(gelu(x).grad_fn() != nullptr);
}

TEST_CASE("autograd: a second backward through released nodes throws and says why") {
    Tensor x = leaf({3});
    Tensor y = sum(gelu(x));
    y.backward();
    CHECK_THROWS_KIND_WITH(y.backward(), Error, "backward through the graph a second time");
    // Nodes with nothing saved are refused too.
    Tensor z = sum(scale(x, 2.0));
    z.backward();
    CHECK_THROWS_KIND_WITH(z.backward(), Error, "retain_graph=true");
}

TEST_CASE("autograd: retain_graph keeps saved tensors for a second backward") {
    Tensor x = leaf({3});
    Tensor y = sum(gelu(x));
    y.backward(Tensor(), /*retain_graph=*/true);
    Tensor first = x.grad().clone();
    y.backward();
    CHECK_CLOSE(x.grad(), scale(first, 2.0), tolerance(DType::F64));
}

TEST_CASE("autograd: backward releases saved tensors and returns their bytes to the allocator") {
    manual_seed(3);
    Tensor x = leaf({64, 32}), w = leaf({16, 32});
    int64_t baseline = memory_stats(Device::CPU).allocated_bytes;
    Tensor loss = sum(gelu(linear(x, w)));
    CHECK(saved_bytes() == 64 * 16 * 8);  // gelu saved linear's output; x and w are parameters
    CHECK(memory_stats(Device::CPU).allocated_bytes > baseline);
    loss.backward();
    CHECK(saved_bytes() == 0);
    int64_t grads = x.grad().nbytes() + w.grad().nbytes();
    int64_t loss_bytes = loss.nbytes();
    CHECK(memory_stats(Device::CPU).allocated_bytes == baseline + grads + loss_bytes);
    loss = Tensor();
    x.zero_grad();
    w.zero_grad();
    CHECK(memory_stats(Device::CPU).allocated_bytes == baseline);
}

TEST_CASE("autograd: a tensor modified in place after being saved is detected on backward") {
    Tensor x = leaf({3});
    Tensor h = scale(x, 1.0);  // non-leaf, saved by gelu
    Tensor y = sum(gelu(h));
    {
        NoGradGuard no_grad;
        h.add_(ones({3}, TensorOptions().dtype(DType::F64)));
    }
    CHECK_THROWS_KIND_WITH(y.backward(), Error, "modified by an in-place operation");
}

TEST_CASE("autograd: backward argument errors") {
    Tensor x = leaf({2, 2});
    CHECK_THROWS_KIND_WITH(gelu(x).backward(), Error, "one-element");
    CHECK_THROWS_KIND_WITH(gelu(x).backward(ones({3}, TensorOptions().dtype(DType::F64))), Error,
                           "expected a gradient of shape [2, 2]");
    Tensor c = ones({1});
    CHECK_THROWS_KIND_WITH(c.backward(), Error, "does not require grad");
}

TEST_CASE("autograd: saved_bytes counts a storage saved by several nodes once, and skips parameters") {
    manual_seed(4);
    Tensor x = leaf({8, 4}), w = leaf({4, 4});
    Tensor h = scale(x, 1.0);           // non-leaf activation, 8*4 f64
    Tensor a = linear(h, w);            // saves h (and w, a parameter)
    Tensor b = gelu(h);                 // saves h again
    CHECK(saved_bytes() == 8 * 4 * 8);  // h once; nobody saved a or b
    CHECK(a.defined());
    CHECK(b.defined());
}

TEST_CASE("autograd: saving an output makes no reference cycle") {
    std::weak_ptr<Node> node;
    std::weak_ptr<Storage> storage;
    {
        Tensor x = leaf({2, 4});
        Tensor y = layer_norm(x, Tensor(), Tensor(), 1e-5, SavePolicy::Output);
        node = y.grad_fn();
        storage = y.storage();
        CHECK_FALSE(node.expired());
    }
    CHECK(node.expired());
    CHECK(storage.expired());
}

TEST_CASE("autograd: a node holds no input it did not save") {
    // Note [A node holds no input it did not save]: y = layer_norm(h) under Output saves y, not
    // h; add saves nothing. Dropping the handle to h must free it while the graph lives on.
    for (SavePolicy policy : {SavePolicy::Input, SavePolicy::Output}) {
        Tensor x = leaf({4, 8});
        std::weak_ptr<Storage> h_storage;
        Tensor loss;
        {
            Tensor h = scale(x, 2.0);
            h_storage = h.storage();
            loss = sum(gelu(layer_norm(h, Tensor(), Tensor(), 1e-5, policy)));
        }
        CHECK(h_storage.expired() == (policy == SavePolicy::Output));
        loss.backward();
        CHECK(x.grad().defined());
    }
}

}  // TEST_SUITE

TEST_SUITE("autograd") {

TEST_CASE("autograd: view, reshape, transpose and clone pass gradients through (finite differences)") {
    manual_seed(9);
    auto f = [](const std::vector<Tensor>& in) {
        Tensor t = in[0].view({3, 4}).transpose(0, 1);  // non-contiguous [4, 3]
        return gelu(t.reshape({2, 6}).clone());
    };
    CHECK_GRADCHECK(f, (std::vector<Tensor>{leaf({12})}));
}

TEST_CASE("autograd: narrow is a view whose backward saves nothing (finite differences, every dim)") {
    manual_seed(10);
    for (int64_t dim : {0, 1, -1}) {
        CAPTURE(dim);
        auto f = [dim](const std::vector<Tensor>& in) { return gelu(in[0].narrow(dim, 1, 2)); };
        CHECK_GRADCHECK(f, (std::vector<Tensor>{leaf({3, 4, 5})}));
    }
    Tensor x = arange(24, TensorOptions().dtype(DType::F64)).view({2, 3, 4});
    Tensor n = x.narrow(1, 1, 2);
    CHECK(n.shape() == Shape{2, 2, 4});
    CHECK(n.to_vector<double>() == std::vector<double>{4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23});
    CHECK(x.narrow(0, 1, 1).is_contiguous());
    Tensor w = leaf({5, 3});
    int64_t before = saved_bytes();
    Tensor y = add(randn({2, 2, 3}, TensorOptions().dtype(DType::F64)), w.narrow(0, 0, 2));
    CHECK(saved_bytes() == before);
    sum(y).backward();
    CHECK(w.grad().to_vector<double>() == std::vector<double>{2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    CHECK_THROWS_KIND_WITH(x.narrow(3, 0, 1), normtape::ShapeError, "narrow", "dimension in [-3, 3)", "got 3");
    CHECK_THROWS_KIND_WITH(x.narrow(1, 2, 2), normtape::ShapeError, "narrow", "start + length <= 3", "start 2 and length 2");
    CHECK_THROWS_KIND_WITH(x.narrow(1, -1, 1), normtape::ShapeError, "narrow", "got start -1");
}

TEST_CASE("autograd: a parameter saved through a view is still not counted by saved_bytes") {
    Tensor w = leaf({16});
    Tensor x = leaf({2, 4});
    Tensor y = matmul(x, w.view({4, 4}));  // saves x and the view of w, both parameters' storages
    CHECK(saved_bytes() == 0);
    CHECK(y.defined());
}


// Note [Rematerialization] (core/autograd.h).
namespace {
// The SavedTensor of `node` that keeps a recipe (nullptr if none).
SavedTensor* recipe_slot(const std::shared_ptr<Node>& node) {
    for (SavedSlot s : node->saved_tensors())
        if (s.tensor->recipe()) return s.tensor;
    return nullptr;
}
std::vector<uint16_t> bits(const Tensor& t_any) {  // a bf16 tensor's raw bits, on any device
    Tensor t = t_any.to(Device::CPU);
    std::vector<uint16_t> out(t.numel());
    const bf16* p = t.data_ptr<bf16>();
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = p[i].bits;
    return out;
}
}  // namespace

namespace {
// Through layer_norm under Normalized, linear_gelu with recompute_output and a linear, on `device`.
void check_recipes_give_the_forwards_bits(Device device) {
    CAPTURE(device_name(device));
    manual_seed(21);
    TensorOptions o = TensorOptions().dtype(DType::BF16).device(device);
    Tensor x = scale(randn({6, 32}, o), 3.0).requires_grad_(true);
    Tensor w = scale(randn({32}, o), 0.5).requires_grad_(true), b = randn({32}, o).requires_grad_(true);
    Tensor w1 = randn({48, 32}, o).requires_grad_(true), b1 = randn({48}, o).requires_grad_(true);
    Tensor w2 = randn({16, 48}, o).requires_grad_(true);
    Tensor y = layer_norm(x, w, b, 1e-5, SavePolicy::Normalized);
    Tensor g = linear_gelu(y, w1, b1, /*recompute_output=*/true);
    Tensor out = linear(g, w2);
    SavedTensor* y_slot = recipe_slot(g.grad_fn());  // linear_gelu saved y: as its recipe
    SavedTensor* g_slot = recipe_slot(out.grad_fn());  // the last linear saved g: as its recipe
    REQUIRE(y_slot != nullptr);
    REQUIRE(g_slot != nullptr);
    CHECK(std::string(y_slot->recipe()->name) == "norm affine");
    CHECK(std::string(g_slot->recipe()->name) == "gelu");
    CHECK_FALSE(y_slot->holds_data());
    CHECK(bits(y_slot->unpack("test")) == bits(y));
    CHECK(bits(g_slot->unpack("test")) == bits(g));
    // What the recipes keep alive is counted, once: x_hat (6*32 bf16, shared with the norm's node),
    // the norm's rstd (6 f32) and linear_gelu's h (6*48 bf16), and nothing for y or g.
    CHECK(saved_bytes() == 6 * 32 * 2 + 6 * 4 + 6 * 48 * 2);
    // A second backward under retain_graph makes them again, to the same gradients.
    sum(out).backward(Tensor(), /*retain_graph=*/true);
    Tensor first = x.grad().clone();
    x.zero_grad();
    sum(out).backward();
    CHECK(bits(x.grad()) == bits(first));
}
}  // namespace

TEST_CASE("autograd: a saved tensor made again from its recipe has the forward's bits") {
    check_recipes_give_the_forwards_bits(Device::CPU);
    if (cuda_is_available()) check_recipes_give_the_forwards_bits(Device::CUDA);
}

TEST_CASE("autograd: a recipe's tensor modified in place is caught, before or after it is saved") {
    manual_seed(22);
    Tensor x = leaf({4, 8}), w = leaf({8}), b = leaf({8}), w1 = leaf({5, 8});
    {
        Tensor y = layer_norm(x, w, b, 1e-5, SavePolicy::Normalized);
        Tensor out = linear(y, w1);
        {
            NoGradGuard no_grad;
            y.add_(ones({4, 8}, TensorOptions().dtype(DType::F64)));  // after: unpack refuses, as for any saved tensor
        }
        CHECK_THROWS_KIND_WITH(sum(out).backward(), Error, "modified by an in-place operation");
    }
    {
        Tensor y = layer_norm(x, w, b, 1e-5, SavePolicy::Normalized);
        {
            NoGradGuard no_grad;
            y.add_(ones({4, 8}, TensorOptions().dtype(DType::F64)));  // before: the recipe no longer holds
        }
        Tensor out = linear(y, w1);
        CHECK(recipe_slot(out.grad_fn()) == nullptr);
        sum(out).backward();  // the data was saved, and y is what the linear saw
        CHECK(w1.grad().defined());
    }
}

TEST_CASE("autograd: a node of several outputs gets each output's gradient, undefined where none came") {
    manual_seed(11);
    Tensor x = leaf({5});
    std::shared_ptr<SquareAndTripleBackward> node;
    auto [u, v] = square_and_triple(x, &node);
    REQUIRE(node);
    CHECK(u.grad_fn() == v.grad_fn());
    CHECK(node->num_outputs() == 2);
    CHECK(u.impl().output_nr == 0);
    CHECK(v.impl().output_nr == 1);
    sum(u).backward(/*gradient=*/Tensor(), /*retain_graph=*/true);
    CHECK(node->got_du);
    CHECK_FALSE(node->got_dv);
    CHECK_CLOSE(x.grad(), scale(x.detach(), 2.0), tolerance(DType::F64));
    x.zero_grad();
    sum(v).backward(Tensor(), true);  // output 1 alone: output 0's gradient stays undefined
    CHECK_FALSE(node->got_du);
    CHECK(node->got_dv);
    CHECK_CLOSE(x.grad(), full({5}, 3.0, TensorOptions().dtype(DType::F64)), tolerance(DType::F64));
    // f64 finite differences with either output, or both, as the root or behind other ops.
    auto first = [](const std::vector<Tensor>& in) { return square_and_triple(in[0]).first; };
    auto second = [](const std::vector<Tensor>& in) { return square_and_triple(in[0]).second; };
    auto both = [](const std::vector<Tensor>& in) {
        auto [a, b] = square_and_triple(in[0]);
        return add(mul(a, in[1]), scale(b, -0.5));
    };
    CHECK_GRADCHECK(first, std::vector<Tensor>{leaf({4})});
    CHECK_GRADCHECK(second, std::vector<Tensor>{leaf({4})});
    CHECK_GRADCHECK(both, (std::vector<Tensor>{leaf({3}), leaf({3})}));
}

TEST_CASE("autograd: gradients of two outputs of one node that meet in a later op add up per output") {
    manual_seed(12);
    Tensor x = leaf({4});
    auto [u, v] = square_and_triple(x);
    sum(add(mul(u, v), u)).backward();  // sum(3x^3 + x^2): 9x^2 + 2x; u feeds two ops
    Tensor xd = x.detach();
    CHECK_CLOSE(x.grad(), add(scale(mul(xd, xd), 9.0), scale(xd, 2.0)), tolerance(DType::F64));
}

TEST_CASE("autograd: record_outputs counts an output the call did not make, and refuses none at all") {
    manual_seed(13);
    Tensor x = leaf({2});
    Tensor u;
    {
        NoGradGuard no_grad;
        u = mul(x, x);
    }
    auto node = std::make_shared<SquareAndTripleBackward>();
    node->x = SavedTensor(x);
    record_outputs(node, {&u, nullptr}, x);
    CHECK(node->num_outputs() == 2);
    sum(u).backward();
    CHECK(node->got_du);
    CHECK_FALSE(node->got_dv);
    CHECK_CLOSE(x.grad(), scale(x.detach(), 2.0), tolerance(DType::F64));
    CHECK_THROWS_KIND_WITH(record_outputs(std::make_shared<SquareAndTripleBackward>(), {}, x), Error,
                           "record_outputs", "SquareAndTripleBackward", "at least one output");
}

}  // TEST_SUITE
