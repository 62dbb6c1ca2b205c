// tests/test_util.h: what every test file shares: tolerances named per dtype, allclose with the
// largest difference in the message, a finite-difference gradient check in f64, seeded inputs,
// SKIP_TEST and the REQUIRE_*_OR_SKIP guards, in_test_part (a long loop split over processes),
// check_throws (the exception's kind and the words of its message), TempDir, and running train_gpt.
#pragma once

#include <doctest/doctest.h>

#include <cxxabi.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <stdexcept>
#include <sstream>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "core/cuda_allocator.h"
#include "normtape.h"

namespace normtape::testing {

// Tolerances, in one place for every test file. rtol/atol for comparing two computations of the
// same value in a dtype; gradcheck's step and tolerance for f64 central differences.
struct Tolerance {
    double rtol, atol;
};
inline Tolerance tolerance(DType dtype) {
    if (dtype == DType::F64) return {1e-10, 1e-12};
    if (dtype == DType::BF16) return {1e-2, 1e-2};
    return {1e-5, 1e-6};
}

// Normwise relative error ||a - b|| / ||b|| allowed between two implementations of one op (CUDA
// against the cpu reference, normtape against PyTorch) in each dtype: f32 and f64 differ only by
// summation order; bf16 rounds every stored value to 8 bits of mantissa (unit roundoff 3.9e-3).
inline double normwise_tolerance(DType dtype) {
    if (dtype == DType::F64) return 1e-12;
    if (dtype == DType::BF16) return 1e-2;
    return 1e-5;
}
constexpr double kGradcheckStep = 1e-6;    // h in (f(x + h) - f(x - h)) / 2h
constexpr double kGradcheckRtol = 1e-6;    // |analytic - numeric| <= atol + rtol * |numeric|
constexpr double kGradcheckAtol = 1e-8;

inline std::vector<double> as_f64(const Tensor& t) { return t.to(DType::F64).to_vector<double>(); }

// Skipping a test case at run time, where what it tests cannot run here (no GPU, no PyTorch):
// SKIP_TEST("why") prints the reason, marks the running test case skipped and returns from it.
// tests/main.cpp counts the skipped cases: it reports how many, and exits with kSkipExitCode when
// every test case that ran was skipped and none failed, which ctest (SKIP_RETURN_CODE) shows as
// "Skipped" rather than "Passed". A check that failed before the skip still fails the case.
constexpr int kSkipExitCode = 77;
// Whether the running test case has called SKIP_TEST (tests/main.cpp resets it per test case).
inline bool& current_test_skipped() {
    static bool skipped = false;
    return skipped;
}
#define SKIP_TEST(reason)                                              \
    do {                                                               \
        MESSAGE("skipped: " << reason);                                \
        ::normtape::testing::current_test_skipped() = true;            \
        return;                                                        \
    } while (0)

// Skips the rest of a test case where no CUDA GPU is visible.
#define REQUIRE_CUDA_OR_SKIP()                                                                 \
    do {                                                                                       \
        if (!::normtape::cuda_is_available())                                                  \
            SKIP_TEST("no CUDA GPU is visible (CUDA backend built: "                           \
                      << std::string(::normtape::cuda_is_built() ? "yes" : "no") << ")");    \
    } while (0)

// Sets the CUDA allocator's caching for one scope (whatever NORMTAPE_NO_CUDA_MEMORY_CACHING says),
// then restores it.
struct CachingScope {
    bool before = detail::cuda_memory_caching();
    explicit CachingScope(bool on) { detail::set_cuda_memory_caching(on); }
    ~CachingScope() { detail::set_cuda_memory_caching(before); }
    CachingScope(const CachingScope&) = delete;
    CachingScope& operator=(const CachingScope&) = delete;
};

// Skips the rest of a test case where the build made no train_gpt (NORMTAPE_BUILD_EXAMPLES=OFF).
#define REQUIRE_TRAIN_GPT_OR_SKIP()                                                            \
    do {                                                                                       \
        if (std::string(NORMTAPE_TRAIN_GPT).empty()) SKIP_TEST("train_gpt was not built");     \
    } while (0)

// The part of a long test case's loop that this process runs. NORMTAPE_TEST_PART=k/K (1 <= k <= K)
// keeps the items i with i % K == k - 1, so that K processes run the loop between them (the
// sanitizer runs of scripts/gpu_check.sh, where the whole loop takes longer than one device call);
// unset or empty, every item. A loop seeded once draws other inputs in a part than in a whole run: a
// failure in a part is reproduced with the same NORMTAPE_TEST_PART. in_part(i, {k, K}) is the rule;
// test_part parses the value ({k, K}; null or empty: {1, 1}), two decimal numbers and a slash, and
// throws std::invalid_argument, naming it, on anything else.
inline std::pair<int64_t, int64_t> test_part(const char* value) {
    if (value == nullptr || *value == '\0') return {1, 1};
    const std::string v = value;
    const size_t slash = v.find('/');
    int64_t k = 0, K = 0;
    auto number = [&](size_t begin, size_t end, int64_t& out) {
        const auto [ptr, ec] = std::from_chars(v.data() + begin, v.data() + end, out);
        return begin < end && ec == std::errc() && ptr == v.data() + end;
    };
    if (slash == std::string::npos || !number(0, slash, k) || !number(slash + 1, v.size(), K) || K < 1 || k < 1 ||
        k > K)
        throw std::invalid_argument("NORMTAPE_TEST_PART: expected k/K with 1 <= k <= K, got '" + v + "'");
    return {k, K};
}
inline bool in_part(int64_t i, std::pair<int64_t, int64_t> part) { return i % part.second == part.first - 1; }
inline bool in_test_part(int64_t i) {
    static const std::pair<int64_t, int64_t> part = test_part(std::getenv("NORMTAPE_TEST_PART"));
    return in_part(i, part);
}

// The readable name of a type: "normtape::ShapeError".
inline std::string type_name(const std::type_info& type) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(type.name(), nullptr, nullptr, &status), std::free);
    return status == 0 && name ? name.get() : type.name();
}

