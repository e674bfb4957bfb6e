#!/bin/bash
# SPDX-License-Identifier: MIT
# x4-gpu-check's CPU-only modes, in CI (no GPU there): the conditioning mode (the CPU reference
# against itself with one layer-0 weight one ulp off) on the demo model, then the parity mode CPU
# against CPU with that conditioning file, so both keep working and agree on their formats; and the
# nextn mode CPU against CPU (its own logic: rows, routing traces, invariance, pages, verify steps),
# all rows and with X4_GPU_NEXTN_EACH.
#   cpu-modes.sh X4_GPU_CHECK X4_MKMODEL
set -eu
check=$1 mkmodel=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$mkmodel" --preset demo --quiet --out "$dir/demo.gguf"
X4_GPU_PARITY_DUMP=$dir "$check" conditioning "$dir/demo.gguf" 300 8 | tee "$dir/cond.log"
# a well-conditioned model: every position moves by rounding only, the greedy never diverges
grep -q '^conditioning: 308 positions, .* 0 ill-conditioned; greedy identical over all steps, 8;' "$dir/cond.log"
[ "$(grep -c '^[0-9]' "$dir/conditioning.txt")" = 308 ]
grep -qx '# greedy diverged at step -1' "$dir/conditioning.txt"
X4_GPU_PARITY_DEVICE=cpu X4_GPU_CONDITION=$dir/conditioning.txt \
        "$check" parity "$dir/demo.gguf" 300 8 | tee "$dir/parity.log"
grep -q "^parity: conditioning file .*: 308 positions, the perturbed reference's greedy never diverged" "$dir/parity.log"
grep -q '^parity: route rule .*: PASS, 0 positions not explained' "$dir/parity.log"
# a conditioning file without position lines is refused, by name
printf '# nothing\n' >"$dir/empty.txt"
if X4_GPU_PARITY_DEVICE=cpu X4_GPU_CONDITION=$dir/empty.txt "$check" parity "$dir/demo.gguf" 8 1 >"$dir/bad.log"; then
        echo "an empty conditioning file was accepted"; exit 1
fi
grep -q "empty.txt: no position lines" "$dir/bad.log"
X4_GPU_NEXTN_DEVICE=cpu "$check" nextn "$dir/demo.gguf" | tee "$dir/nextn.log"
grep -q '^nextn: [0-9]* checks, 0 failed' "$dir/nextn.log"
# both backends' MoE routing traced (trunk and NextN block), nothing dropped, no flip CPU vs CPU
grep -q '^nextn: route trace: cpu [1-9][0-9]* trunk + [1-9][0-9]* block calls (0 dropped), cpu [1-9][0-9]* + [1-9][0-9]* (0 dropped), .*; positions with a flip: trunk 0, block 0;' "$dir/nextn.log"
grep -q '^nextn: verify steps .* [1-9][0-9]* drafts accepted, [1-9][0-9]* steps with a rejection; 0 rows differ' "$dir/nextn.log"
# every row's one-call-each check by default; X4_GPU_NEXTN_EACH (the GPU racecheck step) limits it
grep -q '^nextn: 199 NextN rows one call each vs one call: 0 values differ' "$dir/nextn.log"
"$mkmodel" --preset tiny --nextn 1 --quiet --out "$dir/tiny-nextn.gguf"
X4_GPU_NEXTN_DEVICE=cpu X4_GPU_NEXTN_EACH=40 "$check" nextn "$dir/tiny-nextn.gguf" | tee "$dir/nextn-each.log"
grep -q '^nextn: 40 NextN rows one call each vs one call: 0 values differ' "$dir/nextn-each.log"
grep -q '^nextn: [0-9]* checks, 0 failed' "$dir/nextn-each.log"
if X4_GPU_NEXTN_DEVICE=cpu X4_GPU_NEXTN_EACH=0 "$check" nextn "$dir/tiny-nextn.gguf" >"$dir/each0.log" 2>&1; then
        echo "X4_GPU_NEXTN_EACH=0 was accepted"; exit 1
fi
grep -q 'X4_GPU_NEXTN_EACH=0: expected a row count of at least 1' "$dir/each0.log"
echo "cpu-modes: ok"
