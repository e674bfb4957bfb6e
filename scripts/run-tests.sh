#!/bin/bash
# Runs every test of xing4d on a Debian 12 machine as root: installs what it needs, then
#  1. a gcc build with -Werror (plus the CUDA module for one architecture when nvcc is present:
#     CI has nvcc but no GPU, so the kernels are compiled, not run) and its unit + integration tests;
#  2. a clang build with ASan+UBSan: the unit tests again, and every libFuzzer target for a bounded
#     time (X4_FUZZ_SECONDS, default 45 here: nine targets, two at a time);
#  3. the client-compatibility tests (node --test with the official openai client);
#  4. the Debian packages: built, lintian-clean, installed, serving through the installed units'
#     command line, purged (tests/packaging/run.sh).
# Results: build-ci-gcc/meson-logs/testlog.json, build-ci-asan/meson-logs/testlog.json,
# build-ci-gcc/junit-*.xml. scripts/count-results.py prints the "N passed, N failed" line.
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh test || { echo "dependency installation failed"; exit 1; }

status=0
# each section's heading, and the time the one before it took (the CI machine has 2 cores and a
# limit of 90 minutes for the whole run: where the time goes is read here)
section_name="" section_start=$SECONDS
section() {
        [ -z "$section_name" ] || echo "   ($section_name: $((SECONDS - section_start)) s)"
        section_name=$1 section_start=$SECONDS
        [ -z "$1" ] || echo "== $1 =="
}
cuda_opt="-Dcuda=disabled"
if [ -x /usr/local/cuda/bin/nvcc ]; then
        export PATH=/usr/local/cuda/bin:$PATH
        # sm_75 beside sm_90: the oldest card the module builds for, whose limits (1,024 threads
        # an SM, no bf16 mma) differ most from the one card the GPU runs test on
        cuda_opt="-Dcuda=enabled -Dgpu_archs=${X4_GPU_ARCHS:-75,90}"
fi

section "gcc build (-Werror)"
rm -rf build-ci-gcc
# shellcheck disable=SC2086
meson setup build-ci-gcc -Dwerror=true $cuda_opt >build-ci-gcc.log 2>&1 || { cat build-ci-gcc.log; exit 1; }
ninja -C build-ci-gcc >>build-ci-gcc.log 2>&1 || { tail -50 build-ci-gcc.log; exit 1; }
meson test -C build-ci-gcc --no-rebuild --print-errorlogs --suite unit --num-processes 2 || status=1

# pytest suites run directly (not through their meson wrapper) so every case is counted.
section "whole-daemon tests (pytest)"
export X4_BUILD_DIR=$PWD/build-ci-gcc X4_SOURCE_DIR=$PWD X4_FIXTURES=$PWD/tests/fixtures
X4_CLIENT_TEST=$PWD/build-ci-gcc/tests/integration/x4-client-test \
        /usr/bin/python3 -m pytest tests/integration -q -p no:cacheprovider \
        --junitxml=build-ci-gcc/junit-integration.xml || status=1
section "HTTP bridge tests (pytest)"
/usr/bin/python3 -m pytest tests/bridge -q -p no:cacheprovider \
        --junitxml=build-ci-gcc/junit-bridge.xml || status=1

section "clang ASan+UBSan build, unit tests and fuzzers"
rm -rf build-ci-asan
CC=clang meson setup build-ci-asan -Dwerror=true -Dcuda=disabled -Dfuzz=true \
        -Db_sanitize=address,undefined -Db_lundef=false >build-ci-asan.log 2>&1 || { cat build-ci-asan.log; exit 1; }
ninja -C build-ci-asan >>build-ci-asan.log 2>&1 || { tail -50 build-ci-asan.log; exit 1; }
X4_FUZZ_SECONDS=${X4_FUZZ_SECONDS:-45} meson test -C build-ci-asan --no-rebuild --print-errorlogs \
        --suite unit --suite fuzz --num-processes 2 || status=1
section "whole-daemon tests under ASan+UBSan/LSan"
# X4_TEST_SANITIZED=1: the few slowest tests run at a smaller size here, taking the same code
# paths (tests/integration/conftest.py, sized()); the gcc pass above runs them at full size
X4_BUILD_DIR=$PWD/build-ci-asan X4_CLIENT_TEST=$PWD/build-ci-asan/tests/integration/x4-client-test \
        X4_TEST_SANITIZED=1 \
        ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        /usr/bin/python3 -m pytest tests/integration -q -p no:cacheprovider \
        --junitxml=build-ci-asan/junit-integration.xml || status=1

if [ -f tests/compat/package.json ]; then
        section "client compatibility (node --test)"
        tests/compat/run.sh build-ci-gcc || status=1
fi

section "Debian packages: build, lintian, install, serve, purge"
tests/packaging/run.sh build-ci-gcc || status=1

section ""
echo "   (all: $SECONDS s)"
/usr/bin/python3 scripts/count-results.py build-ci-gcc build-ci-asan
exit $status
