#!/bin/sh
# run-fuzzer.sh FUZZER CORPUS: runs a libFuzzer target for X4_FUZZ_SECONDS (default 60) on a copy
# of its seed corpus, so the committed corpus is never modified by a run. A crash or a timeout
# exits 1: libFuzzer's own codes (77 for a bug, 70 for a timeout) would read as "skipped" to meson
# (77), hiding a found bug in the CI's count.
set -eu
fuzzer=$1
corpus=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -d "$corpus" ] && cp -r "$corpus"/. "$work"/
exec "$fuzzer" -max_total_time="${X4_FUZZ_SECONDS:-60}" -timeout=10 -rss_limit_mb=2048 \
        -error_exitcode=1 -timeout_exitcode=1 \
        -print_final_stats=1 "$work"
