// examples/batcher.cpp: train_gpt's data (examples/batcher.h): reading the text and drawing the
// batches. Not here: what is done with a batch (examples/train_gpt.cpp).
#include "batcher.h"

#include <fstream>
#include <sstream>
#include <vector>

using namespace normtape;

namespace {

std::string read_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw UsageError("cannot read data file " + path);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

}  // namespace

std::string load_text(const Args& a, std::string* description) {
    std::string& desc = *description;
    std::string text;
    if (a.data == "random") desc = "random tokens in [0, " + std::to_string(a.vocab) + ")";
    else text = read_file(desc = a.data.empty() ? kDefaultData : a.data);
    if (a.data != "random" && static_cast<int64_t>(text.size()) < a.seq + 2)
        throw UsageError("data " + desc + " has " + std::to_string(text.size()) + " bytes; --seq " +
                         std::to_string(a.seq) + " needs at least " + std::to_string(a.seq + 2));
    return text;
}

std::string Batcher::state() const {
    std::ostringstream ss;
    ss << rng_;
    return ss.str();
}

void Batcher::set_state(const std::string& s) {
    std::istringstream ss(s);
    std::mt19937_64 rng;
    ss >> rng;
    if (ss.fail()) throw UsageError("the checkpoint's batch generator state is malformed");
    rng_ = rng;
}

void Batcher::next(Tensor* idx, Tensor* targets) {
    std::vector<int64_t> x(B_ * T_), y(B_ * T_);
    for (int64_t b = 0; b < B_; ++b) {
        if (text_.empty()) {
            for (int64_t t = 0; t < T_; ++t) {
                x[b * T_ + t] = static_cast<int64_t>(rng_() % static_cast<uint64_t>(V_));
                y[b * T_ + t] = static_cast<int64_t>(rng_() % static_cast<uint64_t>(V_));
            }
            continue;
        }
        uint64_t s = rng_() % (text_.size() - static_cast<uint64_t>(T_));
        for (int64_t t = 0; t < T_; ++t) {
            x[b * T_ + t] = static_cast<unsigned char>(text_[s + t]);
            y[b * T_ + t] = static_cast<unsigned char>(text_[s + t + 1]);
        }
    }
    TensorOptions opts = TensorOptions().device(device_);
    *idx = from_vector(x, {B_, T_}, opts);
    *targets = from_vector(y, {B_, T_}, opts);
}
