// examples/train_gpt/train_data.cpp: train_gpt's data (examples/train_gpt/train_data.h): reading the text or
// the token files (a text encoded by --tokenizer), holding out its tail, and the validation loss.
// Not here: the batches (nn/data/data.h), the training step (examples/train_gpt/step_runner.h).
#include "train_data.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <new>
#include <sstream>
#include <stdexcept>
#include <utility>

#include <nlohmann/json.hpp>

#include "../common/checkpoint_checks.h"
#include "../common/checksums.h"

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

bool data_is_tokens(const Args& a) {
    if (a.data == "random" || a.data_format == "text") return false;
    if (a.data_format != "auto") return true;
    const std::string file = data_file(a);
    return file.size() > 4 && file.compare(file.size() - 4, 4, ".bin") == 0;
}

namespace {

// The files --data names: the file, or the files its glob pattern matches, sorted.
std::vector<std::string> data_files(const Args& a, const std::string& what) {
    const std::string file = data_file(a);
    std::error_code ec;  // a file whose name holds *, ? or [ is read as itself
    if (file.find_first_of("*?[") == std::string::npos || std::filesystem::exists(file, ec)) return {file};
    glob_t g{};
    const int status = ::glob(file.c_str(), 0, nullptr, &g);
    std::vector<std::string> files(g.gl_pathv, g.gl_pathv + (status == 0 ? g.gl_pathc : 0));
    ::globfree(&g);
    if (status == GLOB_NOMATCH) throw UsageError(what + ": the pattern matches no file");
    if (status != 0) throw UsageError(what + ": cannot expand the pattern (glob error " + std::to_string(status) + ")");
    std::sort(files.begin(), files.end());
    return files;
}

// --tokenizer (Tokenizer::load: a rank file beside its JSON, or a tokenizer.json). Sets `hash` to
// FNV-1a of its files' bytes.
std::shared_ptr<const Tokenizer> load_tokenizer(const Args& a, uint64_t* hash) {
    const std::string what = describe(a, "tokenizer", a.tokenizer);
    try {
        *hash = tokenizer_fnv1a64(a.tokenizer);
        return std::make_shared<const Tokenizer>(Tokenizer::load(a.tokenizer));
    } catch (const Error& e) {
        throw UsageError(what + ": " + e.what());
    }
}

// The text's ids under data.tokenizer: read from the cache beside `file` (the first data file) if
// it is there, else encoded and written to it, with a warning if it cannot be. The cache is
// .FILE.NAME.HASH.bin (hidden, so that a glob of the data does not match it), llm.c's token file
// (nn/data/token_file.h), HASH the FNV-1a of the cache's format and normtape's version and the
// text's and the tokenizer's checksums: another text, tokenizer or encoder has another name. A
// cache whose ids are not all ordinary tokens is encoded again. data.tokens holds the text's
// bytes. Sets `note` to where the ids came from.
std::vector<uint32_t> encode_cached(const TrainData& data, const std::string& file, std::string& note) {
    const uint64_t sums[2] = {data.fnv1a64, data.tokenizer_fnv1a64};
    const std::string format = std::string("normtape token cache 1, ") + version();  // 1: raise when encoding changes
    const std::string hash =
        hex(fnv1a64(fnv1a64(0xcbf29ce484222325ull, format), {reinterpret_cast<const char*>(sums), sizeof sums}));
    std::string name = ".";  // (appended piece by piece: GCC 12 warns of a false -Wrestrict on one "+" chain)
    name.append(std::filesystem::path(file).filename().string()).append(".").append(data.tokenizer->name());
    name.append(".").append(hash).append(".bin");
    const std::string cache = (std::filesystem::path(file).parent_path() / name).string();
    const Tokenizer& tok = *data.tokenizer;
    std::error_code ec;
    if (std::filesystem::is_regular_file(cache, ec)) {
        try {
            std::vector<uint32_t> ids = read_token_file(cache, TokenFileFormat::LlmC);
            for (size_t i = 0; i < ids.size(); ++i)
                if (ids[i] >= tok.tokens().size() || tok.tokens()[ids[i]].empty())
                    throw FormatError("id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                      " is no ordinary token of " + tok.name());
            note = " (read from the cache " + cache + ")";
            return ids;
        } catch (const Error& e) {
            std::fprintf(stderr, "train_gpt: warning: the cache %s is unreadable, encoding again: %s\n", cache.c_str(),
                         e.what());
        }
    }
    std::vector<uint32_t> ids = tok.encode_ordinary(std::string(data.tokens.begin(), data.tokens.end()));
    try {
        write_token_file(cache, ids);
        note = " (cached in " + cache + ")";
    } catch (const Error& e) {
        std::fprintf(stderr, "train_gpt: warning: the encoded text is not cached: %s\n", e.what());
    }
    return ids;
}

}  // namespace

TrainData load_data(const Args& a) {
    TrainData data;
    data.fnv1a64 = 0xcbf29ce484222325ull;  // FNV-1a's offset basis: the hash of no bytes
    if (a.data == "random") {
        data.description = "random tokens in [0, " + std::to_string(a.vocab) + ")";
        return data;
    }
    const std::string what = describe(a, "data", data_file(a));
    // A checkpoint's data path may be relative to the directory of the run that saved it.
    const std::string hint = a.from_checkpoint.count("data") ? " (give --data FILE if the data is elsewhere now)" : "";
    const std::vector<std::string>& files = data.files = data_files(a, what + hint);
    const bool tokens = data.token_files = data_is_tokens(a);
    const TokenFileFormat asked = a.data_format == "llm.c" ? TokenFileFormat::LlmC
                                  : a.data_format == "raw" ? TokenFileFormat::Raw
                                                           : TokenFileFormat::Auto;
    std::vector<std::string> formats;  // of the token files, as found
    for (const std::string& file : files) {
        const std::string about = files.size() > 1 ? what + ": " + file : what;
        const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) throw UsageError(about + ": cannot read the data file: " + std::strerror(errno) + hint);
        struct Closer {
            int fd;
            ~Closer() { ::close(fd); }
        } closer{fd};
        struct stat st;
        if (::fstat(fd, &st) != 0) throw UsageError(about + ": cannot read the data file: " + std::strerror(errno));
        if (S_ISDIR(st.st_mode))
            throw UsageError(about + ": is a directory, expected a " + (tokens ? "token" : "text") + " file");
        const std::string bytes = read_whole(fd, st, about);
        data.bytes += bytes.size();
        data.fnv1a64 = fnv1a64(data.fnv1a64, bytes);
        if (!tokens) {
            data.tokens.insert(data.tokens.end(), reinterpret_cast<const unsigned char*>(bytes.data()),
                               reinterpret_cast<const unsigned char*>(bytes.data()) + bytes.size());
            continue;
        }
        TokenFileFormat format = TokenFileFormat::Auto;
        std::vector<uint32_t> ids;
        try {
            ids = parse_token_file(bytes, file, asked, &format);
        } catch (const FormatError& e) {
            throw UsageError(describe(a, "data", data_file(a)) + ": " + e.what());
        }
        for (size_t i = 0; i < ids.size(); ++i)
            if (ids[i] >= static_cast<uint64_t>(a.vocab))
                throw UsageError(about + ": token " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                 " is not below " + describe(a, "vocab", std::to_string(a.vocab)) +
                                 " (these ids need a vocabulary of at least " + std::to_string(ids[i] + 1) + ")");
        data.tokens.insert(data.tokens.end(), ids.begin(), ids.end());
        const std::string name = token_file_format_name(format);
        if (std::find(formats.begin(), formats.end(), name) == formats.end()) formats.push_back(name);
    }
    data.description = files.size() > 1 ? std::to_string(files.size()) + " files of " + data_file(a) : files[0];
    if (!a.tokenizer.empty()) {  // the text's bytes become the tokenizer's ids, special tokens as text
        data.tokenizer = load_tokenizer(a, &data.tokenizer_fnv1a64);
        const int64_t size = data.tokenizer->vocab_size();
        if (size > kMaxVocab)
            throw UsageError(describe(a, "tokenizer", a.tokenizer) + " has " + std::to_string(size) +
                             " ids, more than a model's vocabulary may have (2^24)");
        if (a.vocab_given && a.vocab < size)
            throw UsageError(describe(a, "vocab", std::to_string(a.vocab)) + " is smaller than " +
                             describe(a, "tokenizer", a.tokenizer) + "'s " + std::to_string(size) + " ids");
        data.description += ", encoded by " + data.tokenizer->name();
        data.tokens = encode_cached(data, files[0], data.token_cache);
    }
    if (tokens) {
        std::string kinds;
        for (const std::string& f : formats) kinds += (kinds.empty() ? "" : " and ") + f;
        data.description += " (" + kinds + " token file" + (files.size() > 1 ? "s" : "") + ")";
    }
    if (static_cast<int64_t>(data.tokens.size()) < a.seq + 2)
        throw UsageError(what + ": the data has " + std::to_string(data.tokens.size()) + (tokens ? " tokens; " : " bytes; ") +
                         describe(a, "seq", std::to_string(a.seq)) + " needs at least " + std::to_string(a.seq + 2));
    return data;
}