// Whether check_throws accepts only the kind named or also a kind derived from it.
enum class KindMatch { OrDerived, Exactly };

// check_throws<Kind>(fn, {"word", ...}): fn() throws a Kind (under KindMatch::Exactly, a Kind and
// not a class derived from it) whose message contains every word given. A failure names the line
// of the call, the kind expected and the kind and message thrown. CHECK_THROWS_KIND_WITH is the
// same check for an expression.
template <class Kind, class F>
void check_throws(F&& fn, const std::vector<std::string>& words, KindMatch match = KindMatch::OrDerived,
                  std::source_location where = std::source_location::current()) {
    std::string thrown = "nothing", message;
    bool kind_ok = false;
    try {
        fn();
    } catch (const std::exception& e) {
        thrown = type_name(typeid(e));
        message = e.what();
        kind_ok = match == KindMatch::Exactly ? typeid(e) == typeid(Kind) : dynamic_cast<const Kind*>(&e) != nullptr;
    } catch (...) {
        thrown = "an exception not derived from std::exception";
    }
    INFO("check_throws at " << where.file_name() << ":" << where.line() << ": expected " << type_name(typeid(Kind))
                            << (match == KindMatch::Exactly ? "" : " or a kind derived from it") << ", got " << thrown
                            << (message.empty() ? "" : ": ") << message);
    CHECK(kind_ok);
    for (const std::string& word : words) {
        INFO("the message should contain \"" << word << "\"");
        CHECK(message.find(word) != std::string::npos);
    }
}

#define CHECK_THROWS_KIND_WITH(expr, Kind, ...) \
    ::normtape::testing::check_throws<Kind>([&] { (void)(expr); }, {__VA_ARGS__})

