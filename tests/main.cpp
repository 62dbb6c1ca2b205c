// tests/main.cpp: the doctest main, and the count of test cases that skipped themselves
// (SKIP_TEST, tests/test_util.h). After doctest's own summary it prints how many test cases were
// skipped. Its exit code is doctest's, except that a run in which every test case that ran was
// skipped, and none failed, exits with kSkipExitCode (77): ctest runs one test case per process
// and shows such a test as "Skipped" (SKIP_RETURN_CODE in CMakeLists.txt). A run of several
// test cases of which some were skipped and the rest passed exits 0; a run in which no test case
// matched the filters exits 1.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "test_util.h"

namespace {

struct SkipCount {
    int ran = 0, skipped = 0, failed = 0;
};
SkipCount& skip_count() {
    static SkipCount count;
    return count;
}

// A doctest listener: resets the skip flag as each test case starts and counts the outcomes.
struct SkipListener : doctest::IReporter {
    explicit SkipListener(const doctest::ContextOptions&) {}
    void test_case_start(const doctest::TestCaseData&) override { normtape::testing::current_test_skipped() = false; }
    void test_case_end(const doctest::CurrentTestCaseStats& stats) override {
        SkipCount& count = skip_count();
        ++count.ran;
        if (!stats.testCaseSuccess) ++count.failed;
        else if (normtape::testing::current_test_skipped()) ++count.skipped;
    }
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};

}  // namespace

REGISTER_LISTENER("normtape_skips", 1, SkipListener);

int main(int argc, char** argv) {
    doctest::Context context(argc, argv);
    int code = context.run();
    if (context.shouldExit()) return code;  // --help, --list-test-cases and the like
    const SkipCount& count = skip_count();
    if (count.ran == 0) {  // a filter that matches no test case is a mistake, not a pass
        std::fprintf(stderr, "[doctest] no test case matched the filters\n");
        return 1;
    }
    if (count.skipped > 0)
        std::printf("[doctest] skipped: %d of the %d test cases that ran (counted as passed above; reasons in "
                    "their \"skipped:\" messages)\n",
                    count.skipped, count.ran);
    if (code == 0 && count.failed == 0 && count.ran > 0 && count.skipped == count.ran)
        return normtape::testing::kSkipExitCode;
    return code;
}
