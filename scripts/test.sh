#!/usr/bin/env bash
# scripts/test.sh: the test suite. Installs what is missing (including Debian's python3-torch for
# the PyTorch cross-check and nodejs for tiktoken, the tokenizer's reference, which
# scripts/fetch_tiktoken.sh fetches into vocab/), builds, and runs the tests through ctest, one
# ctest test per doctest test case, on every core.
#   scripts/test.sh              build/ (Release; the CUDA backend too where nvcc is found)
#   scripts/test.sh --fast       leaves out the tests labelled slow (ctest -LE slow: training on
#                                real text, the PyTorch cross-check, the runs of train_gpt;
#                                tests/labels.cmake lists them)
#   scripts/test.sh --sanitize   build-sanitize/: cpu only, under AddressSanitizer and UBSan
#                                (any finding fails the test that made it)
#   scripts/test.sh --werror     a warning in the project's own code fails the build (CI, and
#                                the project's developers; a user's build only reports it)
# Without a GPU visible the CUDA sources compile for every architecture of the portable list
# (CMakeLists.txt); the first lines say which. The flags combine (--sanitize --fast --werror). A test that cannot run here (the CUDA tests without a
# GPU, the PyTorch cross-check without torch) is reported by ctest as skipped, not passed. After
# ctest's own summary the script prints the counts:
#   normtape tests: 155 ran
#   normtape: 145 passed, 0 failed, 10 skipped
# and exits non-zero when a test failed.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
CTEST_ARGS=()
WERROR=OFF
for arg in "$@"; do
    case "$arg" in
    --fast) CTEST_ARGS+=(-LE slow) ;;
    --werror) WERROR=ON ;;
    --sanitize)
        BUILD="$ROOT/build-sanitize"
        # -O1 -g1 (line tables): the optimization AddressSanitizer's documentation suggests, with
        # stack traces that name files and lines; it compiles in half the time of -O2 -g.
        CMAKE_ARGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
                    -DNORMTAPE_SANITIZE=ON -DNORMTAPE_CUDA=OFF)
        # allocator_may_return_null: an allocation too large to satisfy returns null, as malloc
        # does, and the library's OutOfMemoryError path runs (ASan would abort the process instead).
        export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
        ;;
    *)
        echo "usage: scripts/test.sh [--fast] [--sanitize] [--werror]" >&2
        exit 2
        ;;
    esac
done
CMAKE_ARGS+=(-DNORMTAPE_WERROR=$WERROR)
install_build_deps
install_packages python3 python3-torch nodejs
# tiktoken's encodings and reference encoder for the tokenizer's tests, which skip where they are
# absent (no route to the npm registry).
bash "$ROOT/scripts/fetch_tiktoken.sh" || echo "normtape: tiktoken's encodings not fetched: the tokenizer's reference tests skip"
configure_and_build
cd "$BUILD"
# ctest's JUnit report gives the counts (ctest's summary counts a skipped test as passed).
junit="$BUILD/Testing/normtape_tests.xml"
rm -f "$junit"
status=0
ctest --output-on-failure -j "$(nproc)" --output-junit "$junit" "${CTEST_ARGS[@]}" || status=$?
count() { sed -n "s/^[[:space:]]*$1=\"\([0-9]*\)\".*/\1/p" "$junit" | head -n 1; }
if [ -f "$junit" ]; then
    run=$(count tests) failed=$(count failures) skipped=$(count skipped)
    echo "normtape tests: $run ran"
    echo "normtape: $((run - failed - skipped)) passed, $failed failed, $skipped skipped"
    [ "$failed" -eq 0 ] || status=1
else
    echo "normtape tests: ctest wrote no report (exit status $status)"
    [ "$status" -ne 0 ] || status=1
fi
exit "$status"