// What fn() did in a child process (fork): a call that once crashed (a stack overflow, a division
// by zero) then fails the test that checks it instead of ending the test program. fn runs with the
// parent's memory as it was at the fork, on one cpu thread (OpenMP's pool does not survive a fork),
// without CUDA (nor does a CUDA context), for at most 120 s (then SIGALRM ends it), and reports
// nothing to doctest; its outcome comes back through a pipe.
struct ChildOutcome {
    enum { Returned, Threw, Killed } how = Killed;
    std::string kind;     // the exception's type (Threw)
    std::string message;  // its what() (Threw), or "signal N" (Killed), or "exit N" (an odd exit)
    bool kind_is = false; // Threw: the exception is a Kind or derives from it
};
template <class Kind = std::exception>
ChildOutcome outcome_in_child(const std::function<void()>& fn) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::close(fds[0]);
        ::alarm(120);
        std::string report = "R";
        try {
            set_num_threads(1);
            fn();
        } catch (const std::exception& e) {
            bool is_kind = true;
            if constexpr (!std::is_same_v<Kind, std::exception>) is_kind = dynamic_cast<const Kind*>(&e) != nullptr;
            report = std::string(is_kind ? "K" : "T") + type_name(typeid(e)) + '\n' + e.what();
        }
        for (size_t done = 0; done < report.size();) {
            const ssize_t n = ::write(fds[1], report.data() + done, report.size() - done);
            if (n <= 0) ::_exit(3);
            done += static_cast<size_t>(n);
        }
        ::_exit(0);
    }
    ::close(fds[1]);
    std::string report;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ChildOutcome o;
    if (WIFSIGNALED(status)) {
        o.message = "signal " + std::to_string(WTERMSIG(status));
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || report.empty()) {
        o.message = "exit " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    } else if (report[0] == 'R') {
        o.how = ChildOutcome::Returned;
    } else {
        o.how = ChildOutcome::Threw;
        o.kind_is = report[0] == 'K';
        const size_t eol = report.find('\n');
        o.kind = report.substr(1, eol - 1);
        o.message = eol == std::string::npos ? "" : report.substr(eol + 1);
    }
    return o;
}

// check_throws for a call that once crashed: fn() runs in a child process (outcome_in_child) and
// must throw a Kind (or a kind derived from it) whose message holds every word given.
template <class Kind>
void check_throws_in_child(const std::function<void()>& fn, const std::vector<std::string>& words,
                           std::source_location where = std::source_location::current()) {
    const ChildOutcome o = outcome_in_child<Kind>(fn);
    INFO("check_throws_in_child at " << where.file_name() << ":" << where.line() << ": expected "
                                     << type_name(typeid(Kind)) << ", got "
                                     << (o.how == ChildOutcome::Returned ? "a return"
                                         : o.how == ChildOutcome::Killed ? "a child ended by " + o.message
                                                                         : o.kind + ": " + o.message));
    CHECK(o.how == ChildOutcome::Threw);
    CHECK(o.kind_is);
    for (const std::string& word : words) {
        INFO("the message should contain \"" << word << "\"");
        CHECK(o.message.find(word) != std::string::npos);
    }
}

// Shorthands of the op and tensor tests.
// Sets the cpu thread count back to what it was when the guard goes; with a count, sets that
// count meanwhile (set_num_threads in a test).
struct ThreadCountGuard {
    int saved = get_num_threads();
    ThreadCountGuard() = default;
    explicit ThreadCountGuard(int threads) { set_num_threads(threads); }
    ~ThreadCountGuard() { set_num_threads(saved); }
    ThreadCountGuard(const ThreadCountGuard&) = delete;
    ThreadCountGuard& operator=(const ThreadCountGuard&) = delete;
};

inline constexpr DType kFloatTypes[] = {DType::F64, DType::F32};
inline int64_t cpu_allocated() { return memory_stats(Device::CPU).allocated_bytes; }
inline TensorOptions opts(DType dtype) { return TensorOptions().dtype(dtype); }
// Standard normals of `dtype`, times `scale`; no gradient.
inline constexpr SavePolicy kSavePolicies[] = {SavePolicy::Input, SavePolicy::Output, SavePolicy::Normalized};

