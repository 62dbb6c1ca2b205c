// examples/train_gpt/train_data.cpp: train_gpt's data (examples/train_gpt/train_data.h): reading the text, holding out
// its tail, and the validation loss. Not here: the batches (nn/data/data.h), the training step
// (examples/train_gpt/train_gpt.cpp).
#include "train_data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>

using namespace normtape;

std::string data_file(const Args& a) {
    if (a.data == "random") return "";
    return a.data.empty() ? kDefaultData : a.data;
}

namespace {

// The whole file open as `fd` (fstat gave `st`): a regular file's size bytes, read until each is
// in; another kind of file (a pipe, /proc's) read to its end. Throws UsageError naming `what`, the
// bytes read and expected and the system's error when a read fails, memory for the bytes runs out,
// or a regular file ends before its size or goes on past it (it changed while it was read).
std::string read_whole(int fd, const struct stat& st, const std::string& what) {
    const bool sized = S_ISREG(st.st_mode) && st.st_size > 0;  // /proc's files say 0
    const size_t expected = sized ? static_cast<size_t>(st.st_size) : 0;
    constexpr size_t kChunk = size_t{1} << 20;
    std::string text;
    size_t got = 0;
    auto failed = [&](const std::string& why) {
        return UsageError(what + ": cannot read the data file: read " + std::to_string(got) + " of " +
                          (sized ? "its " + std::to_string(expected) + " bytes" : "its bytes (a file of unknown size)") +
                          ": " + why);
    };
    for (;;) {
        if (got == text.size()) {
            // Room for the rest: the whole size at once, else the next chunk (one more byte past a
            // regular file's size, to see that it ends there).
            size_t want = sized && got < expected ? expected : got + (sized ? 1 : std::max(kChunk, got));
            try {
                text.resize(want);
            } catch (const std::bad_alloc&) {
                throw failed(std::string(std::strerror(ENOMEM)) + " (the file does not fit in memory)");
            } catch (const std::length_error&) {
                throw failed(std::string(std::strerror(ENOMEM)) + " (the file does not fit in memory)");
            }
        }
        ssize_t n = ::read(fd, text.data() + got, text.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw failed(std::strerror(errno));
        if (n == 0) break;
        got += static_cast<size_t>(n);
        if (sized && got > expected)
            throw failed("the file grew while it was read (is another program writing it?)");
    }
    if (sized && got < expected) throw failed("the file ended early (did it shrink while it was read?)");
    text.resize(got);
    return text;
}

}  // namespace

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
    const int fd = ::open(desc.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw UsageError(what + ": cannot read the data file: " + std::strerror(errno) + hint);
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st;
    if (::fstat(fd, &st) != 0) throw UsageError(what + ": cannot read the data file: " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) throw UsageError(what + ": is a directory, expected a text file");
    std::string text = read_whole(fd, st, what);
    if (static_cast<int64_t>(text.size()) < a.seq + 2)
        throw UsageError(what + ": the data file has " + std::to_string(text.size()) + " bytes; " +
                         describe(a, "seq", std::to_string(a.seq)) + " needs at least " + std::to_string(a.seq + 2));
    return text;
}

TextSplit split_text(const Args& a, const std::string& text) {
    const auto n_val = static_cast<size_t>(std::floor(static_cast<double>(text.size()) * a.val_fraction));
    TextSplit split{text.substr(0, text.size() - n_val), text.substr(text.size() - n_val)};
    char fraction[32];
    std::snprintf(fraction, sizeof fraction, "%g", a.val_fraction);
    for (const auto& [part, what] : {std::pair{&split.train, "training part"}, {&split.val, "held-out tail"}})
        if (!part->empty() && static_cast<int64_t>(part->size()) < a.seq + 1)
            throw UsageError(describe(a, "val-fraction", fraction) + ": the " + what +
                             " of the data has " + std::to_string(part->size()) + " bytes; " +
                             describe(a, "seq", std::to_string(a.seq)) + " needs at least " +
                             std::to_string(a.seq + 1));
    return split;
}

double evaluate(GPT& model, Batcher& val, const std::string& start, int64_t batches, int rank, int world) {
    NoGradGuard no_grad;
    struct EvalMode {  // training mode comes back even if a forward throws
        GPT& m;
        explicit EvalMode(GPT& model) : m(model) { m.eval(); }
        ~EvalMode() { m.train(); }
    } eval_mode(model);
    val.set_state(start);
    double total = 0;
    for (int64_t k = 0; k < batches; ++k) {
        auto [idx, targets] = val.next();
        if (world > 1) {
            const int64_t rows = idx.size(0) / world;
            idx = idx.narrow(0, rank * rows, rows).clone();
            targets = targets.narrow(0, rank * rows, rows).clone();
        }
        total += model.loss(idx, targets).to(DType::F32).item<float>();
    }
    return total / static_cast<double>(batches);
}
