// examples/consumer/main.cpp: trains a two-layer classifier through the installed normtape package
// and checks that it learned. The task: label 2-D points by whether they lie inside the circle of
// radius 1 (a boundary no linear model can draw). Model: Linear(2, 32) -> gelu -> Linear(32, 2),
// cross-entropy, AdamW, full batch of 256 points, on the cpu. Exits 1 unless the loss falls to
// less than a third of its first value.
#include <cstdio>
#include <vector>

#include <normtape.h>

using namespace normtape;

int main() {
    manual_seed(0);
    const int64_t n = 256;
    Tensor x = randn({n, 2});  // points drawn N(0, 1); about 39% lie inside the unit circle
    std::vector<int64_t> labels(n);
    const float* p = x.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) labels[i] = p[2 * i] * p[2 * i] + p[2 * i + 1] * p[2 * i + 1] < 1.0f;
    Tensor y = from_vector(labels);

    Linear fc1(2, 32, true, {}, 0.5), fc2(32, 2, true, {}, 0.5);
    std::vector<Tensor> params = fc1.parameters();
    for (const Tensor& t : fc2.parameters()) params.push_back(t);
    AdamW opt(params, AdamWOptions{.lr = 0.02, .weight_decay = 0.0});

    double first = 0, last = 0;
    for (int step = 0; step < 300; ++step) {
        Tensor loss = cross_entropy(fc2.forward(gelu(fc1.forward(x))), y);
        opt.zero_grad();
        loss.backward();
        opt.step();
        last = loss.item<double>();
        if (step == 0) first = last;
        if (step % 100 == 0 || step == 299) std::printf("step %3d  loss %.4f\n", step, last);
    }
    bool learned = last < first / 3;
    std::printf("normtape %s: loss %.4f -> %.4f, %s\n", version(), first, last, learned ? "fell" : "did NOT fall");
    return learned ? 0 : 1;
}