// A fixed batch for a GPT of config `c`: token ids and next-token targets [B, T] i64 on c.device,
// two storages (so that the tape counts both).
struct TokenBatch {
    Tensor idx, targets;
};
inline TokenBatch token_batch(const GPTConfig& c, int64_t B, int64_t T) {
    std::vector<int64_t> ids(B * T), next(B * T);
    for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = static_cast<int64_t>((i * 37 + 5) % c.vocab_size);
        next[i] = static_cast<int64_t>((i * 53 + 1) % c.vocab_size);
    }
    return {from_vector(ids, {B, T}).to(c.device), from_vector(next, {B, T}).to(c.device)};
}

inline Tensor input(const Shape& shape, DType dtype, double scale = 1.0) {
    Tensor t = randn(shape, opts(dtype));
    t.mul_(scale);
    return t;
}
// An expected result, in f64.
inline Tensor expected(const std::vector<double>& values, const Shape& shape) {
    return from_vector<double>(values, shape);
}
inline Tensor ids(const std::vector<int64_t>& values, const Shape& shape) { return from_vector<int64_t>(values, shape); }

// Largest |a - b| and whether every element passes |a - b| <= atol + rtol * |b|.
struct Comparison {
    bool ok = true;
    double max_abs_diff = 0.0;
    std::string message;
};
inline Comparison compare(const Tensor& a, const Tensor& b, Tolerance tol) {
    Comparison c;
    if (a.shape() != b.shape()) {
        c.ok = false;
        c.message = "shapes differ: " + shape_str(a.shape()) + " vs " + shape_str(b.shape());
        return c;
    }
    std::vector<double> va = as_f64(a), vb = as_f64(b);
    size_t worst = 0;
    for (size_t i = 0; i < va.size(); ++i) {
        double d = std::abs(va[i] - vb[i]);
        if (!(d <= tol.atol + tol.rtol * std::abs(vb[i]))) c.ok = false;
        if (d > c.max_abs_diff || std::isnan(d)) {
            c.max_abs_diff = d;
            worst = i;
        }
    }
    std::ostringstream ss;
    ss.precision(17);
    ss << "max |a - b| = " << c.max_abs_diff;
    if (!va.empty()) ss << " at flat index " << worst << " (a = " << va[worst] << ", b = " << vb[worst] << ")";
    c.message = ss.str();
    return c;
}

// ||a - b|| / ||b|| over all elements (a and b on any device, any floating dtype); infinity when
// the shapes differ or a value is NaN.
inline double normwise_error(const Tensor& a, const Tensor& b) {
    if (a.shape() != b.shape()) return INFINITY;
    std::vector<double> va = as_f64(a.to(Device::CPU)), vb = as_f64(b.to(Device::CPU));
    double diff = 0, ref = 0;
    for (size_t i = 0; i < va.size(); ++i) {
        diff += (va[i] - vb[i]) * (va[i] - vb[i]);
        ref += vb[i] * vb[i];
    }
    double e = std::sqrt(diff) / std::max(std::sqrt(ref), 1e-30);
    return std::isnan(e) ? INFINITY : e;
}

#define CHECK_NORMWISE(a, b, tol)                                      \
    do {                                                               \
        double err_ = ::normtape::testing::normwise_error((a), (b));   \
        INFO("normwise error " << err_ << " (tolerance " << (tol) << ")"); \
        CHECK(err_ <= (tol));                                          \
    } while (0)

#define CHECK_CLOSE(a, b, tol)                                         \
    do {                                                               \
        auto cmp_ = ::normtape::testing::compare((a), (b), (tol));     \
        INFO(cmp_.message);                                            \
        CHECK(cmp_.ok);                                                \
    } while (0)

// A leaf f64 tensor of standard normals (scaled), requiring grad.
inline Tensor leaf(const Shape& shape, double scale = 1.0, DType dtype = DType::F64) {
    Tensor t = randn(shape, TensorOptions().dtype(dtype));
    t.mul_(scale);
    t.requires_grad_(true);
    return t;
}