std::vector<RunInput> run_inputs(const Args& a, const TrainData& data) {
    std::vector<RunInput> inputs;
    for (const std::string& file : data.files)
        inputs.push_back({"--data " + data_file(a) + (file == data_file(a) ? "" : " (" + file + ")"), file});
    if (!a.tokenizer.empty())
        for (const std::string& file : tokenizer_files(a.tokenizer))
            inputs.push_back({"--tokenizer " + a.tokenizer + (file == a.tokenizer ? "" : " (" + file + ")"), file});
    return inputs;
}

double bytes_per_token(const TrainData& data, const std::vector<uint32_t>& tokens) {
    if (tokens.empty()) return std::numeric_limits<double>::quiet_NaN();
    if (!data.tokenizer) return data.token_files ? std::numeric_limits<double>::quiet_NaN() : 1.0;
    double bytes = 0;
    for (uint32_t id : tokens) bytes += static_cast<double>(data.tokenizer->tokens()[id].size());
    return bytes / static_cast<double>(tokens.size());
}

DataSplit split_data(const Args& a, const std::vector<uint32_t>& tokens) {
    const auto n_val = static_cast<size_t>(std::floor(static_cast<double>(tokens.size()) * a.val_fraction));
    const auto cut = tokens.end() - static_cast<std::ptrdiff_t>(n_val);
    DataSplit split{std::vector<uint32_t>(tokens.begin(), cut), std::vector<uint32_t>(cut, tokens.end())};
    char fraction[32];
    std::snprintf(fraction, sizeof fraction, "%g", a.val_fraction);
    for (const auto& [part, what] : {std::pair{&split.train, "training part"}, {&split.val, "held-out tail"}})
        if (!part->empty() && static_cast<int64_t>(part->size()) < a.seq + 1)
            throw UsageError(describe(a, "val-fraction", fraction) + ": the " + what +
                             " of the data has " + std::to_string(part->size()) +
                             (data_is_tokens(a) ? " tokens; " : " bytes; ") +
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
