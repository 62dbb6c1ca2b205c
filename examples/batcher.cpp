// examples/batcher.cpp: train_gpt's data (examples/batcher.h): reading the text and drawing the
// batches. Not here: what is done with a batch (examples/train_gpt.cpp).
#include "batcher.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

using namespace normtape;

std::string data_file(const Args& a) {
    if (a.data == "random") return "";
    return a.data.empty() ? kDefaultData : a.data;
}

std::string load_text(const Args& a, std::string* description) {
    std::string& desc = *description;
    if (a.data == "random") {
        desc = "random tokens in [0, " + std::to_string(a.vocab) + ")";
        return "";
    }
    desc = data_file(a);
    const std::string what = describe(a, "data", desc);
    // A checkpoint's data path may be relative to the directory of the run that saved it.
    const std::string hint = a.from_checkpoint.count("data") ? " (give --data FILE if the data is elsewhere now)" : "";
    std::error_code ec;
    if (std::filesystem::is_directory(desc, ec)) throw UsageError(what + ": is a directory, expected a text file");
    std::ifstream f(desc, std::ios::binary);
    if (!f) throw UsageError(what + ": cannot read the data file: " + std::strerror(errno) + hint);
    std::ostringstream ss;
    ss << f.rdbuf();
    if (f.bad()) throw UsageError(what + ": cannot read the data file: " + std::strerror(errno));
    std::string text = ss.str();
    if (static_cast<int64_t>(text.size()) < a.seq + 2)
        throw UsageError(what + ": the data file has " + std::to_string(text.size()) + " bytes; " +
                         describe(a, "seq", std::to_string(a.seq)) + " needs at least " + std::to_string(a.seq + 2));
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