// Finite-difference gradient check (the field's standard, as torch.autograd.gradcheck):
// for L = sum(f(inputs) * u) with a fixed random u, compares every input's backward gradient
// with (L(x + h e_i) - L(x - h e_i)) / 2h. Inputs must be f64 leaves that require grad.
// Returns the worst violation as a message; empty when every element passes.
inline std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, std::vector<Tensor> inputs) {
    Tensor out = f(inputs);
    Tensor u = randn(out.shape(), TensorOptions().dtype(DType::F64));
    for (Tensor& x : inputs) x.zero_grad();
    out.backward(u);
    auto loss_at = [&]() {
        NoGradGuard no_grad;
        Tensor o = f(inputs).contiguous();
        const double* po = o.data_ptr<double>();
        const double* pu = u.data_ptr<double>();
        double s = 0.0;
        for (int64_t i = 0; i < o.numel(); ++i) s += po[i] * pu[i];
        return s;
    };
    std::ostringstream worst;
    double worst_excess = 0.0;
    for (size_t k = 0; k < inputs.size(); ++k) {
        Tensor x = inputs[k];
        Tensor g = x.grad();
        if (!g.defined()) return "input " + std::to_string(k) + " got no gradient";
        double* px = x.data_ptr<double>();
        const double* pg = g.data_ptr<double>();
        for (int64_t i = 0; i < x.numel(); ++i) {
            double saved = px[i];
            px[i] = saved + kGradcheckStep;
            double lp = loss_at();
            px[i] = saved - kGradcheckStep;
            double lm = loss_at();
            px[i] = saved;
            double numeric = (lp - lm) / (2 * kGradcheckStep);
            double excess = std::abs(pg[i] - numeric) - (kGradcheckAtol + kGradcheckRtol * std::abs(numeric));
            if (excess > worst_excess || std::isnan(excess)) {
                worst_excess = std::isnan(excess) ? INFINITY : excess;
                worst.str("");
                worst.precision(12);
                worst << "input " << k << " element " << i << ": analytic " << pg[i] << ", numeric " << numeric;
            }
        }
    }
    return worst.str();
}

#define CHECK_GRADCHECK(f, inputs)                                     \
    do {                                                               \
        std::string why_ = ::normtape::testing::gradcheck((f), (inputs)); \
        INFO(why_);                                                    \
        CHECK(why_.empty());                                           \
    } while (0)

// Path of the real text the training tests learn, data/tinyshakespeare.txt in the repository.
inline std::string shakespeare_path() { return std::string(NORMTAPE_SOURCE_DIR) + "/data/tinyshakespeare.txt"; }

// ---------------------------------------------------------------- files and train_gpt

// A fresh directory under the system temp directory, unique to this process (ctest runs test
// cases in parallel processes) and to `name`; removed with everything in it on scope exit.
struct TempDir {
    std::filesystem::path path;
    explicit TempDir(const std::string& name) {
        namespace fs = std::filesystem;
        path = fs::temp_directory_path() / ("normtape_test_" + name + "_" + std::to_string(getpid()));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() {
        namespace fs = std::filesystem;
        std::error_code ec;
        fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);  // a test may leave it read-only
        fs::remove_all(path, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

// The bytes of a file ("" when it cannot be read).
inline std::string slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file: 8-byte little-endian length of `header` (or `claimed_length`), `header`, `data`.
inline std::string st_file(const std::string& header, const std::string& data = "",
                           uint64_t claimed_length = UINT64_MAX) {
    uint64_t n = claimed_length == UINT64_MAX ? header.size() : claimed_length;
    std::string out(8, '\0');
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return out + header + data;
}

inline int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// The names of the entries of directory `dir`, sorted.
inline std::vector<std::string> listing(const std::filesystem::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

// The shell command that caps the address space of a program run after it at `gib` GiB
// (ulimit -v), so that a run that would allocate too much fails instead of taking the machine's
// memory; a CUDA build's train_gpt maps about 1 GiB of libraries before main. Empty under
// AddressSanitizer, whose shadow memory no such cap leaves room for (its allocator returns null
// instead: allocator_may_return_null in scripts/test.sh).
inline std::string address_space_limit(int64_t gib) {
#if defined(__SANITIZE_ADDRESS__)
    (void)gib;
    return "";
#else
    return "ulimit -v " + std::to_string(gib << 20);
#endif
}

// What a run of train_gpt gave: its exit code (-1 when it did not exit), stdout and stderr.
struct RunResult {
    int code;
    std::string out, err;
};

// Runs `program` with `args` (one /bin/sh command line) in `dir`, its output going through the
// files PREFIXstdout and PREFIXstderr there, after the shell commands `before` (e.g. a ulimit).
inline RunResult run_program(const std::string& program, const std::string& prefix, const TempDir& dir,
                             const std::string& args, const std::string& before) {
    std::string out = dir / (prefix + "stdout"), err = dir / (prefix + "stderr");
    std::string cmd = (before.empty() ? "" : before + " && ") + "cd " + dir.path.string() + " && " + program + " " +
                      args + " > " + out + " 2> " + err;
    int status = std::system(cmd.c_str());
    return RunResult{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(out), slurp(err)};
}

// Runs the train_gpt that this build made (NORMTAPE_TRAIN_GPT) with run_program, in `dir` (where
// its default chart goes).
inline RunResult run_train_gpt(const TempDir& dir, const std::string& args, const std::string& before = "") {
    return run_program(NORMTAPE_TRAIN_GPT, "", dir, args, before);
}

// Runs the generate that this build made (NORMTAPE_GENERATE) with run_program.
inline RunResult run_generate(const TempDir& dir, const std::string& args, const std::string& before = "") {
    return run_program(NORMTAPE_GENERATE, "gen_", dir, args, before);
}

// A run that train_gpt refused before training: exit code 2, one line on stderr holding each of
// `says`, and no training step on stdout.
inline void check_refused(const RunResult& r, std::initializer_list<std::string> says) {
    CAPTURE(r.err);
    CHECK(r.code == 2);
    CHECK(lines(r.err) == 1);
    for (const std::string& s : says) CHECK(r.err.find(s) != std::string::npos);
    CHECK(r.out.find("step ") == std::string::npos);
}

// Starts train_gpt with `args` in `dir`, in the background, its stdout and stderr going to
// `log`; returns its process id. The caller ends it (kill) and reaps it (waitpid).
inline pid_t start_train_gpt(const TempDir& dir, const std::string& args, const std::string& log) {
    std::string cmd = "cd " + dir.path.string() + " && exec " + std::string(NORMTAPE_TRAIN_GPT) + " " + args + " > " + log +
                      " 2>&1";
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {  // the shell execs train_gpt in this process
        execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
        _exit(127);
    }
    return pid;
}

// ---- The Python interpreter of the PyTorch and transformers cross-checks -----------------------

// Debian's python3-torch by default; NORMTAPE_PYTHON names another interpreter (one whose torch has
// CUDA, for the GPU cases, or transformers).
inline std::string python() {
    const char* p = std::getenv("NORMTAPE_PYTHON");
    return p && *p ? p : "/usr/bin/python3";
}

// Whether `code` runs (exit 0) in python(), quietly. `code` holds no single quote.
inline bool python_succeeds(const std::string& code) {
    return std::system((python() + " -c '" + code + "' >/dev/null 2>&1").c_str()) == 0;
}

inline bool torch_available() {
    static const bool available = python_succeeds("import torch");
    return available;
}

// Both sides can run on a GPU: normtape sees one and so does the interpreter's torch.
inline bool torch_cuda_available() {
    static const bool available =
        ::normtape::cuda_is_available() && python_succeeds("import torch; assert torch.cuda.is_available()");
    return available;
}

// A path as one word of /bin/sh (the temp and source paths hold no single quote).
inline std::string shell_quote(const std::filesystem::path& p) {
    std::string quoted = "'";  // built piecewise: GCC 12 warns falsely (-Wrestrict) on "'" + s + "'"
    quoted += p.string();
    quoted += "'";
    return quoted;
}

}  // namespace normtape::testing
