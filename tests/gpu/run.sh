#!/bin/bash
# SPDX-License-Identifier: MIT
# The GPU tests in one command, on a machine with an NVIDIA GPU (sm_75 or newer):
#
#   bash tests/gpu/run.sh
#
# Builds build-gpu (meson setup -Drpc=disabled -Dgpu_archs=$X4_GPU_ARCHS, default 90: set it to
# your card, e.g. 86 or 89), then runs every check of tests/gpu/gpu-check.c and compute-sanitizer.
# The log goes to $OUT/gpu-tests.log when OUT is set (else build-gpu/gpu-tests.log) and a summary
# table to stdout. Exit status: 0 when every step passed.
#
# Steps: the xing4-tiny-a fixture vs the float64 reference and vs the CPU backend; batch
# invariance (16 sequences, alone vs batched); chunk invariance (1/7/64/512/whole); refusal
# messages; CUDA vs CPU on the x4-mkmodel `demo` model (512-token prompt + 64 greedy tokens);
# compute-sanitizer memcheck and racecheck on a tiny prefill + decode; MTP (issue 16): the NextN
# block CUDA vs CPU (x4-gpu-check nextn, rel <= 1e-3 per row as the trunk's logits; 1e-2 with the
# f16 cache) on the tiny shapes with a NextN block and on the demo model, x4-logits --nextn-out
# CUDA vs CPU, greedy generation with MTP on byte-identical to MTP off (x4-bench --mtp on fails
# otherwise), and tests/integration/test_mtp.py with its daemons on CUDA when the build has the
# daemon (X4_GPU_DAEMON_BUILD=DIR: a build with RPC; SKIP line otherwise). X4_GPU_FULL_MODEL=PATH adds
# the CUDA vs CPU parity on that model (e.g. the real 20 GB GGUF; minutes on the CPU side), with
# X4_GPU_CONFIG=config.json or X4_GPU_RELEASE_DEFAULTS=1 when no config.json sits beside it.
# X4_GPU_BENCH=1 adds x4-bench on full-width synthetic models of 2 and 6 layers. X4_GPU_ONLY=REGEX
# runs only the steps whose names match it, X4_GPU_SKIP=REGEX all but those.
set -u
cd "$(dirname "$0")/../.." || exit 1
# The products' numerics a step runs: on sm_80+ the backend's default is every token on tensor
# cores (bf16 inputs, kernels/cuda/mmtc.cu); the steps below are the exact path's (the CUDA-core
# products, fp32: X4_CUDA_MM=fp32) unless they name X4_CUDA_MM=tc, which is the default's.
# The Q6_K head on tensor cores (k_q6_tc, the default beside X4_CUDA_MM=tc since 72ecf98's
# measurements) is off unless a step names X4_CUDA_MM_Q6TC=1 (the steps below that say "defaults",
# and q6tc_checks): the other steps compare the head's other kernels, as they did before.
export X4_CUDA_MM=fp32 X4_CUDA_MM_Q6TC=0

build=${X4_GPU_BUILD:-build-gpu}
archs=${X4_GPU_ARCHS:-90}
outdir=${OUT:-$build}
mkdir -p "$outdir"
log=$outdir/gpu-tests.log
: >"$log"
# the tools keep their log to one error line unless told (X4_LOG_LEVEL): the steps that check a
# knob was taken (its warning) or was not refused (no warning naming it) read the warnings
export X4_LOG_LEVEL=warning
fixture=tests/fixtures/xing4-tiny-a
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
results=()
failed=0
ran=0 # steps run past the X4_GPU_ONLY / X4_GPU_SKIP filters (build steps aside)

step() { # name, command...
        local name=$1 t0 rc
        shift
        # X4_GPU_ONLY=REGEX: only the build and the steps whose names match (a short device call;
        # steps that make what later ones use, like "make demo model", must match too)
        if [ -n "${X4_GPU_ONLY:-}" ] && [ "$name" != "meson setup" ] && [ "$name" != build ] &&
                ! [[ $name =~ $X4_GPU_ONLY ]]; then
                return 0
        fi
        # X4_GPU_SKIP=REGEX: the steps whose names match left out (the suite split over two calls,
        # e.g. X4_GPU_SKIP=compute-sanitizer, then X4_GPU_ONLY='make demo model|make tiny model|wide shapes|compute-sanitizer')
        if [ -n "${X4_GPU_SKIP:-}" ] && [[ $name =~ $X4_GPU_SKIP ]]; then
                return 0
        fi
        [ "$name" = "meson setup" ] || [ "$name" = build ] || ran=$((ran + 1))
        t0=$(date +%s.%N)
        echo "=== $name: $*" >>"$log"
        "$@" >>"$log" 2>&1
        rc=$?
        local dt
        dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        if [ $rc -eq 0 ]; then
                results+=("PASS  $name (${dt}s)")
        else
                results+=("FAIL  $name (rc $rc, ${dt}s)")
                failed=1
        fi
        echo "=== $name: rc $rc, ${dt}s" >>"$log"
        return $rc
}

{
        echo "date: $(date -u +%FT%TZ)"
        echo "commit: $(git rev-parse HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) files changed"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
        nvcc --version 2>&1 | tail -1
} >>"$log"

if [ -n "${X4_GPU_PREBUILT:-}" ]; then
        # X4_GPU_PREBUILT=1: $build holds the programs built elsewhere from this tree
        # (scripts/device/prebuilt.sh, its list and its stamp): no build here
        . scripts/device/prebuilt.sh
        x4_prebuilt_ok "$build" ||
                { echo "X4_GPU_PREBUILT: $build lacks one of $X4_PREBUILT_TARGETS or was built from other sources" >&2; exit 1; }
        echo "prebuilt: $build ($(sed -n 2p "$build/STAMP" 2>/dev/null))" >>"$log"
else
        if [ ! -f "$build/build.ninja" ]; then
                step "meson setup" meson setup "$build" -Drpc=disabled -Dgpu_archs="$archs" -Dcuda=enabled
        fi
        if ! step "build" ninja -C "$build" -j"$(nproc)"; then
                printf '%s\n' "${results[@]}"
                echo "log: $log"
                exit 1
        fi
fi

case $build in /*) ;; *) build=$PWD/$build ;; esac
check=$build/kernels/cuda/x4-gpu-check
export X4_CUDA_MODULE=$build/kernels/cuda/xing4d-cuda.so
tiny=$fixture/model.gguf

step "fixture vs f64 reference and cpu" "$check" fixture "$fixture"
step "batch invariance (16 seqs)" "$check" batch "$tiny"
step "chunk invariance (1/7/64/512)" "$check" chunks "$tiny"
step "refusal messages" "$check" errors "$tiny"
step "quick prefill+decode" "$check" quick "$tiny"
# the MoE grouping the forward runs (k_moe_group_scan) against the reference kernel: the same ints, memcmp
step "MoE grouping writes the reference's ints (memcmp, 1 .. 73,728 pairs)" "$check" group "$build/kernels/cuda/xing4d-cuda.so"
step "cache pages (snapshot, copy, n_pages from memory_limit)" "$check" pages "$tiny"
# the f16 cache's decode-class attention runs on tensor cores (k_attn_dtc, sm_80+; the fp32
# kernels with X4_CUDA_DECODE_ATTN=fp32): its bound against float64, and invariant by itself
step "fixture, f16 latent cache (rel <= 1e-2)" env X4_GPU_CACHE=f16 "$check" fixture "$fixture" --no-cpu
step "chunk invariance, f16 latent cache" env X4_GPU_CACHE=f16 "$check" chunks "$tiny"
step "batch invariance, f16 latent cache" env X4_GPU_CACHE=f16 "$check" batch "$tiny"
step "fixture, f16 latent cache, fp32 decode attention (rel <= 1e-2)" env X4_GPU_CACHE=f16 X4_CUDA_DECODE_ATTN=fp32 \
        "$check" fixture "$fixture" --no-cpu
# the tensor-core attention (X4_CUDA_ATTN=tc: f16 inputs, its own bits) against the float64
# reference at the f16 cache's tolerance, and invariant by itself
step "fixture, tensor-core attention (rel <= 1e-2)" env X4_CUDA_ATTN=tc X4_GPU_CACHE=f16 "$check" fixture "$fixture" --no-cpu
step "batch invariance, tensor-core attention" env X4_CUDA_ATTN=tc "$check" batch "$tiny"
step "chunk invariance, tensor-core attention" env X4_CUDA_ATTN=tc "$check" chunks "$tiny"
# X4_CUDA_ATTN=tc2: one pass over a part, online softmax (its own bits, the same bounds)
step "fixture, tensor-core attention tc2 (rel <= 1e-2)" env X4_CUDA_ATTN=tc2 X4_GPU_CACHE=f16 "$check" fixture "$fixture" --no-cpu
step "fixture, tensor-core attention tc2, f32 cache (rel <= 1e-2)" env X4_CUDA_ATTN=tc2 "$check" fixture "$fixture" --no-cpu
step "batch invariance, tensor-core attention tc2" env X4_CUDA_ATTN=tc2 "$check" batch "$tiny"
step "chunk invariance, tensor-core attention tc2" env X4_CUDA_ATTN=tc2 "$check" chunks "$tiny"
# the tensor-core products (X4_CUDA_MM=tc: bf16 inputs, their own bits, every token count)
step "fixture, tensor-core products (rel <= 1e-2)" env X4_CUDA_MM=tc "$check" fixture "$fixture" --no-cpu
step "batch invariance, tensor-core products" env X4_CUDA_MM=tc "$check" batch "$tiny"
step "chunk invariance, tensor-core products" env X4_CUDA_MM=tc "$check" chunks "$tiny"
# the default on sm_80+ (every token on the tensor-core products, the f16 cache, prompts labeled
# as the daemon labels them and run in passes of their own for the prompt attention)
step "fixture, tensor-core products, prompts labeled (rel <= 1e-2)" env X4_CUDA_MM=tc X4_GPU_PROMPT=1 \
        "$check" fixture "$fixture" --no-cpu
step "prompt and generated tokens, tensor-core products" env X4_CUDA_MM=tc "$check" classes "$tiny"
step "batch invariance, tensor-core products, prompts labeled, f16 cache" env X4_CUDA_MM=tc X4_GPU_PROMPT=1 \
        X4_GPU_CACHE=f16 "$check" batch "$tiny"
step "chunk invariance, tensor-core products, prompts labeled, f16 cache" env X4_CUDA_MM=tc X4_GPU_PROMPT=1 \
        X4_GPU_CACHE=f16 "$check" chunks "$tiny"
# prompt tokens labeled as the daemon labels them (x4_seq.prompt_tokens): on sm_80+ they take the
# tensor-core products in passes of their own, generated tokens the fp32 kernels (X4_CUDA_MM=fp32)
step "fixture, prompts labeled (rel <= 1e-2)" env X4_GPU_PROMPT=1 "$check" fixture "$fixture" --no-cpu
step "prompt and generated tokens: chunks, a mixed batch, the bound between them" "$check" classes "$tiny"
step "batch invariance, prompts labeled" env X4_GPU_PROMPT=1 "$check" batch "$tiny"
step "chunk invariance, prompts labeled" env X4_GPU_PROMPT=1 "$check" chunks "$tiny"
# unrefused PATTERN COMMAND...: the command's output passed on; it fails when its stderr names
# PATTERN (a knob the backend refused, so the default ran and the step would pass vacuously)
unrefused() {
        local pat=$1 rc
        shift
        "$@" 2>"$tmp/unrefused.err"
        rc=$?
        cat "$tmp/unrefused.err" >&2
        [ $rc -eq 0 ] || return $rc
        if grep -q -- "$pat" "$tmp/unrefused.err"; then echo "refused: $pat"; return 1; fi
}
# mha.cu with the f16 latent cache (opt-in there: X4_CUDA_ATTN_PROMPT=mha; the backend says on its
# log when it cannot take it)
step "fixture, f16 latent cache, prompts labeled, mha.cu (rel <= 1e-2)" \
        unrefused "X4_CUDA_ATTN_PROMPT=mha" \
        env X4_GPU_PROMPT=1 X4_GPU_CACHE=f16 X4_CUDA_ATTN_PROMPT=mha "$check" fixture "$fixture" --no-cpu
step "chunk invariance, f16 latent cache, prompts labeled, mha.cu" \
        unrefused "X4_CUDA_ATTN_PROMPT=mha" \
        env X4_GPU_PROMPT=1 X4_GPU_CACHE=f16 X4_CUDA_ATTN_PROMPT=mha "$check" chunks "$tiny"
step "batch invariance, f16 latent cache, prompts labeled, mha.cu" \
        unrefused "X4_CUDA_ATTN_PROMPT=mha" \
        env X4_GPU_PROMPT=1 X4_GPU_CACHE=f16 X4_CUDA_ATTN_PROMPT=mha "$check" batch "$tiny"

# x4-logits --device cuda (the tool users run) on fixture case1 vs the f64 reference and the CPU
py=
for p in /usr/bin/python3 python3; do
        if "$p" -c 'import numpy' 2>/dev/null; then py=$p; break; fi
done
c1_prompt=1,1,468,201,75,111,216,192,175,5,9,486
c1_decode=446,303,505,189
if step "x4-logits --device cuda" "$build/tools/x4-logits" --model "$tiny" --prompt $c1_prompt \
        --decode $c1_decode --device cuda --out "$tmp/c1-cuda.bin" &&
        step "x4-logits --device cpu" "$build/tools/x4-logits" --model "$tiny" --prompt $c1_prompt \
                --decode $c1_decode --device cpu --out "$tmp/c1-cpu.bin"; then
        if [ -n "$py" ]; then
                step "x4-logits cuda vs f64 reference" "$py" tests/gpu/compare.py "$tmp/c1-cuda.bin" \
                        "$fixture/case1_short.ref_f64.f32.bin" 512 1e-3 "x4-logits cuda vs f64"
                step "x4-logits cuda vs cpu" "$py" tests/gpu/compare.py "$tmp/c1-cuda.bin" \
                        "$tmp/c1-cpu.bin" 512 1e-3 "x4-logits cuda vs cpu"
        else
                results+=("FAIL  no python3 with numpy for the x4-logits comparison")
                failed=1
        fi
fi
# the demo's shapes with 40 heads and 2 layers: k_attn_dtc's head groups of 16 (16, 16, 8) and of
# 32 (32, 8) both end in a partial block, of 8 in five (dtc_same, the sanitizers' blocks of 16 and
# 8 heads)
mkdir -p "$tmp/h40"
step "make demo model with 40 heads" "$build/tools/x4-mkmodel" --preset demo --heads 40 --layers 2 --quiet \
        --out "$tmp/h40/h40.gguf"
# a demo model 1,280 wide (five mHC blocks a token: 4 router rows each), made once where a step
# needs it
h1280_model() {
        mkdir -p "$tmp/hcr"
        [ -f "$tmp/hcr/h1280.gguf" ] || "$build/tools/x4-mkmodel" --preset demo --hidden 1280 --layers 3 --quiet \
                --out "$tmp/hcr/h1280.gguf"
}
if step "make demo model" "$build/tools/x4-mkmodel" --preset demo --quiet --out "$tmp/demo.gguf"; then
        step "cuda vs cpu, demo model, 512 + 64 greedy" "$check" parity "$tmp/demo.gguf" 512 64
        step "batch invariance, demo model" "$check" batch "$tmp/demo.gguf"
        # x4-logits --experts on the CUDA backend (route_trace) and the measurement knob that
        # spreads each token's experts (X4_CUDA_ROUTE_SPREAD=1): it says its results are wrong, and
        # both runs report every MoE layer with at least its k experts (the demo's 16 experts are
        # about all taken by 64 tokens either way: the counts themselves are printed, not compared)
        route_spread() {
                local p64 n0 n1
                p64=$(awk 'BEGIN { for (i = 0; i < 64; i++) printf "%s%d", i ? "," : "", 5 + 61 * i }')
                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$p64" --device cuda --experts \
                        --out "$tmp/rs0.bin" >"$tmp/rs0.txt" || return 1
                X4_CUDA_ROUTE_SPREAD=1 "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$p64" --device cuda \
                        --experts --out "$tmp/rs1.bin" >"$tmp/rs1.txt" 2>"$tmp/rs1.err" || return 1
                grep -q "X4_CUDA_ROUTE_SPREAD=1: .*every result is wrong" "$tmp/rs1.err" || { cat "$tmp/rs1.err"; return 1; }
                cat "$tmp/rs0.txt" "$tmp/rs1.txt"
                n0=$(grep -c 'routed experts selected by 64 tokens' "$tmp/rs0.txt")
                n1=$(grep -c 'routed experts selected by 64 tokens' "$tmp/rs1.txt")
                [ "$n0" -gt 0 ] && [ "$n0" -eq "$n1" ] || { echo "MoE layers reported: $n0 without, $n1 with the spread"; return 1; }
                ! awk '$3 < 4 { bad = 1 } END { exit !bad }' "$tmp/rs0.txt" "$tmp/rs1.txt" ||
                        { echo "a layer reported fewer than 4 experts"; return 1; }
        }
        step "x4-logits --experts on cuda; the expert-spread measurement knob runs, demo model" route_spread
        # x4-bench --profile's bytes and bandwidth a class (the backend's count of what a step had to
        # move): at batch 1 every weight class reports MB and GB/s, and a step's MB stay under the
        # file's size plus the logits (batch 1 reads k of the routed experts and one embedding row)
        profile_bytes() {
                "$build/tools/x4-bench" --model "$tmp/demo.gguf" --device cuda --prefill none --decode-ctx 64 --batch 1 \
                        --decode-tokens 4 --repeats 1 --profile --json >"$tmp/prof.jsonl" || return 1
                python3 - "$tmp/prof.jsonl" "$(stat -c %s "$tmp/demo.gguf")" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
prof = [r for r in rows if r.get("what") == "profile"]
assert prof, "no profile line"
cl = {c["name"]: c for c in prof[0]["classes"]}
for name in ("attention projections", "experts (MoE)", "head", "hc (mHC pre/post)", "attention", "router"):
    assert name in cl, f"class {name} missing: {sorted(cl)}"
    assert cl[name]["mb"] > 0 and cl[name]["gb_s"] > 0, f"{name}: {cl[name]}"
total = sum(c["mb"] for c in cl.values() if c["name"] != "copies")
assert 0 < total * 1e6 < int(sys.argv[2]) + 8192 * 4 * 2, f"{total} MB against a {sys.argv[2]}-byte file"
for c in sorted(cl.values(), key=lambda c: -c["ms"]):
    print(f"  {c['name']:24s} {c['ms']:8.4f} ms {c['mb']:9.3f} MB {c['gb_s']:8.1f} GB/s")
PY
        }
        step "x4-bench --profile: MB and GB/s a class at batch 1, demo model" profile_bytes
        step "chunk invariance, demo model" "$check" chunks "$tmp/demo.gguf"
        step "prompt and generated tokens, demo model" "$check" classes "$tmp/demo.gguf"
        # every attention kernel computes in the one canonical order (kernels/cuda/mla.cu): the
        # same logits, bit for bit, whichever runs (a 700-token prompt: six parts of the cache)
        attn_same() {
                local k prompt
                prompt=$(awk 'BEGIN { s = 7; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for k in split dec2 dec4 part; do
                        X4_CUDA_ATTN=$k "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" \
                                --decode 9,99,999 --device cuda --out "$tmp/attn-$k.bin" || return 1
                done
                for k in dec2 dec4 part; do
                        cmp "$tmp/attn-split.bin" "$tmp/attn-$k.bin" || { echo "attention $k differs from split"; return 1; }
                done
                # the combine against its per-value reference (X4_CUDA_COMBINE=ref), six parts a query
                X4_CUDA_COMBINE=ref X4_CUDA_ATTN=split "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" \
                        --decode 9,99,999 --device cuda --out "$tmp/attn-ref.bin" || return 1
                cmp "$tmp/attn-split.bin" "$tmp/attn-ref.bin" || { echo "the combine differs from its reference"; return 1; }
                # the split path's launch shapes (heads a scores block; heads, values a P·c block)
                for k in 8,32,64 16,16,64 8,16,64 16,32,32 8,16,32 16,16,32; do
                        X4_CUDA_ATTN=split X4_CUDA_SPLIT=$k "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --prompt "$prompt" --decode 9,99,999 --device cuda --out "$tmp/attn-s$k.bin" \
                                2>"$tmp/attn-s$k.err" || { cat "$tmp/attn-s$k.err"; return 1; }
                        if grep -q "X4_CUDA_SPLIT" "$tmp/attn-s$k.err"; then cat "$tmp/attn-s$k.err"; return 1; fi
                        cmp "$tmp/attn-split.bin" "$tmp/attn-s$k.bin" || { echo "split shape $k differs"; return 1; }
                done
                echo "attention kernels split (7 launch shapes), dec2, dec4, part: identical logits ($(stat -c %s "$tmp/attn-split.bin") bytes)"
        }
        step "attention kernels agree bit for bit, demo model" attn_same
        # k_attn_dtc (the f16 cache's decode attention) computes k_attn_tc2's arithmetic for one
        # token: the same logits bit for bit with the same part length (x4-logits does not label
        # prompts, so every token of a run takes the decode kernel: a 700-token prompt, three or
        # eleven parts a query), and not the fp32 kernels' (so it did run)
        dtc_same() {
                local prompt part
                prompt=$(awk 'BEGIN { s = 29; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                # (X4_CUDA_DTC_2SM=0: the kernels of one block an SM, which the 700-token passes' grids
                # would otherwise leave for the lean layout below)
                for part in 256 64; do
                        X4_CUDA_DTC_2SM=0 X4_CUDA_ATTN_DECODE_PART=$part "$build/tools/x4-logits" --model "$tmp/demo.gguf" --cache f16 \
                                --prompt "$prompt" --decode 9,99,999 --device cuda --out "$tmp/dtc-$part.bin" || return 1
                        X4_CUDA_ATTN=tc2 X4_CUDA_ATTN_PROMPT_PART=$part "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --cache f16 --prompt "$prompt" --decode 9,99,999 --device cuda --out "$tmp/tc2-$part.bin" || return 1
                        cmp "$tmp/dtc-$part.bin" "$tmp/tc2-$part.bin" || { echo "k_attn_dtc differs from k_attn_tc2 (parts of $part)"; return 1; }
                done
                # by default the parts follow the position (cu_dtc_plen): 64 below 2,048 (and the
                # layout follows the grid: X4_CUDA_DTC_2SM unset)
                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --cache f16 --prompt "$prompt" --decode 9,99,999 \
                        --device cuda --out "$tmp/dtc-def.bin" || return 1
                cmp "$tmp/dtc-64.bin" "$tmp/dtc-def.bin" || { echo "k_attn_dtc's default parts are not 64 below 2,048"; return 1; }
                # one sub-part a round (X4_CUDA_DTC_PAIR=0; the default takes two where the ring
                # holds them): the same chains, the same bits
                for part in 256 64; do
                        X4_CUDA_DTC_2SM=0 X4_CUDA_DTC_PAIR=0 X4_CUDA_ATTN_DECODE_PART=$part "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --cache f16 --prompt "$prompt" --decode 9,99,999 --device cuda --out "$tmp/dtcp-$part.bin" || return 1
                        cmp "$tmp/dtc-$part.bin" "$tmp/dtcp-$part.bin" || { echo "X4_CUDA_DTC_PAIR=0 differs (parts of $part)"; return 1; }
                done
                # the lean layout, two blocks an SM (X4_CUDA_DTC_2SM=1: every launch; by default
                # only grids of two blocks an SM): a ring of two, the rope keys in one buffer, p in
                # the scores' rows; the same chains, the same bits. A device or shape it cannot
                # run on says so on stderr (and the default runs): not this test
                for part in 256 64; do
                        X4_CUDA_DTC_2SM=1 X4_CUDA_ATTN_DECODE_PART=$part "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --cache f16 --prompt "$prompt" --decode 9,99,999 --device cuda --out "$tmp/dtcl-$part.bin" \
                                2>"$tmp/dtcl-$part.err" || { cat "$tmp/dtcl-$part.err"; return 1; }
                        if grep -q "X4_CUDA_DTC_2SM" "$tmp/dtcl-$part.err"; then cat "$tmp/dtcl-$part.err"; return 1; fi
                        cmp "$tmp/dtc-$part.bin" "$tmp/dtcl-$part.bin" || { echo "X4_CUDA_DTC_2SM=1 differs (parts of $part)"; return 1; }
                done
                # small head groups (X4_CUDA_DTC_HG=16|8: 16 or 8 heads a block, every launch; by
                # default only grids that still fit one wave): the same chains, the same bits, in
                # rounds of two sub-parts and of one. The demo model's 8 heads fill half a block of
                # 16; a 40-head model (blocks of 16, 16, 8 and of 8 against 32, 8) below
                for part in 256 64; do
                        for pair in 1 0; do
                                for hg in 16 8; do
                                        X4_CUDA_DTC_2SM=0 X4_CUDA_DTC_HG=$hg X4_CUDA_DTC_PAIR=$pair X4_CUDA_ATTN_DECODE_PART=$part \
                                                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --cache f16 --prompt "$prompt" \
                                                --decode 9,99,999 --device cuda --out "$tmp/dtch-$part.bin" 2>"$tmp/dtch.err" ||
                                                { cat "$tmp/dtch.err"; return 1; }
                                        if grep -q "X4_CUDA_DTC_HG" "$tmp/dtch.err"; then cat "$tmp/dtch.err"; return 1; fi
                                        cmp "$tmp/dtc-$part.bin" "$tmp/dtch-$part.bin" || { echo "X4_CUDA_DTC_HG=$hg differs" \
                                                "(parts of $part, X4_CUDA_DTC_PAIR=$pair)"; return 1; }
                                done
                        done
                done
                for hg in 32 16 8; do
                        X4_CUDA_DTC_2SM=0 X4_CUDA_DTC_HG=$hg X4_CUDA_ATTN_DECODE_PART=64 "$build/tools/x4-logits" \
                                --model "$tmp/h40/h40.gguf" --cache f16 --prompt "$prompt" --decode 9,99,999 --device cuda \
                                --out "$tmp/h40/hg$hg.bin" 2>"$tmp/dtch.err" || { cat "$tmp/dtch.err"; return 1; }
                        if grep -q "X4_CUDA_DTC_HG" "$tmp/dtch.err"; then cat "$tmp/dtch.err"; return 1; fi
                done
                # and against k_attn_tc2 (the same arithmetic in blocks of 32 heads)
                X4_CUDA_ATTN=tc2 X4_CUDA_ATTN_PROMPT_PART=64 "$build/tools/x4-logits" --model "$tmp/h40/h40.gguf" --cache f16 \
                        --prompt "$prompt" --decode 9,99,999 --device cuda --out "$tmp/h40/tc2.bin" || return 1
                for hg in 32 16 8; do
                        cmp "$tmp/h40/hg$hg.bin" "$tmp/h40/tc2.bin" || { echo "X4_CUDA_DTC_HG=$hg differs from k_attn_tc2, 40 heads"; return 1; }
                done
                X4_CUDA_DECODE_ATTN=fp32 "$build/tools/x4-logits" --model "$tmp/demo.gguf" --cache f16 \
                        --prompt "$prompt" --decode 9,99,999 --device cuda --out "$tmp/dtc-fp32.bin" || return 1
                if cmp -s "$tmp/dtc-def.bin" "$tmp/dtc-fp32.bin"; then
                        echo "X4_CUDA_DECODE_ATTN=fp32 gave k_attn_dtc's bits: the decode kernel did not run"
                        return 1
                fi
                # the combine with its scale chains staged once a head (the default) against the per-value
                # chains (X4_CUDA_COMBINE=ref): eleven parts a query at the end of the prompt
                X4_CUDA_COMBINE=ref X4_CUDA_ATTN_DECODE_PART=64 "$build/tools/x4-logits" --model "$tmp/demo.gguf" --cache f16 \
                        --prompt "$prompt" --decode 9,99,999 --device cuda --out "$tmp/dtc-ref.bin" || return 1
                cmp "$tmp/dtc-64.bin" "$tmp/dtc-ref.bin" || { echo "the combine differs from its reference (f16 cache)"; return 1; }
                echo "k_attn_dtc = k_attn_tc2 = k_attn_dtc two blocks an SM = blocks of 16 and 8 heads (parts of 256 and 64; 40 heads), combine = its reference: identical logits ($(stat -c %s "$tmp/dtc-256.bin") bytes)"
        }
        step "decode attention on tensor cores equals k_attn_tc2 bit for bit, demo model" dtc_same
        step "cuda (f16 cache) vs cpu, demo model, 512 + 64 greedy" env X4_GPU_CACHE=f16 "$check" parity "$tmp/demo.gguf" 512 64
        step "batch invariance, demo model, f16 cache" env X4_GPU_CACHE=f16 "$check" batch "$tmp/demo.gguf"
        # the default on sm_80+: tensor-core products, the f16 cache, prompts labeled
        step "cuda (defaults: tensor-core products, f16 cache, prompts labeled) vs cpu, demo model, 512 + 64 greedy" \
                env X4_CUDA_MM=tc X4_CUDA_MM_Q6TC=1 X4_GPU_CACHE=f16 X4_GPU_PROMPT=1 "$check" parity "$tmp/demo.gguf" 512 64
        step "batch invariance, demo model, defaults (tensor-core products, f16 cache)" env X4_CUDA_MM=tc \
                X4_CUDA_MM_Q6TC=1 X4_GPU_CACHE=f16 "$check" batch "$tmp/demo.gguf"
        step "chunk invariance, demo model, f16 cache, prompts labeled" env X4_GPU_CACHE=f16 X4_GPU_PROMPT=1 \
                "$check" chunks "$tmp/demo.gguf"
        # decode attention in token groups (X4_CUDA_ATTN_CHUNK: groups of 3 tokens, each group's
        # attention and combine before the next reuses the part rows; graphs and eager steps)
        step "batch invariance, demo model, defaults, attention in groups of 3 tokens" env X4_CUDA_ATTN_CHUNK=3 \
                X4_CUDA_MM=tc X4_CUDA_MM_Q6TC=1 X4_GPU_CACHE=f16 "$check" batch "$tmp/demo.gguf"
        step "batch invariance, demo model, f32 cache, attention in groups of 3 tokens" env X4_CUDA_ATTN_CHUNK=3 \
                "$check" batch "$tmp/demo.gguf"
        step "compute-sanitizer memcheck, batch, attention in groups of 3 tokens" env X4_CUDA_ATTN_CHUNK=3 \
                X4_GPU_CACHE=f16 compute-sanitizer --tool memcheck --error-exitcode 9 \
                "$check" batch "$tiny"
        # the many-input product kernel (k_mm) computes k_matvec's order: the same logits with it
        # turned off (a 700-token prompt at once: every BF16/IQ4_NL projection and the grouped
        # expert tiles go through k_mm; the decode steps through k_mv_small either way)
        mm_same() {
                local prompt
                prompt=$(awk 'BEGIN { s = 11; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" --decode 9,99,999 \
                        --device cuda --out "$tmp/mm-on.bin" || return 1
                X4_CUDA_MM=0 "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" \
                        --decode 9,99,999 --device cuda --out "$tmp/mm-off.bin" || return 1
                cmp "$tmp/mm-on.bin" "$tmp/mm-off.bin" || { echo "k_mm differs from k_matvec"; return 1; }
                echo "k_mm on/off: identical logits ($(stat -c %s "$tmp/mm-on.bin") bytes)"
        }
        step "many-input products agree bit for bit with k_matvec, demo model" mm_same
        # the Q6_K head in k_mm (the default; X4_CUDA_MM_Q6K=0 keeps k_matvec): the 700 prompt
        # rows' logits through it against k_matvec's 8-input tiles; batch 64 against batch 1 (k_mv_small)
        mm_q6k_same() {
                local prompt
                prompt=$(awk 'BEGIN { s = 11; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                X4_CUDA_MM_Q6K=0 "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" \
                        --decode 9,99,999 --device cuda --out "$tmp/q6-off.bin" || return 1
                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" \
                        --decode 9,99,999 --device cuda --out "$tmp/q6-on.bin" || return 1
                cmp "$tmp/q6-on.bin" "$tmp/q6-off.bin" || { echo "the Q6_K head in k_mm differs from k_matvec"; return 1; }
                echo "Q6_K head, k_mm vs k_matvec: identical logits ($(stat -c %s "$tmp/q6-on.bin") bytes)"
                "$check" batch "$tmp/demo.gguf"
        }
        step "Q6_K head in k_mm agrees bit for bit with k_matvec and across batches, demo model" mm_q6k_same
        step "compute-sanitizer memcheck, Q6_K head in k_mm, demo model" compute-sanitizer \
                --tool memcheck --error-exitcode 9 "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                --prompt 5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24 --decode 9 --device cuda --out "$tmp/san-q6.bin"
        # the mHC pre-mapping's three shapes (one fused kernel a token; the token-tiled pair the
        # default takes for batches of 2-127 tokens; k_hc_wtok and the tail, its choice for passes
        # of 128 or more) compute the same sums: the same logits with every launch forced to each
        # (a 700-token prompt, then batch-1 decodes)
        hc_same() {
                local prompt mode
                prompt=$(awk 'BEGIN { s = 17; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                X4_CUDA_HC='' "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" --decode 9,99,999 \
                        --device cuda --out "$tmp/hc-default.bin" || return 1
                for mode in fused tiled wtok; do
                        X4_CUDA_HC=$mode "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" \
                                --decode 9,99,999 --device cuda --out "$tmp/hc-$mode.bin" 2>"$tmp/hc-$mode.err" || return 1
                        # a forced tiled kernel that cannot run says so (and the fused one runs): not this test
                        if grep -q "X4_CUDA_HC=tiled\|X4_CUDA_HC=wtok" "$tmp/hc-$mode.err"; then cat "$tmp/hc-$mode.err"; return 1; fi
                        cmp "$tmp/hc-default.bin" "$tmp/hc-$mode.bin" || { echo "X4_CUDA_HC=$mode differs"; return 1; }
                done
                echo "mHC fused / tiled / a warp a token / default: identical logits ($(stat -c %s "$tmp/hc-default.bin") bytes)"
        }
        step "mHC fused and token-tiled kernels agree bit for bit, demo model" hc_same
        # X4_CUDA_HC_EARLY=1: fused pre-mappings leave their post gates and Sinkhorn to the next
        # post-mapping kernel (the next fused pre-mapping, or the last post-mapping), which computes
        # them from the same partial rows before its wait: the same logits, for batch-1 decodes
        # after a prompt (tiled passes) and with every pass fused (X4_CUDA_HC=fused)
        hc_early_same() {
                local prompt hc
                prompt=$(awk 'BEGIN { s = 47; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for hc in default fused; do
                        X4_CUDA_HC=$([ $hc = fused ] && echo fused) X4_CUDA_HC_EARLY=0 "$build/tools/x4-logits" \
                                --model "$tmp/demo.gguf" --prompt "$prompt" --decode 9,99,999 --device cuda \
                                --out "$tmp/hce-off-$hc.bin" || return 1
                        X4_CUDA_HC=$([ $hc = fused ] && echo fused) X4_CUDA_HC_EARLY=1 "$build/tools/x4-logits" \
                                --model "$tmp/demo.gguf" --prompt "$prompt" --decode 9,99,999 --device cuda \
                                --out "$tmp/hce-on-$hc.bin" || return 1
                        cmp "$tmp/hce-off-$hc.bin" "$tmp/hce-on-$hc.bin" || { echo "X4_CUDA_HC_EARLY=1 differs ($hc)"; return 1; }
                done
                X4_CUDA_HC_EARLY=log "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt 5,6,7 --decode 9 \
                        --device cuda --out "$tmp/hce-log.bin" 2>"$tmp/hce-log.txt" || { cat "$tmp/hce-log.txt"; return 1; }
                grep -q '^mHC early gates: 1 token' "$tmp/hce-log.txt" || { echo "early gates never on"; cat "$tmp/hce-log.txt"; return 1; }
                X4_CUDA_HC_EARLY=1 "$check" batch "$tmp/demo.gguf" || return 1
                X4_CUDA_HC_EARLY=1 X4_CUDA_MM=tc X4_GPU_CACHE=f16 "$check" batch "$tmp/demo.gguf" || return 1
                echo "mHC early gates: identical logits (decodes after tiled and fused passes); batch invariance"
        }
        step "mHC early gates agree bit for bit, demo model" hc_early_same
        # X4_CUDA_ROPE_SIDE=1: the queries' RoPE as extra blocks of the absorb product (k_mm_tcs,
        # up to 8 tokens; its own kernel after the product otherwise): the same logits for a
        # prompt in chunks of 5 and batch-1 decodes (its log line: that the side blocks ran), and
        # batch invariance on tensor cores (the solo prefills of up to 8 tokens and the decodes
        # take the side blocks, the batched passes the separate kernel) and on the fp32 products
        # (the separate kernel)
        rope_side_same() {
                local prompt v
                prompt=$(awk 'BEGIN { s = 59; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for v in 0 1; do
                        X4_CUDA_MM=tc X4_CUDA_ROPE_SIDE=$v X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --prompt "$prompt" --chunk 5 --decode 9,99,999 --device cuda --out "$tmp/rs-$v.bin" \
                                2>"$tmp/rs-$v.log" || { cat "$tmp/rs-$v.log"; return 1; }
                done
                grep -q '^k_mm_tcs: rope side blocks' "$tmp/rs-1.log" || { echo "the rope side blocks never ran"; return 1; }
                cmp "$tmp/rs-0.bin" "$tmp/rs-1.bin" || { echo "X4_CUDA_ROPE_SIDE=1 differs"; return 1; }
                X4_CUDA_MM=tc X4_CUDA_ROPE_SIDE=1 X4_GPU_CACHE=f16 "$check" batch "$tmp/demo.gguf" || return 1
                X4_CUDA_ROPE_SIDE=1 "$check" batch "$tmp/demo.gguf" || return 1
                echo "queries' RoPE beside the absorb product: identical logits; batch invariance"
        }
        step "queries' RoPE as side blocks agrees bit for bit, demo model" rope_side_same
        # k_hc_wtok (X4_CUDA_HC=wtok: a warp a token of the slice) where the last slice is partial
        # (hidden 288: 32 of its 256 positions, four lanes of a warp) and across batches
        hc_wtok_same() {
                local prompt
                mkdir -p "$tmp/h288" # its own folder (config.json; see wide_same)
                "$build/tools/x4-mkmodel" --preset demo --hidden 288 --layers 2 --output-type BF16 --quiet \
                        --out "$tmp/h288/h288.gguf" || return 1
                prompt=$(awk 'BEGIN { s = 41; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                X4_CUDA_HC='' "$build/tools/x4-logits" --model "$tmp/h288/h288.gguf" --prompt "$prompt" --decode 9,99,999 \
                        --device cuda --out "$tmp/h288-default.bin" || return 1
                X4_CUDA_HC=wtok "$build/tools/x4-logits" --model "$tmp/h288/h288.gguf" --prompt "$prompt" --decode 9,99,999 \
                        --device cuda --out "$tmp/h288-wtok.bin" 2>"$tmp/h288-wtok.err" || return 1
                if grep -q "X4_CUDA_HC=wtok" "$tmp/h288-wtok.err"; then cat "$tmp/h288-wtok.err"; return 1; fi
                cmp "$tmp/h288-default.bin" "$tmp/h288-wtok.bin" || { echo "X4_CUDA_HC=wtok differs (hidden 288)"; return 1; }
                # the HC weights stored F32 (staged swizzled) and F16 (the mHC fn follows --attn-type)
                local ty
                for ty in F32 F16; do
                        mkdir -p "$tmp/h288-$ty"
                        "$build/tools/x4-mkmodel" --preset demo --hidden 288 --layers 2 --output-type BF16 --attn-type $ty \
                                --quiet --out "$tmp/h288-$ty/h288.gguf" || return 1
                        X4_CUDA_HC='' "$build/tools/x4-logits" --model "$tmp/h288-$ty/h288.gguf" --prompt "$prompt" \
                                --decode 9,99 --device cuda --out "$tmp/h288-$ty-default.bin" || return 1
                        X4_CUDA_HC=wtok "$build/tools/x4-logits" --model "$tmp/h288-$ty/h288.gguf" --prompt "$prompt" --decode 9,99 \
                                --device cuda --out "$tmp/h288-$ty-wtok.bin" 2>"$tmp/h288-$ty-wtok.err" || return 1
                        if grep -q "X4_CUDA_HC=wtok" "$tmp/h288-$ty-wtok.err"; then cat "$tmp/h288-$ty-wtok.err"; return 1; fi
                        cmp "$tmp/h288-$ty-default.bin" "$tmp/h288-$ty-wtok.bin" ||
                                { echo "X4_CUDA_HC=wtok differs (hidden 288, $ty HC weights)"; return 1; }
                done
                X4_CUDA_HC=wtok "$check" batch "$tmp/demo.gguf" || return 1
                X4_CUDA_HC=wtok "$check" chunks "$tmp/demo.gguf" || return 1
                echo "hidden 288 (BF16, F32, F16 HC weights): mHC a warp a token = default; batch and chunk invariance with it"
        }
        step "mHC a warp a token: a partial slice, batches and chunks, bit for bit" hc_wtok_same
        # the one-input decode products (k_mv_small: a block per input at batch 1 and per expert
        # pair) give the same bits however many rows a warp takes (X4_CUDA_RW) and with the whole
        # input staged at once (X4_CUDA_FULLX=1) or compiled without the 4-blocks-an-SM bound (X4_CUDA_MINB=1):
        # batch-1 decodes after a 700-token prompt
        rw_same() {
                local prompt v
                prompt=$(awk 'BEGIN { s = 23; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" --decode 9,99,999 \
                        --device cuda --out "$tmp/rw-default.bin" || return 1
                for v in RW=1 RW=2 RW=4 FULLX=1 MINB=1; do
                        env X4_CUDA_$v "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" \
                                --decode 9,99,999 --device cuda --out "$tmp/rw-$v.bin" || return 1
                        cmp "$tmp/rw-default.bin" "$tmp/rw-$v.bin" || { echo "X4_CUDA_$v differs"; return 1; }
                done
                echo "k_mv_small rows a warp 1/2/4, whole-x staging, no blocks-an-SM bound, default: identical logits ($(stat -c %s "$tmp/rw-default.bin") bytes)"
        }
        step "one-input decode products agree bit for bit whatever rows a warp and x staging, demo model" rw_same
        # X4_CUDA_L2PF=1: the mHC pre-mappings, the decode attention and the expert gate-up ask the
        # L2 for the next products' weights (cp.async.bulk.prefetch on sm_90); X4_CUDA_CARVEOUT_MAX=1:
        # every kernel the largest shared-memory carveout. Neither moves a value, so with the
        # defaults' kernels (tensor-core products, the f16 cache's decode attention) batch-1 decodes
        # after a 300-token prompt and the batch test's 16-sequence steps give the same logits bit
        # for bit, also with each kernel's prefetch cut to 1 MiB (X4_CUDA_L2PF_MB); each knob's log
        # line says it was taken
        l2pf_same() {
                local prompt v
                local env=(X4_CUDA_MM=tc X4_CUDA_MM_Q6TC=1 X4_GPU_CACHE=f16)
                prompt=$(awk 'BEGIN { s = 31; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for v in 0 1 1mb co; do
                        local pf=(X4_CUDA_L2PF=0) want=""
                        case $v in
                        1) pf=(X4_CUDA_L2PF=1) want="X4_CUDA_L2PF=1: decode passes" ;;
                        1mb) pf=(X4_CUDA_L2PF=1 X4_CUDA_L2PF_MB=1) want="X4_CUDA_L2PF=1: decode passes" ;;
                        co) pf=(X4_CUDA_CARVEOUT_MAX=1) want="X4_CUDA_CARVEOUT_MAX=1: every kernel" ;;
                        esac
                        env "${env[@]}" "${pf[@]}" "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" \
                                --chunk 64 --cache f16 --decode 9,99,999 --device cuda --out "$tmp/l2pf-$v.bin" \
                                2>"$tmp/l2pf-$v.err" || { cat "$tmp/l2pf-$v.err"; return 1; }
                        if [ -n "$want" ] && ! grep -q "$want" "$tmp/l2pf-$v.err"; then
                                echo "${pf[*]} was not taken"; cat "$tmp/l2pf-$v.err"; return 1
                        fi
                        env "${env[@]}" "${pf[@]}" X4_GPU_BATCH_DUMP="$tmp/l2pf-$v-batch.bin" "$check" batch "$tmp/demo.gguf" ||
                                return 1
                done
                for v in 1 1mb co; do
                        cmp "$tmp/l2pf-0.bin" "$tmp/l2pf-$v.bin" || { echo "mode $v changed the decode logits"; return 1; }
                        cmp "$tmp/l2pf-0-batch.bin" "$tmp/l2pf-$v-batch.bin" || { echo "mode $v changed the batch logits"; return 1; }
                done
                echo "L2 prefetch (whole, cut to 1 MiB) and the largest carveout: identical logits ($(stat -c %s "$tmp/l2pf-0.bin") and $(stat -c %s "$tmp/l2pf-0-batch.bin") bytes)"
        }
        step "L2 prefetch and the largest carveout leave every logit as it was, demo model" l2pf_same
        step "batch invariance, demo model, tensor-core products" env X4_CUDA_MM=tc "$check" batch "$tmp/demo.gguf"
        step "chunk invariance, demo model, tensor-core products" env X4_CUDA_MM=tc "$check" chunks "$tmp/demo.gguf"
        # the decode-shaped tensor-core kernel (k_mm_tcd, launches of <= 16 tokens) computes
        # k_mm_tc's mma chains: the same logits with it turned off (X4_CUDA_MMTC_DEC=0). A 300-token
        # prompt whole, in chunks of 1, 7 and 16 (dense launches of one and two n-tiles; expert
        # pairs one a block at 7, grouped by expert at 16), then batch-1 decodes; and gpu-check's
        # batch test (prefills of 1..600 tokens alone and batched, batch-16 decode steps)
        tcd_same() {
                local prompt dec c args
                prompt=$(awk 'BEGIN { s = 13; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                # (dense launches of 9-16 inputs take k_mm_tcs's two n-tiles by default; =8 leaves
                # them to k_mm_tcd, which must then run)
                X4_CUDA_MM=tc X4_CUDA_MMTC_DEC=log X4_CUDA_MMTC_TCS_DENSE=8 "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                        --prompt 5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 --decode 9 --device cuda \
                        --out "$tmp/tcd-log8.bin" 2>"$tmp/tcd-log8.txt" || return 1
                grep -q '^k_mm_tcd: ' "$tmp/tcd-log8.txt" || { echo "k_mm_tcd never launched"; return 1; }
                X4_CUDA_MM=tc X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                        --prompt 5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 --decode 9 --device cuda \
                        --out "$tmp/tcd-log.bin" 2>"$tmp/tcd-log.txt" || return 1
                grep -q '^k_mm_tcs: type 30 dense P 16 .* n-tiles 2$' "$tmp/tcd-log.txt" ||
                        { echo "k_mm_tcs never launched with two n-tiles"; cat "$tmp/tcd-log.txt"; return 1; }
                cmp "$tmp/tcd-log8.bin" "$tmp/tcd-log.bin" || { echo "k_mm_tcs's two n-tiles differ from k_mm_tcd"; return 1; }
                # products of <= 8 inputs and expert pairs one a block take k_mm_tcs (a row's
                # 256-value parts over a block's warps: the demo's 512-value rows are two)
                grep -q '^k_mm_tcs: type 30 dense .* K 512 .* warps 2 ' "$tmp/tcd-log.txt" &&
                        grep -q '^k_mm_tcs: type 20 swiglu pairs .* K 512 .* warps 2 ' "$tmp/tcd-log.txt" ||
                        { echo "k_mm_tcs never launched with two warps (BF16, expert pairs)"; cat "$tmp/tcd-log.txt"; return 1; }
                for dec in 0 1; do
                        for c in 0 1 7 16; do
                                args=()
                                [ $c -gt 0 ] && args=(--chunk $c)
                                X4_CUDA_MM=tc X4_CUDA_MMTC_DEC=$dec "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                        --prompt "$prompt" ${args[@]+"${args[@]}"} --decode 9,99,999 --device cuda \
                                        --out "$tmp/tcd-$dec-$c.bin" || return 1
                        done
                        X4_CUDA_MM=tc X4_CUDA_MMTC_DEC=$dec X4_GPU_BATCH_DUMP="$tmp/tcd-$dec-batch.bin" \
                                "$check" batch "$tmp/demo.gguf" || return 1
                done
                for c in 0 1 7 16 batch; do
                        cmp "$tmp/tcd-0-$c.bin" "$tmp/tcd-1-$c.bin" || { echo "k_mm_tcd differs from k_mm_tc ($c)"; return 1; }
                done
                # k_mm_tcs with fewer warps and slots than parts (X4_CUDA_MMTC_SPLIT=WxS): a warp
                # walks several parts and reuses its ring (1x1, 1x2: the dense FFN's 1,024-value
                # rows are four parts on one warp; 2x1); the full model's shapes do this by default
                for ws in 1x1 1x2 2x1; do
                        X4_CUDA_MM=tc X4_CUDA_MMTC_SPLIT=$ws "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --prompt "$prompt" --chunk 7 --decode 9,99,999 --device cuda --out "$tmp/tcs-$ws.bin" || return 1
                        cmp "$tmp/tcd-0-7.bin" "$tmp/tcs-$ws.bin" || { echo "k_mm_tcs ($ws) differs from k_mm_tc"; return 1; }
                done
                # a batch's pairs grouped by expert on k_mm_tcs's tiles of 8 (MT_GROUPED: chunks of 7
                # and 16, the batch test's 16-sequence steps) against the same pairs one a block
                # (X4_CUDA_MMTC_TCS_GROUPED=0: ungrouped below the prefill rule, k_mm_tcd), and it
                # must say it ran
                grep -q '^k_mm_tcs: type 20 swiglu grouped ' "$tmp/tcd-log.txt" ||
                        { echo "k_mm_tcs never launched on group tiles"; cat "$tmp/tcd-log.txt"; return 1; }
                for c in 7 16; do
                        X4_CUDA_MM=tc X4_CUDA_MMTC_TCS_GROUPED=0 "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --prompt "$prompt" --chunk $c --decode 9,99,999 --device cuda --out "$tmp/tcs-g0-$c.bin" || return 1
                        cmp "$tmp/tcd-1-$c.bin" "$tmp/tcs-g0-$c.bin" || { echo "k_mm_tcs's group tiles differ (chunk $c)"; return 1; }
                done
                X4_CUDA_MM=tc X4_CUDA_MMTC_TCS_GROUPED=0 X4_GPU_BATCH_DUMP="$tmp/tcs-g0-batch.bin" "$check" batch "$tmp/demo.gguf" || return 1
                cmp "$tmp/tcd-1-batch.bin" "$tmp/tcs-g0-batch.bin" || { echo "k_mm_tcs's group tiles differ (batch)"; return 1; }
                # the expert pairs' one-wave builds (X4_CUDA_MMTC_ONEWAVE=force: bounded to 5 or 9
                # blocks an SM, fewer registers): the same instructions, the same bits
                X4_CUDA_MM=tc X4_CUDA_MMTC_ONEWAVE=force "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                        --prompt "$prompt" --chunk 7 --decode 9,99,999 --device cuda --out "$tmp/tcs-ow.bin" || return 1
                cmp "$tmp/tcd-0-7.bin" "$tmp/tcs-ow.bin" || { echo "k_mm_tcs's one-wave build differs from k_mm_tc"; return 1; }
                echo "k_mm_tcd vs k_mm_tc, group tiles vs pairs: identical logits (whole, chunks 1/7/16, decode, batch 16)"
                rm -f "$tmp"/tcd-*.bin
        }
        step "decode-shaped tensor-core kernel agrees bit for bit with k_mm_tc, demo model" tcd_same
        # shapes the demo model's 512-wide rows never give (hidden 2,048, three layers): the Q6_K
        # head's staged decode over two tiles of a row (k_mv_small, one row a warp) against the
        # per-lane decode of two rows a warp (X4_CUDA_RW=2) and batch 64 (k_mm); the expert pairs'
        # one-wave build of 8 warps a block (X4_CUDA_MMTC_ONEWAVE=force: the gate-up's 2,048
        # values are 8 parts), which must say it ran (X4_CUDA_MMTC_DEC=log)
        wide_same() {
                local prompt
                # its own folder: x4-mkmodel writes config.json beside the model, and the loader
                # checks it against the GGUF (beside demo.gguf it would break every demo step)
                mkdir -p "$tmp/wide"
                "$build/tools/x4-mkmodel" --preset demo --hidden 2048 --layers 3 --quiet --out "$tmp/wide/wide.gguf" || return 1
                prompt=$(awk 'BEGIN { s = 37; for (i = 0; i < 40; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                # one row a warp (X4_CUDA_RW=1): the staged decode, which hidden 2,048's two tiles a
                # row would otherwise leave for two rows a warp by default
                X4_CUDA_RW=1 "$build/tools/x4-logits" --model "$tmp/wide/wide.gguf" --prompt "$prompt" --decode 9,99,999 \
                        --device cuda --out "$tmp/wide-rw1.bin" || return 1
                X4_CUDA_RW=2 "$build/tools/x4-logits" --model "$tmp/wide/wide.gguf" --prompt "$prompt" --decode 9,99,999 \
                        --device cuda --out "$tmp/wide-rw2.bin" || return 1
                cmp "$tmp/wide-rw1.bin" "$tmp/wide-rw2.bin" || { echo "the Q6_K head's staged decode differs (hidden 2,048)"; return 1; }
                "$check" batch "$tmp/wide/wide.gguf" || return 1
                X4_CUDA_MM=tc "$build/tools/x4-logits" --model "$tmp/wide/wide.gguf" --prompt "$prompt" --decode 9,99,999 \
                        --device cuda --out "$tmp/wide-tc.bin" || return 1
                X4_CUDA_MM=tc X4_CUDA_MMTC_ONEWAVE=force "$build/tools/x4-logits" --model "$tmp/wide/wide.gguf" --prompt "$prompt" \
                        --decode 9,99,999 --device cuda --out "$tmp/wide-ow.bin" || return 1
                cmp "$tmp/wide-tc.bin" "$tmp/wide-ow.bin" || { echo "the one-wave build differs (hidden 2,048)"; return 1; }
                X4_CUDA_MM=tc X4_CUDA_MMTC_ONEWAVE=force X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$tmp/wide/wide.gguf" \
                        --prompt 5 --decode 9 --device cuda --out "$tmp/wide-log.bin" 2>"$tmp/wide-log.txt" || return 1
                grep -q '^k_mm_tcs: one-wave build, 8 warps' "$tmp/wide-log.txt" ||
                        { echo "the one-wave build of 8 warps never ran"; cat "$tmp/wide-log.txt"; return 1; }
                echo "hidden 2,048: the head's staged decode = two rows a warp = batch 64; one-wave build = default: identical logits"
        }
        step "wide shapes: the Q6_K head over several tiles and the one-wave expert build agree bit for bit" wide_same
        # several m-tiles a block (k_mm_tcp1, opt-in with X4_CUDA_MMTC_PST=1 for grids over one
        # wave, which the full model's expert products are and these models' are not; force takes
        # it for every launch it can run, on a third of the tiles' blocks): the same logits as k_mm_tcs at batch 1
        # (expert pairs and dense inputs), batch invariance with it, and it must have run
        pst_same() {
                local prompt m n=0
                prompt=$(awk 'BEGIN { s = 41; for (i = 0; i < 40; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for m in "$tmp/demo.gguf" "$tmp/wide/wide.gguf"; do
                        [ -f "$m" ] || continue
                        X4_CUDA_MM=tc X4_CUDA_MMTC_PST=0 "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --decode 9,99,999 --device cuda --out "$tmp/pst-0.bin" || return 1
                        X4_CUDA_MM=tc X4_CUDA_MMTC_PST=force "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --decode 9,99,999 --device cuda --out "$tmp/pst-f.bin" || return 1
                        cmp "$tmp/pst-0.bin" "$tmp/pst-f.bin" || { echo "k_mm_tcp1 differs from k_mm_tcs ($m)"; return 1; }
                        X4_CUDA_MM=tc X4_CUDA_MMTC_PST=force X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$m" \
                                --prompt 5 --decode 9 --device cuda --out "$tmp/pst-log.bin" 2>"$tmp/pst-log.txt" || return 1
                        for kind in pairs dense; do
                                grep -q "^k_mm_tcp1: .* $kind " "$tmp/pst-log.txt" ||
                                        { echo "k_mm_tcp1 never ran on $kind ($m)"; cat "$tmp/pst-log.txt"; return 1; }
                        done
                        X4_CUDA_MM=tc X4_CUDA_MMTC_PST=force "$check" batch "$m" || return 1
                        n=$((n + 1))
                done
                [ $n -gt 0 ] || { echo "no model to check"; return 1; }
                echo "k_mm_tcp1 = k_mm_tcs: identical logits ($n models); batch invariance holds with it"
        }
        step "several m-tiles a block (k_mm_tcp1) agree bit for bit with k_mm_tcs" pst_same
        # batch 1's expert pairs (the default since 2026-12-06: their copies' offsets worked out
        # once a block and the input rounded to bf16 once a part, k_mm_tcs variant 3): the same
        # logits as the former k_mm_tcs (X4_CUDA_MMTC_VAR=0), also on a ring of one slot, and the
        # variant must be what ran by default
        var_same() {
                local prompt m n=0
                prompt=$(awk 'BEGIN { s = 43; for (i = 0; i < 40; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for m in "$tmp/demo.gguf" "$tmp/wide/wide.gguf"; do
                        [ -f "$m" ] || continue
                        X4_CUDA_MM=tc X4_CUDA_MMTC_VAR=0 "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --decode 9,99,999 --device cuda --out "$tmp/var-0.bin" || return 1
                        X4_CUDA_MM=tc "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --decode 9,99,999 --device cuda --out "$tmp/var-3.bin" || return 1
                        cmp "$tmp/var-0.bin" "$tmp/var-3.bin" || { echo "k_mm_tcs variant 3 differs from the former ($m)"; return 1; }
                        X4_CUDA_MM=tc X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$m" \
                                --prompt 5 --decode 9 --device cuda --out "$tmp/var-log.bin" 2>"$tmp/var-log.txt" || return 1
                        grep -q "^k_mm_tcs: variant 3" "$tmp/var-log.txt" ||
                                { echo "k_mm_tcs variant 3 is not the default ($m)"; cat "$tmp/var-log.txt"; return 1; }
                        X4_CUDA_MM=tc X4_CUDA_MMTC_VAR=0 X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$m" \
                                --prompt 5 --decode 9 --device cuda --out "$tmp/var-log.bin" 2>"$tmp/var-log.txt" || return 1
                        ! grep -q "^k_mm_tcs: variant" "$tmp/var-log.txt" ||
                                { echo "X4_CUDA_MMTC_VAR=0 still ran the variant ($m)"; return 1; }
                        # one warp and one slot: every part after the first refills the slot the
                        # in-place rounding wrote (the demo's gate-up has two parts)
                        X4_CUDA_MM=tc X4_CUDA_MMTC_SPLIT=1x1 "$build/tools/x4-logits" --model "$m" \
                                --prompt "$prompt" --decode 9,99,999 --device cuda --out "$tmp/var-3s.bin" || return 1
                        cmp "$tmp/var-0.bin" "$tmp/var-3s.bin" || { echo "k_mm_tcs variant 3 on one slot differs ($m)"; return 1; }
                        n=$((n + 1))
                done
                [ $n -gt 0 ] || { echo "no model to check"; return 1; }
                echo "k_mm_tcs variant 3 (the default) = the former k_mm_tcs: identical logits ($n models), one slot too"
        }
        step "batch 1's expert pairs, offsets once and inputs rounded once (the default), agree bit for bit with the former" var_same
        # passes_same TAG SEED CHUNKS LOG OFF ON...: on the demo and wide models, a 300-token
        # prompt (awk seed SEED) in chunks of each of CHUNKS and decodes 9, 99 (X4_CUDA_MM=tc):
        # the logits under each ON setting cmp-equal to those under OFF (VAR=VALUE each), and each
        # ON run's stderr (X4_CUDA_MMTC_PROMPT=log) holds a line matching LOG; n_models: the models
        # it found
        passes_same() {
                local tag=$1 seed=$2 chunks=$3 want=$4 off=$5 prompt m ch on
                shift 5
                prompt=$(awk -v s="$seed" 'BEGIN { for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                n_models=0
                for m in "$tmp/demo.gguf" "$tmp/wide/wide.gguf"; do
                        [ -f "$m" ] || continue
                        for ch in $chunks; do
                                env X4_CUDA_MM=tc "$off" "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                        --chunk "$ch" --decode 9,99 --device cuda --out "$tmp/$tag-off.bin" || return 1
                                for on in "$@"; do
                                        env X4_CUDA_MM=tc "$on" X4_CUDA_MMTC_PROMPT=log "$build/tools/x4-logits" --model "$m" \
                                                --prompt "$prompt" --chunk "$ch" --decode 9,99 --device cuda \
                                                --out "$tmp/$tag-on.bin" 2>"$tmp/$tag-log.txt" || { cat "$tmp/$tag-log.txt"; return 1; }
                                        grep -q "$want" "$tmp/$tag-log.txt" ||
                                                { echo "$tag: $on never ran (chunks of $ch, $m)"; cat "$tmp/$tag-log.txt"; return 1; }
                                        cmp "$tmp/$tag-off.bin" "$tmp/$tag-on.bin" ||
                                                { echo "$tag: $on differs from $off (chunks of $ch, $m)"; return 1; }
                                done
                        done
                        n_models=$((n_models + 1))
                done
                [ $n_models -gt 0 ] || { echo "$tag: no model to check"; return 1; }
        }
        # invariant_with VAR=VALUE: batch invariance (f16 cache) on the demo and wide models and
        # chunk invariance (prompts labeled) on the demo model under that setting
        invariant_with() {
                local m
                for m in "$tmp/demo.gguf" "$tmp/wide/wide.gguf"; do
                        [ -f "$m" ] || continue
                        env "$1" X4_GPU_CACHE=f16 "$check" batch "$m" || return 1
                done
                env "$1" X4_GPU_PROMPT=1 "$check" chunks "$tmp/demo.gguf"
        }
        # dense k_mm_tcp products with K split over blocks (X4_CUDA_MMTCP_KS: by default where the
        # tiles alone leave the card half idle, batch decode's attention projections; =1 one part a
        # block, =0 never): the same logits as the unsplit kernel on passes of 40, 64 and 300 tokens
        # and decodes, that it ran (its log line), batch and chunk invariance with it
        ks_same() {
                local m
                passes_same ks 47 "40 64 300" '^k_mm_tcp: split K: ' X4_CUDA_MMTCP_KS=0 \
                        X4_CUDA_MMTCP_KS= X4_CUDA_MMTCP_KS=1 X4_CUDA_MMTCP_KS=2 || return 1
                for m in "$tmp/demo.gguf" "$tmp/wide/wide.gguf"; do
                        [ -f "$m" ] || continue
                        X4_CUDA_MM=tc X4_CUDA_MMTCP_KS=0 X4_CUDA_MMTC_PROMPT=log "$build/tools/x4-logits" --model "$m" \
                                --prompt "$(seq -s, 5 304)" --chunk 40 --decode 9 --device cuda --out "$tmp/ks-on.bin" 2>"$tmp/ks-log.txt" || return 1
                        ! grep -q '^k_mm_tcp: split K' "$tmp/ks-log.txt" || { echo "X4_CUDA_MMTCP_KS=0 still split K ($m)"; return 1; }
                done
                invariant_with X4_CUDA_MMTCP_KS=1 || return 1
                echo "split K = unsplit k_mm_tcp: identical logits ($n_models models, passes of 40 / 64 / 300, one and two parts a block and the default); batch and chunk invariance with one part a block"
        }
        step "dense products with K split over blocks agree bit for bit with the unsplit kernel" ks_same
        # grouped IQ4_NL expert products in the narrow warp layout (k_mm_tcp's NW, the default;
        # X4_CUDA_MMTCP_NARROW=0 the 4 × 2 layout, =log narrow with its launches on stderr): the
        # same logits on passes of 64 / 100 / 300 tokens (320 pairs and more with the shared expert:
        # k_mm_tcp's grouped tiles take products of more than 256 pairs; passes of 20 never reach
        # them) and decodes, that it ran (its own log line), the default the same bits, batch and
        # chunk invariance with it
        narrow_same() {
                passes_same nw 59 "64 100 300" '^k_mm_tcp: narrow grouped layout' X4_CUDA_MMTCP_NARROW=0 \
                        X4_CUDA_MMTCP_NARROW=log || return 1
                # the default (unset) against the 4 x 2 layout, demo model, passes of 64
                local prompt v
                prompt=$(seq -s, 7 306)
                for v in 0 default; do
                        local set=("X4_CUDA_MMTCP_NARROW=$v")
                        [ $v = default ] && set=(-u X4_CUDA_MMTCP_NARROW)
                        env "${set[@]}" X4_CUDA_MM=tc "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" --chunk 64 \
                                --decode 9,99 --device cuda --out "$tmp/nw-$v.bin" || return 1
                done
                cmp "$tmp/nw-0.bin" "$tmp/nw-default.bin" || { echo "nw: the default differs from the 4 x 2 layout"; return 1; }
                invariant_with X4_CUDA_MMTCP_NARROW=1 || return 1
                echo "narrow grouped layout = 4 x 2 layout: identical logits ($n_models models, passes of 64 / 100 / 300); batch and chunk invariance with it"
        }
        step "grouped expert products in the narrow warp layout agree bit for bit with the 4 x 2 layout" narrow_same
        # the one-launch mHC kernel's tail spread over the token's blocks (the default where the
        # launch's blocks fit the card at once; X4_CUDA_HC_GRID=log the same with its launches on
        # stderr, 0 the ticket tail on the last block): the same logits as the ticket tail and as
        # the tiled kernels at batch 1, and with the one-launch kernel forced for every pass
        # (X4_CUDA_HC=fused: chunks of 5 tokens take the spread tail, of 40 the ticket one where
        # they do not fit), that it ran (its log line), batch invariance with it
        hc_grid_same() {
                local prompt m ch n=0
                prompt=$(awk 'BEGIN { s = 53; for (i = 0; i < 40; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for m in "$tmp/demo.gguf" "$tmp/wide/wide.gguf"; do
                        [ -f "$m" ] || continue
                        X4_CUDA_HC_GRID=0 "$build/tools/x4-logits" --model "$m" --prompt "$prompt" --decode 9,99,999 \
                                --device cuda --out "$tmp/hcg-0.bin" || return 1
                        X4_CUDA_HC_GRID=log "$build/tools/x4-logits" --model "$m" --prompt "$prompt" --decode 9,99,999 \
                                --device cuda --out "$tmp/hcg-1.bin" 2>"$tmp/hcg-log.txt" || { cat "$tmp/hcg-log.txt"; return 1; }
                        grep -q '^mHC: spread tail, [0-9]* blocks a token, 1 tokens' "$tmp/hcg-log.txt" ||
                                { echo "the spread tail never ran ($m)"; cat "$tmp/hcg-log.txt"; return 1; }
                        cmp "$tmp/hcg-0.bin" "$tmp/hcg-1.bin" || { echo "the spread tail differs from the ticket tail ($m)"; return 1; }
                        for ch in 5 40; do
                                X4_CUDA_HC=fused X4_CUDA_HC_GRID=log "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                        --chunk $ch --decode 9,99,999 --device cuda --out "$tmp/hcg-f.bin" 2>"$tmp/hcg-log.txt" ||
                                        { cat "$tmp/hcg-log.txt"; return 1; }
                                cmp "$tmp/hcg-0.bin" "$tmp/hcg-f.bin" ||
                                        { echo "the one-launch kernel on chunks of $ch differs ($m)"; return 1; }
                        done
                        X4_CUDA_HC=fused X4_CUDA_HC_GRID=log "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --chunk 5 --decode 9 --device cuda --out "$tmp/hcg-f.bin" 2>"$tmp/hcg-log.txt" || return 1
                        grep -q '^mHC: spread tail, [0-9]* blocks a token, 5 tokens' "$tmp/hcg-log.txt" ||
                                { echo "the spread tail never took a chunk of 5 ($m)"; cat "$tmp/hcg-log.txt"; return 1; }
                        X4_CUDA_HC=fused X4_CUDA_HC_GRID=1 "$check" batch "$m" || return 1
                        n=$((n + 1))
                done
                [ $n -gt 0 ] || { echo "no model to check"; return 1; }
                echo "spread mHC tail = ticket tail = tiled kernels: identical logits ($n models, decodes and chunks of 5 / 40 on the one-launch kernel); batch invariance with it"
        }
        step "the mHC kernel's tail spread over its blocks agrees bit for bit with the ticket tail" hc_grid_same
        # the spread tail's barriers by release / acquire (X4_CUDA_HC_RELEASE=1, opt-in until timed;
        # synchronization only): the same logits as the default on decodes and on chunks of 5 (the
        # one-launch kernel, 5 tokens a launch) over the demo and wide models, with the routing
        # build too on a 1,280-wide model; that it ran (its log line); the batch-1 router's
        # acquire-release ticket (X4_CUDA_ROUTER_RELEASE=1) on the decodes; batch invariance with both
        hc_release_same() {
                local prompt m n=0
                prompt=$(awk 'BEGIN { s = 67; for (i = 0; i < 40; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 500 } }')
                h1280_model || return 1
                for m in "$tmp/demo.gguf" "$tmp/wide/wide.gguf" "$tmp/hcr/h1280.gguf"; do
                        [ -f "$m" ] || continue
                        "$build/tools/x4-logits" --model "$m" --prompt "$prompt" --decode 9,99,333 --device cuda \
                                --out "$tmp/hcrel-0.bin" || return 1
                        X4_CUDA_HC_RELEASE=1 X4_CUDA_HC_GRID=log "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --decode 9,99,333 --device cuda --out "$tmp/hcrel-1.bin" 2>"$tmp/hcrel-log.txt" ||
                                { cat "$tmp/hcrel-log.txt"; return 1; }
                        grep -q '^mHC: spread tail, [0-9]* blocks a token, 1 tokens, release barriers' "$tmp/hcrel-log.txt" ||
                                { echo "the release barriers never ran ($m)"; cat "$tmp/hcrel-log.txt"; return 1; }
                        cmp "$tmp/hcrel-0.bin" "$tmp/hcrel-1.bin" || { echo "the release barriers changed the logits ($m)"; return 1; }
                        X4_CUDA_HC=fused X4_CUDA_HC_RELEASE=1 "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --chunk 5 --decode 9,99,333 --device cuda --out "$tmp/hcrel-5.bin" || return 1
                        cmp "$tmp/hcrel-0.bin" "$tmp/hcrel-5.bin" ||
                                { echo "the release barriers on chunks of 5 changed the logits ($m)"; return 1; }
                        X4_CUDA_HC_RELEASE=1 X4_CUDA_HC_ROUTE=1 "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --decode 9,99,333 --device cuda --out "$tmp/hcrel-r.bin" || return 1
                        cmp "$tmp/hcrel-0.bin" "$tmp/hcrel-r.bin" ||
                                { echo "the release barriers with routing changed the logits ($m)"; return 1; }
                        X4_CUDA_ROUTER_RELEASE=1 "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --decode 9,99,333 --device cuda --out "$tmp/hcrel-k.bin" || return 1
                        cmp "$tmp/hcrel-0.bin" "$tmp/hcrel-k.bin" ||
                                { echo "the router's acquire-release ticket changed the logits ($m)"; return 1; }
                        X4_CUDA_HC_RELEASE=1 X4_CUDA_ROUTER_RELEASE=1 "$check" batch "$m" || return 1
                        n=$((n + 1))
                done
                [ $n -gt 0 ] || { echo "no model to check"; return 1; }
                echo "release / acquire barriers and tickets: identical logits ($n models, decodes and chunks of 5, with routing too); batch invariance with them"
        }
        step "the spread mHC tail's release / acquire barriers and the router's ticket agree bit for bit" hc_release_same
        # the FFN's spread-tail pre-mapping also routing its token (X4_CUDA_HC_ROUTE=1, opt-in until
        # timed): the same logits as the router's own launch on decodes and on chunks of 1 and 5
        # (the one-launch kernel, 5 tokens a launch) over the wide model (2,048: eight blocks of 2
        # router rows) and a demo model 1,280 wide (five blocks of 4 rows over positions that end
        # a quarter into the router's last 1,024-value round); that it ran (its log line); batch
        # invariance with it (each sequence alone routes in the mHC kernel, the batch of 16 in the
        # router's: the same bits expected). The demo model and the fixture (8 rows a block, more
        # than the kernel holds) keep the router's launch: their other steps cover that
        hc_route_same() {
                local prompt m ch n=0
                prompt=$(awk 'BEGIN { s = 59; for (i = 0; i < 40; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 500 } }')
                h1280_model || return 1
                for m in "$tmp/wide/wide.gguf" "$tmp/hcr/h1280.gguf"; do
                        [ -f "$m" ] || continue
                        for ch in 0 1; do
                                local chunk=()
                                [ "$ch" -gt 0 ] && chunk=(--chunk "$ch")
                                X4_CUDA_HC_ROUTE=0 "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                        "${chunk[@]}" --decode 9,99,333 --device cuda --out "$tmp/hcr-0.bin" || return 1
                                X4_CUDA_HC_ROUTE=log "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                        "${chunk[@]}" --decode 9,99,333 --device cuda --out "$tmp/hcr-1.bin" \
                                        2>"$tmp/hcr-log.txt" || { cat "$tmp/hcr-log.txt"; return 1; }
                                grep -q '^mHC: spread tail routes, [0-9]* blocks a token, [0-9]* router rows a block, 1 tokens' \
                                        "$tmp/hcr-log.txt" || { echo "the mHC kernel never routed ($m)"; cat "$tmp/hcr-log.txt"; return 1; }
                                cmp "$tmp/hcr-0.bin" "$tmp/hcr-1.bin" ||
                                        { echo "routing in the mHC kernel changed the logits ($m, chunks of $ch)"; return 1; }
                        done
                        X4_CUDA_HC=fused X4_CUDA_HC_ROUTE=log "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --chunk 5 --decode 9,99,333 --device cuda --out "$tmp/hcr-5.bin" 2>"$tmp/hcr-log.txt" ||
                                { cat "$tmp/hcr-log.txt"; return 1; }
                        grep -q 'router rows a block, 5 tokens' "$tmp/hcr-log.txt" ||
                                { echo "the mHC kernel never routed a chunk of 5 ($m)"; cat "$tmp/hcr-log.txt"; return 1; }
                        cmp "$tmp/hcr-0.bin" "$tmp/hcr-5.bin" || { echo "routing 5 tokens a launch changed the logits ($m)"; return 1; }
                        X4_CUDA_HC_ROUTE=1 "$check" batch "$m" || return 1
                        n=$((n + 1))
                done
                [ $n -gt 0 ] || { echo "no model to check"; return 1; }
                echo "routing in the mHC kernel = the router's launch: identical logits ($n models, decodes, chunks of 1 and 5); batch invariance with it"
        }
        step "the FFN's mHC kernel routing its token agrees bit for bit with the router's launch" hc_route_same
        # the attention combine with its latency chains shortened (k_attn_combine_deep: by default
        # where a launch's blocks fit one wave of it, X4_CUDA_COMBINE=deep or log always): the same
        # logits as the per-value reference, the staged kernel and the default over 4,200
        # positions in parts of 32 (up to 132 parts a query: two rounds of the running max's scan)
        # on the f16 cache, and on a 700-token prompt over the
        # f32 cache's kernels (parts of 128); that it ran (its log line); batch and chunk
        # invariance with it
        combine_deep_same() {
                local long p700 c
                [ -f "$tmp/demo.gguf" ] || { echo "no demo model"; return 1; }
                long=$(awk 'BEGIN { s = 61; for (i = 0; i < 4200; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                p700=$(awk 'BEGIN { s = 67; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for c in ref staged auto log; do
                        X4_CUDA_COMBINE=$c X4_CUDA_ATTN_DECODE_PART=32 X4_CUDA_ATTN_PROMPT_PART=32 "$build/tools/x4-logits" \
                                --model "$tmp/demo.gguf" --cache f16 --prompt "$long" --decode 9,99 --device cuda \
                                --out "$tmp/cd-$c.bin" 2>"$tmp/cd-log.txt" || { cat "$tmp/cd-log.txt"; return 1; }
                done
                grep -q '^attention combine: deep chains, up to 1[3-9][0-9] parts' "$tmp/cd-log.txt" ||
                        { echo "the deep combine never folded 130 parts or more"; cat "$tmp/cd-log.txt"; return 1; }
                cmp "$tmp/cd-ref.bin" "$tmp/cd-staged.bin" || { echo "the staged combine differs from its reference (132 parts)"; return 1; }
                cmp "$tmp/cd-ref.bin" "$tmp/cd-log.bin" || { echo "the deep combine differs from the reference (132 parts)"; return 1; }
                cmp "$tmp/cd-ref.bin" "$tmp/cd-auto.bin" || { echo "the default combine (auto) differs from the reference (132 parts)"; return 1; }
                for c in ref deep; do
                        X4_CUDA_COMBINE=$c "$build/tools/x4-logits" --model "$tmp/demo.gguf" --cache f32 --prompt "$p700" \
                                --decode 9,99,999 --device cuda --out "$tmp/cd32-$c.bin" || return 1
                done
                cmp "$tmp/cd32-ref.bin" "$tmp/cd32-deep.bin" || { echo "the deep combine differs from the reference (f32 cache)"; return 1; }
                invariant_with X4_CUDA_COMBINE=deep || return 1
                echo "deep combine = staged combine = per-value reference: identical logits (132 parts on the f16 cache, 6 on the f32 cache's kernels); batch and chunk invariance with it"
        }
        step "the attention combine's deep chains agree bit for bit with its reference" combine_deep_same
        # the Q6_K head on tensor cores (X4_CUDA_MM_Q6TC=1, k_q6_tc: one mma chain an output for
        # every input count): it must run (its log line), stay within the parity bounds against
        # the CPU, and keep batch and chunk invariance (the chunks' head launches take 1 to 512
        # rows: every shape of the kernel)
        q6tc_checks() {
                local env=(X4_CUDA_MM=tc X4_CUDA_MM_Q6TC=1 X4_GPU_CACHE=f16)
                env "${env[@]}" X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt 5,6,7 \
                        --decode 9 --device cuda --out "$tmp/q6tc-log.bin" 2>"$tmp/q6tc-log.txt" ||
                        { cat "$tmp/q6tc-log.txt"; return 1; }
                grep -q '^k_q6_tc: ' "$tmp/q6tc-log.txt" || { echo "k_q6_tc never ran"; cat "$tmp/q6tc-log.txt"; return 1; }
                env "${env[@]}" X4_GPU_PROMPT=1 "$check" parity "$tmp/demo.gguf" 512 64 || return 1
                env "${env[@]}" "$check" batch "$tmp/demo.gguf" || return 1
                env "${env[@]}" X4_GPU_PROMPT=1 "$check" chunks "$tmp/demo.gguf" || return 1
                env "${env[@]}" "$check" classes "$tmp/demo.gguf" || return 1
                if [ -f "$tmp/wide/wide.gguf" ]; then env "${env[@]}" "$check" batch "$tmp/wide/wide.gguf" || return 1; fi
                # a vocabulary that ends inside a block's rows (4,100: the last block's first warp
                # holds 4 rows, its other three none)
                mkdir -p "$tmp/v4100" # its own folder (config.json; see wide_same)
                "$build/tools/x4-mkmodel" --preset demo --vocab 4100 --layers 2 --quiet --out "$tmp/v4100/v4100.gguf" || return 1
                env "${env[@]}" "$check" batch "$tmp/v4100/v4100.gguf" || return 1
                env "${env[@]}" X4_GPU_PROMPT=1 "$check" chunks "$tmp/v4100/v4100.gguf" || return 1
                echo "k_q6_tc: ran; parity, batch, chunk and class invariance hold (vocabulary 4,096 and 4,100)"
        }
        step "the Q6_K head on tensor cores: parity with the CPU, batch and chunk invariance, demo model" q6tc_checks
        # X4_CUDA_Q6TC_XS=1: the head's inputs staged in shared memory for launches of 1-2 inputs
        # (the same words into the same mma): batch-1 decodes after a 300-token prompt and the batch
        # test give the same logits as without it, and its log line says it ran
        q6tc_xs_same() {
                local prompt v
                local env=(X4_CUDA_MM=tc X4_CUDA_MM_Q6TC=1 X4_GPU_CACHE=f16)
                prompt=$(awk 'BEGIN { s = 37; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for v in 0 1; do
                        env "${env[@]}" X4_CUDA_Q6TC_XS=$v X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --prompt "$prompt" --chunk 64 --cache f16 --decode 9,99,999 --device cuda \
                                --out "$tmp/q6xs-$v.bin" 2>"$tmp/q6xs-$v.err" || { cat "$tmp/q6xs-$v.err"; return 1; }
                        env "${env[@]}" X4_CUDA_Q6TC_XS=$v X4_GPU_BATCH_DUMP="$tmp/q6xs-$v-batch.bin" "$check" batch "$tmp/demo.gguf" ||
                                return 1
                done
                grep -q '^k_q6_tc: P 1 .* inputs staged$' "$tmp/q6xs-1.err" ||
                        { echo "k_q6_tc never ran with its inputs staged"; cat "$tmp/q6xs-1.err"; return 1; }
                cmp "$tmp/q6xs-0.bin" "$tmp/q6xs-1.bin" || { echo "X4_CUDA_Q6TC_XS=1 changed the decode logits"; return 1; }
                cmp "$tmp/q6xs-0-batch.bin" "$tmp/q6xs-1-batch.bin" || { echo "X4_CUDA_Q6TC_XS=1 changed the batch logits"; return 1; }
                echo "k_q6_tc with staged inputs: ran, identical logits"
        }
        step "the Q6_K head with its inputs in shared memory agrees bit for bit, demo model" q6tc_xs_same
        # the Q6_K head's inputs permuted for 16-byte loads (the default since 2026-12-07's
        # nineteenth session, X4_CUDA_Q6TC_B16=0 the 4-byte loads; launches of more than two
        # inputs): the same logits as without, on passes of 5, 12, 20 and 64 tokens (one, two, four
        # and eight n-tiles a warp: every build) with decodes, and in the batch test (16 inputs), on
        # the demo, wide and 4,100-word models (a last block of rows partly past the vocabulary);
        # its log line (that it ran), and with the knob unset (the default) too
        q6tc_b16_same() {
                local prompt v ch m n=0
                local env=(X4_CUDA_MM=tc X4_CUDA_MM_Q6TC=1 X4_GPU_CACHE=f16)
                prompt=$(awk 'BEGIN { s = 79; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for m in "$tmp/demo.gguf" "$tmp/wide/wide.gguf" "$tmp/v4100/v4100.gguf"; do
                        [ -f "$m" ] || continue
                        for ch in 5 12 20 64; do
                                for v in 0 1; do
                                        env "${env[@]}" X4_CUDA_Q6TC_B16=$v X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$m" \
                                                --prompt "$prompt" --chunk $ch --cache f16 --decode 9,99 --device cuda \
                                                --out "$tmp/q6b16-$v.bin" 2>"$tmp/q6b16-$v.err" || { cat "$tmp/q6b16-$v.err"; return 1; }
                                done
                                grep -q '^k_q6_tc: .* inputs permuted, 16-byte loads$' "$tmp/q6b16-1.err" ||
                                        { echo "k_q6_tc never took 16-byte loads ($m, chunks of $ch)"; cat "$tmp/q6b16-1.err"; return 1; }
                                cmp "$tmp/q6b16-0.bin" "$tmp/q6b16-1.bin" ||
                                        { echo "X4_CUDA_Q6TC_B16=1 changed the logits ($m, chunks of $ch)"; return 1; }
                        done
                        env "${env[@]}" X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$m" --prompt "$prompt" \
                                --chunk 64 --cache f16 --decode 9,99 --device cuda --out "$tmp/q6b16-d.bin" 2>"$tmp/q6b16-d.err" ||
                                { cat "$tmp/q6b16-d.err"; return 1; }
                        grep -q '^k_q6_tc: .* inputs permuted, 16-byte loads$' "$tmp/q6b16-d.err" ||
                                { echo "the default never took 16-byte loads ($m)"; return 1; }
                        cmp "$tmp/q6b16-0.bin" "$tmp/q6b16-d.bin" ||
                                { echo "the default changed the logits ($m, chunks of 64)"; return 1; }
                        for v in 0 1; do
                                env "${env[@]}" X4_CUDA_Q6TC_B16=$v X4_GPU_BATCH_DUMP="$tmp/q6b16-$v-batch.bin" "$check" batch "$m" ||
                                        return 1
                        done
                        cmp "$tmp/q6b16-0-batch.bin" "$tmp/q6b16-1-batch.bin" ||
                                { echo "X4_CUDA_Q6TC_B16=1 changed the batch logits ($m)"; return 1; }
                        n=$((n + 1))
                done
                [ $n -gt 0 ] || { echo "no model to check"; return 1; }
                echo "k_q6_tc with 16-byte input loads: ran, identical logits ($n models, passes of 5 / 12 / 20 / 64 and decodes, batch 16)"
        }
        step "the Q6_K head with 16-byte input loads agrees bit for bit" q6tc_b16_same
        # dense products of 17-64 inputs a warp an n-tile (X4_CUDA_MMTC_TCN=1, k_mm_tcn): the same
        # bits as k_mm_tcp (a 300-token prompt in chunks of 40 and 64, then decodes), batch and
        # chunk invariance with it, and its log line (that it ran)
        tcn_same() {
                local prompt ch
                prompt=$(awk 'BEGIN { s = 43; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for ch in 40 64 64s2; do
                        # 64s2: a ring of two stages (X4_CUDA_MMTC_TCN_S=2), so it wraps on the demo's rows
                        local S=0
                        case $ch in *s2) S=2 ;; esac
                        X4_CUDA_MM=tc X4_CUDA_MMTC_TCN=0 "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" \
                                --chunk ${ch%s2} --decode 9,99 --device cuda --out "$tmp/tcn-off-$ch.bin" || return 1
                        X4_CUDA_MM=tc X4_CUDA_MMTC_TCN=1 X4_CUDA_MMTC_TCN_S=$S X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" \
                                --model "$tmp/demo.gguf" --prompt "$prompt" --chunk ${ch%s2} --decode 9,99 --device cuda \
                                --out "$tmp/tcn-on-$ch.bin" 2>"$tmp/tcn-$ch.log" || { cat "$tmp/tcn-$ch.log"; return 1; }
                        grep -q '^k_mm_tcn: ' "$tmp/tcn-$ch.log" || { echo "k_mm_tcn never ran (chunks of $ch)"; return 1; }
                        cmp "$tmp/tcn-off-$ch.bin" "$tmp/tcn-on-$ch.bin" || { echo "k_mm_tcn differs (chunks of $ch)"; return 1; }
                done
                X4_CUDA_MM=tc X4_CUDA_MMTC_TCN=1 X4_GPU_CACHE=f16 "$check" batch "$tmp/demo.gguf" || return 1
                X4_CUDA_MM=tc X4_CUDA_MMTC_TCN=1 X4_GPU_PROMPT=1 "$check" chunks "$tmp/demo.gguf" || return 1
                if [ -f "$tmp/wide/wide.gguf" ]; then X4_CUDA_MM=tc X4_CUDA_MMTC_TCN=1 "$check" batch "$tmp/wide/wide.gguf" || return 1; fi
                echo "k_mm_tcn = k_mm_tcp (chunks of 40 and 64); batch and chunk invariance with it"
        }
        step "dense products a warp an n-tile agree bit for bit with k_mm_tcp, demo model" tcn_same
        # grouped expert products on k_mm_tcd's 8-pair tiles at any pair count
        # (X4_CUDA_MMTC_PAIRS_TCD: for batch decode; here every prompt pass's pairs)
        pairs_tcd_same() {
                local prompt ch v
                prompt=$(awk 'BEGIN { s = 53; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for ch in 0 64; do
                        for v in 0 1000000; do
                                local args=()
                                [ "$ch" -gt 0 ] && args=(--chunk "$ch")
                                X4_CUDA_MM=tc X4_CUDA_MMTC_PAIRS_TCD=$v X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" \
                                        --model "$tmp/demo.gguf" --prompt "$prompt" ${args[@]+"${args[@]}"} --decode 9,99 \
                                        --device cuda --out "$tmp/ptcd-$ch-$v.bin" 2>"$tmp/ptcd-$ch-$v.log" ||
                                        { cat "$tmp/ptcd-$ch-$v.log"; return 1; }
                        done
                        grep -q '^k_mm_tcd: .*grouped' "$tmp/ptcd-$ch-1000000.log" ||
                                { echo "k_mm_tcd never took grouped pairs (chunk $ch)"; return 1; }
                        cmp "$tmp/ptcd-$ch-0.bin" "$tmp/ptcd-$ch-1000000.bin" ||
                                { echo "X4_CUDA_MMTC_PAIRS_TCD differs (chunk $ch)"; return 1; }
                done
                echo "grouped expert products on k_mm_tcd's 8-pair tiles = k_mm_tcp: identical logits"
        }
        step "grouped expert products on 8-pair tiles agree bit for bit with k_mm_tcp, demo model" pairs_tcd_same
        step "batch invariance, demo model, grouped expert products on 8-pair tiles" env X4_CUDA_MM=tc \
                X4_CUDA_MMTC_PAIRS_TCD=1000000 X4_GPU_CACHE=f16 "$check" batch "$tmp/demo.gguf"
        # the prompt-shaped tensor-core kernel (k_mm_tcp: launches of more than 16 tokens, 128 x 64
        # tiles through a cp.async ring, experts in tiles of 64 pairs) computes k_mm_tc's chains too:
        # the same logits with it off (X4_CUDA_MMTC_PROMPT=0), every token on tensor cores
        # (X4_CUDA_MM=tc: x4-logits does not label prompts), a 700-token prompt whole and in chunks
        # of 64 and 100 (full and partial tiles, grouped experts), then decodes. The classes mode
        # compares it with k_mm_tcd on prompt-labelled chunks (1 and 7 against 64 and 512).
        tcp_same() {
                local prompt v c args
                prompt=$(awk 'BEGIN { s = 17; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                X4_CUDA_MM=tc X4_CUDA_MMTC_PROMPT=log "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                        --prompt "$prompt" --decode 9 --device cuda --out "$tmp/tcp-log.bin" 2>"$tmp/tcp-log.txt" || return 1
                grep -q '^k_mm_tcp: .*grouped' "$tmp/tcp-log.txt" || { echo "k_mm_tcp never launched on experts"; cat "$tmp/tcp-log.txt"; return 1; }
                for v in 0 1; do
                        for c in 0 64 100; do
                                args=()
                                [ $c -gt 0 ] && args=(--chunk $c)
                                X4_CUDA_MM=tc X4_CUDA_MMTC_PROMPT=$v "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                        --prompt "$prompt" ${args[@]+"${args[@]}"} --decode 9,99 --device cuda \
                                        --out "$tmp/tcp-$v-$c.bin" || return 1
                        done
                done
                for c in 0 64 100; do
                        cmp "$tmp/tcp-0-$c.bin" "$tmp/tcp-1-$c.bin" || { echo "k_mm_tcp differs from k_mm_tc (chunk $c)"; return 1; }
                done
                echo "k_mm_tcp vs k_mm_tc: identical logits (whole, chunks 64/100, decode)"
                # IQ4_NL stages decoded once a block (X4_CUDA_MMTCP_DEC1=1): the same A registers
                for c in 0 100; do
                        args=()
                        [ $c -gt 0 ] && args=(--chunk $c)
                        X4_CUDA_MM=tc X4_CUDA_MMTCP_DEC1=1 "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --prompt "$prompt" ${args[@]+"${args[@]}"} --decode 9,99 --device cuda \
                                --out "$tmp/tcp-d1-$c.bin" || return 1
                        cmp "$tmp/tcp-0-$c.bin" "$tmp/tcp-d1-$c.bin" || { echo "X4_CUDA_MMTCP_DEC1=1 differs from k_mm_tc (chunk $c)"; return 1; }
                done
                echo "k_mm_tcp decoding IQ4_NL once a block vs k_mm_tc: identical logits (whole, chunks of 100)"
                rm -f "$tmp"/tcp-*.bin
        }
        step "prompt-shaped tensor-core kernel agrees bit for bit with k_mm_tc, demo model" tcp_same
        # prompt attention with two tokens a block (the default, k_attn_tc2<TOK 2>: neighbours of one
        # sequence share each staged sub-part) against one a block (X4_CUDA_ATTN_TOK=1), prompt-labelled
        # (x4-logits --prompt-class): a 700-token prompt whole, in chunks of 7, 64 and 100 (odd
        # chunks pair tokens differently), then decodes; and a chunk-1 prompt (one token a launch)
        # against the whole one. Twice: with the default part length (CU_ATTN_PART_TC2: the whole
        # prompt in one part) and with parts of 64 positions (X4_CUDA_ATTN_PROMPT_PART=64: eleven
        # parts folded by the combine, groups of a launch sized by them)
        tok_same() {
                local prompt v c pl args
                local X4_CUDA_ATTN_PROMPT=tc2 # the absorbed prompt kernel (the default is mha.cu's)
                export X4_CUDA_ATTN_PROMPT
                prompt=$(awk 'BEGIN { s = 19; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for pl in 1024 64; do
                        for v in 1 2; do
                                for c in 0 7 64 100; do
                                        args=()
                                        [ $c -gt 0 ] && args=(--chunk $c)
                                        X4_CUDA_ATTN_PROMPT_PART=$pl X4_CUDA_ATTN_TOK=$v "$build/tools/x4-logits" \
                                                --model "$tmp/demo.gguf" --prompt-class --prompt "$prompt" ${args[@]+"${args[@]}"} \
                                                --decode 9,99 --device cuda --out "$tmp/tok-$v-$c.bin" || return 1
                                done
                        done
                        for c in 0 7 64 100; do
                                cmp "$tmp/tok-1-$c.bin" "$tmp/tok-2-$c.bin" ||
                                        { echo "parts of $pl: two tokens a block differ from one (chunk $c)"; return 1; }
                                cmp "$tmp/tok-2-0.bin" "$tmp/tok-2-$c.bin" ||
                                        { echo "parts of $pl: prompt rows differ between chunkings (chunk $c)"; return 1; }
                        done
                        X4_CUDA_ATTN_PROMPT_PART=$pl "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt-class \
                                --prompt "$prompt" --chunk 1 --decode 9,99 --device cuda --out "$tmp/tok-c1.bin" || return 1
                        cmp "$tmp/tok-2-0.bin" "$tmp/tok-c1.bin" ||
                                { echo "parts of $pl: chunk-1 prompt differs from the whole one"; return 1; }
                        [ $pl = 1024 ] && cp "$tmp/tok-2-0.bin" "$tmp/tok-long.bin"
                done
                # the two part lengths fold differently: different bits, the same attention
                cmp -s "$tmp/tok-long.bin" "$tmp/tok-2-0.bin" && { echo "parts of 64 gave the bits of one part: the setting did not reach the kernel"; return 1; }
                echo "prompt attention, parts of 1024 and 64, two tokens a block vs one: identical logits (whole, chunks 1/7/64/100, decode)"
                rm -f "$tmp"/tok-*.bin
        }
        step "prompt attention two tokens a block agrees bit for bit with one, demo model" tok_same
        # prompt_same V: a prompt attention variant (X4_CUDA_ATTN_PROMPT=V, its own bits; fa: k_attn_fa,
        # two tokens' 64 query rows one tile; mha: the non-absorbed form of mha.cu, the default): the same prompt
        # whole vs chunks of 1, 7, 64, 100, and with parts of 64 whole vs chunks of 7; then the fixture
        # vs its f64 oracle with prompts on it
        prompt_same() {
                local v=$1 prompt c args
                prompt=$(awk 'BEGIN { s = 19; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for c in 0 1 7 64 100; do
                        args=()
                        [ $c -gt 0 ] && args=(--chunk $c)
                        X4_CUDA_ATTN_PROMPT=$v "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt-class \
                                --prompt "$prompt" ${args[@]+"${args[@]}"} --decode 9,99 --device cuda \
                                --out "$tmp/ps-$c.bin" || return 1
                        cmp "$tmp/ps-0.bin" "$tmp/ps-$c.bin" || { echo "$v: chunk $c differs from the whole prompt"; return 1; }
                done
                for c in 0 7; do
                        args=()
                        [ $c -gt 0 ] && args=(--chunk $c)
                        X4_CUDA_ATTN_PROMPT=$v X4_CUDA_ATTN_PROMPT_PART=64 "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --prompt-class --prompt "$prompt" ${args[@]+"${args[@]}"} --decode 9,99 --device cuda \
                                --out "$tmp/ps64-$c.bin" || return 1
                done
                cmp "$tmp/ps64-0.bin" "$tmp/ps64-7.bin" || { echo "$v, parts of 64: chunk 7 differs"; return 1; }
                cmp -s "$tmp/ps-0.bin" "$tmp/ps64-0.bin" && { echo "$v: parts of 64 gave the bits of one part"; return 1; }
                local other=tc2
                [ "$v" = tc2 ] && other=fa
                X4_CUDA_ATTN_PROMPT=$other "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt-class --prompt "$prompt" \
                        --decode 9,99 --device cuda --out "$tmp/ps-other.bin" || return 1
                cmp -s "$tmp/ps-0.bin" "$tmp/ps-other.bin" && { echo "$v: the bits of $other (the variant did not run)"; return 1; }
                X4_CUDA_ATTN_PROMPT=$v X4_GPU_PROMPT=1 "$check" fixture "$fixture" --no-cpu || return 1
                echo "$v: identical logits whole and in chunks of 1/7/64/100 (parts of 1024 and 64); fixture within bounds"
                rm -f "$tmp"/ps-*.bin "$tmp"/ps64-*.bin
        }
        step "prompt attention k_attn_fa: chunk invariance and fixture, demo model" prompt_same fa
        step "prompt attention, non-absorbed (mha.cu): chunk invariance and fixture, demo model" prompt_same mha
        # mha.cu's small-memory choices (X4_CUDA_MHA_SMALL=1, what cards with ~100 KB of shared memory
        # a block take: queries staged in a key buffer, 64-wide expansion tiles instead of 128) have
        # the default's bits: the demo model and a tiny model with the release's head dims (nope 128,
        # rope 64, v 128, latent 512), a 700-token prompt whole and in chunks of 100, then decodes
        mha_small() {
                local prompt m c v args
                prompt=$(awk 'BEGIN { s = 23; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 250 } }')
                mkdir -p "$tmp/mhs"
                "$build/tools/x4-mkmodel" --preset tiny --qk-nope 128 --qk-rope 64 --v-head 128 --kv-lora 512 --quiet \
                        --out "$tmp/mhs/mhs.gguf" || return 1
                for m in "$tmp/demo.gguf" "$tmp/mhs/mhs.gguf"; do
                        for c in 0 100; do
                                for v in 0 1; do
                                        args=()
                                        [ $c -gt 0 ] && args=(--chunk $c)
                                        X4_CUDA_MHA_SMALL=$v "$build/tools/x4-logits" --model "$m" --prompt-class --prompt "$prompt" \
                                                ${args[@]+"${args[@]}"} --decode 9,99 --device cuda --out "$tmp/ms-$v.bin" || return 1
                                done
                                cmp "$tmp/ms-0.bin" "$tmp/ms-1.bin" || { echo "$m, chunk $c: X4_CUDA_MHA_SMALL=1 differs"; return 1; }
                        done
                done
                rm -f "$tmp"/ms-*.bin
                echo "mha.cu small-memory kernels: identical logits (demo and release head dims, whole and chunks of 100)"
        }
        step "prompt attention mha.cu, small-memory kernels agree bit for bit" mha_small
        # env_same VAR A B SEED[:N] SHAPE...: an N-token (300) demo-model prompt (LCG seed SEED) run with VAR=A
        # and VAR=B for each run shape (x4-logits options): identical logits expected
        env_same() {
                local var=$1 a=$2 b=$3 seed=${4%%:*} n=300 prompt shape v i=0
                case $4 in *:*) n=${4#*:} ;; esac
                shift 4
                prompt=$(awk -v s="$seed" -v n="$n" 'BEGIN { for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                for shape in "$@"; do
                        for v in "$a" "$b"; do
                                # shellcheck disable=SC2086 # a shape is several options
                                env "$var=$v" "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" $shape \
                                        --device cuda --out "$tmp/es-$i-$v.bin" || return 1
                        done
                        cmp "$tmp/es-$i-$a.bin" "$tmp/es-$i-$b.bin" || { echo "$var=$a and $var=$b differ ($shape)"; return 1; }
                        i=$((i + 1))
                done
                rm -f "$tmp"/es-*.bin
                echo "$var=$a and $var=$b: identical logits ($# run shapes)"
        }
        # the router's matvec with 4 expert rows a block (token tiles of 8; a token's input read once
        # for the 4) against a row a block (X4_CUDA_ROUTER_RB=1): the same chains, generated and
        # prompt classes
        step "router rows a block agree bit for bit, demo model" \
                env_same X4_CUDA_ROUTER_RB 1 4 29 "--chunk 100 --decode 9,99" "--prompt-class --decode 9"
        # a long pass's router a thread a logit (X4_CUDA_ROUTER_TILED=1, k_router_tiled: passes of
        # 1,024 tokens or more) computes cu_few_rows' sums in their order: identical logits for a
        # 1,500-token prompt whole (labeled) and in chunks of 1,100 (the rest on k_router_fused)
        step "long passes' router a thread a logit agrees bit for bit, demo model" \
                env_same X4_CUDA_ROUTER_TILED 0 1 31:1500 "--prompt-class --decode 9" "--chunk 1100 --decode 9,99"
        router_tiled_ran() {
                X4_CUDA_ROUTER_TILED=log "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$(seq -s, 5 1104)" \
                        --decode 9 --device cuda --out "$tmp/rt-log.bin" 2>"$tmp/rt-log.txt" || { cat "$tmp/rt-log.txt"; return 1; }
                grep '^k_router_tiled: ' "$tmp/rt-log.txt" || { echo "k_router_tiled never ran"; cat "$tmp/rt-log.txt"; return 1; }
        }
        step "long passes' router a thread a logit runs on a 1,100-token prompt" router_tiled_ran
        # the fifth session's opt-ins under the three sanitizers, together (a run each is too long a
        # GPU call): A, batch-1 and 40-token passes with the mHC early gates, the queries' RoPE as
        # side blocks, the Q6_K head on tensor cores, k_mm_tcn on a ring of two and grouped pairs
        # on 8-pair tiles (demo model; the head's ring wraps on the wide model); B, a 1,034-token
        # pass with k_hc_wtok and the tiled router
        # B on the tiny fixture (vocabulary 512: ids below it) to keep racecheck's pass short; a
        # refusal of either kernel (on stderr) fails it
        san_opt_b() {
                local prompt
                prompt=$(awk 'BEGIN { s = 61; for (i = 0; i < 1034; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 500 } }')
                X4_CUDA_HC=wtok X4_CUDA_ROUTER_TILED=1 compute-sanitizer --tool "$1" --error-exitcode 9 \
                        "$build/tools/x4-logits" --model "$tiny" --prompt "$prompt" --decode 9 --device cuda \
                        --out "$tmp/san-opt-b.bin" 2>"$tmp/san-opt-b.err" || { cat "$tmp/san-opt-b.err"; return 1; }
                if grep -E 'X4_CUDA_HC=wtok|X4_CUDA_ROUTER_TILED' "$tmp/san-opt-b.err"; then return 1; fi
        }
        opt_a=(X4_CUDA_MM=tc X4_CUDA_HC_EARLY=1 X4_CUDA_ROPE_SIDE=1 X4_CUDA_MM_Q6TC=1 X4_CUDA_MMTC_TCN=1
                X4_CUDA_MMTC_TCN_S=2 X4_CUDA_MMTC_PAIRS_TCD=1000000)
        for tool in memcheck racecheck synccheck; do
                step "compute-sanitizer $tool, early gates + RoPE side blocks + Q6_K head on tensor cores + k_mm_tcn + 8-pair tiles, demo model" \
                        env "${opt_a[@]}" compute-sanitizer --tool $tool --error-exitcode 9 "$build/tools/x4-logits" \
                        --model "$tmp/demo.gguf" --prompt "$(seq -s, 5 44)" --chunk 40 --decode 9,99 --device cuda \
                        --out "$tmp/san-opt-a.bin"
                [ -f "$tmp/wide/wide.gguf" ] &&
                        step "compute-sanitizer $tool, the same, wide shapes" env "${opt_a[@]}" compute-sanitizer --tool $tool \
                                --error-exitcode 9 "$build/tools/x4-logits" --model "$tmp/wide/wide.gguf" --prompt 5,6,7 \
                                --decode 9,99 --device cuda --out "$tmp/san-opt-aw.bin"
                step "compute-sanitizer $tool, mHC a warp a token + tiled router, 1,034-token pass, tiny model" \
                        san_opt_b $tool
        done
fi

# ---- MTP: the NextN block on CUDA (issue 16) ----
# x4-gpu-check nextn: CUDA vs CPU trunk logits and hidden rows, NextN draft logits and hidden rows
# and a chained draft (worst per-row max|cuda - cpu| / max|cpu| <= 1e-3, the bound of the trunk's
# logits; 1e-2 with the f16 latent cache or the tensor-core products), a row over it accepted only
# on an MoE routing flip at its position (the trunk's, for a NextN row also the block's) whose CPU
# margin is a near-tie (route-compare.h: < 1e-4; < 1e-2 with the bf16-input tensor-core products);
# NextN rows one call each bit-identical to one call; the block's layer in every page and carried
# by page_read/page_write; MTP off/on trunk logits identical
mkdir -p "$tmp/nextn"
nextn_tiny=$tmp/nextn/tiny-nextn.gguf
if step "make tiny model with a NextN block" "$build/tools/x4-mkmodel" --preset tiny --nextn 1 \
        --quiet --out "$nextn_tiny"; then
        step "nextn: cuda vs cpu, tiny + NextN block (rel <= 1e-3)" "$check" nextn "$nextn_tiny"
        step "nextn: cuda vs cpu, tiny + NextN block, f16 latent cache (rel <= 1e-2)" \
                env X4_GPU_CACHE=f16 "$check" nextn "$nextn_tiny"
        step "nextn: cuda vs cpu, tiny + NextN block, tensor-core products (rel <= 2e-2)" \
                env X4_CUDA_MM=tc "$check" nextn "$nextn_tiny"
fi
if [ -f "$tmp/demo.gguf" ]; then
        step "nextn: cuda vs cpu, demo model (rel <= 1e-3)" "$check" nextn "$tmp/demo.gguf"
        # x4-logits --nextn-out (every position's draft row, as the engine writes the NextN rows):
        # CUDA vs CPU on a 300-token prompt (two 256-token pages), prompt chunked by 64 on CUDA
        nextn_logits() {
                local prompt
                prompt=$(awk 'BEGIN { s = 3; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" --decode 9,99 \
                        --device cuda --chunk 64 --out "$tmp/nextn/trunk-cuda.bin" \
                        --nextn-out "$tmp/nextn/draft-cuda.bin" || return 1
                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$prompt" --decode 9,99 \
                        --device cpu --out "$tmp/nextn/trunk-cpu.bin" \
                        --nextn-out "$tmp/nextn/draft-cpu.bin" || return 1
                if [ -z "$py" ]; then
                        echo "no python3 with numpy for the comparison"
                        return 1
                fi
                "$py" tests/gpu/compare.py "$tmp/nextn/trunk-cuda.bin" "$tmp/nextn/trunk-cpu.bin" \
                        4096 1e-3 "x4-logits trunk (mtp on) cuda vs cpu" || return 1
                "$py" tests/gpu/compare.py "$tmp/nextn/draft-cuda.bin" "$tmp/nextn/draft-cpu.bin" \
                        4096 1e-3 "x4-logits --nextn-out cuda vs cpu"
        }
        step "nextn: x4-logits --nextn-out cuda vs cpu, demo model (rel <= 1e-3)" nextn_logits
        # greedy generation with MTP on byte-identical to MTP off on CUDA: x4-bench runs both on
        # one backend and exits non-zero when the tokens differ ("same_tokens" in its JSON);
        # every draft count, f32 and f16 (the daemon's default on CUDA) latent caches
        for cache in f32 f16; do
                for draft in 1 2 3; do
                        step "mtp on == off greedy on cuda, demo model, cache $cache, draft $draft" \
                                "$build/tools/x4-bench" --model "$tmp/demo.gguf" --device cuda \
                                --cache $cache --prefill none --decode-ctx none --decode-tokens 96 \
                                --repeats 1 --mtp on --mtp-draft $draft --json
                done
        done
        step "mtp on == off greedy on cuda, tiny + NextN block, draft 3" "$build/tools/x4-bench" \
                --model "$nextn_tiny" --device cuda --prefill none --decode-ctx none \
                --decode-tokens 96 --repeats 1 --mtp on --mtp-draft 3 --json
fi
# The trained demo model (models/xing4-demo, issue 15), when the tree has it: the same parity,
# invariance and NextN checks as the synthetic demo model, and greedy MTP on == off on CUDA.
trained=${X4_DEMO_MODEL:-models/xing4-demo/model.gguf}
if [ -f "$trained" ]; then
        step "cuda vs cpu, trained demo model, 512 + 64 greedy" "$check" parity "$trained" 512 64
        step "cuda vs cpu, trained demo model, prompts labeled, 512 + 64 greedy" env X4_GPU_PROMPT=1 \
                "$check" parity "$trained" 512 64
        step "prompt and generated tokens, trained demo model" "$check" classes "$trained"
        step "batch invariance, trained demo model" "$check" batch "$trained"
        step "chunk invariance, trained demo model" "$check" chunks "$trained"
        step "nextn: cuda vs cpu, trained demo model (rel <= 1e-3)" "$check" nextn "$trained"
        for draft in 1 3; do
                step "mtp on == off greedy on cuda, trained demo model, draft $draft" \
                        "$build/tools/x4-bench" --model "$trained" --device cuda --prefill none \
                        --decode-ctx none --decode-tokens 96 --repeats 1 --mtp on --mtp-draft $draft --json
        done
else
        echo "=== trained demo model: $trained absent, its checks not run"
fi
# tests/integration/test_mtp.py with every daemon on CUDA (X4_TEST_DEVICE=cuda): greedy identical
# to MTP off alone and batched, stops, grammars, snapshots, preemption, the sampled distribution.
# Needs a build with the daemon (RPC on) and pytest + systemd-socket-activate.
daemon_build=${X4_GPU_DAEMON_BUILD:-$build}
case $daemon_build in /*) ;; *) daemon_build=$PWD/$daemon_build ;; esac
if [ -x "$daemon_build/daemon/xing4d" ] && [ -x "$daemon_build/cli/x4ctl" ]; then
        pyt=
        for p in /usr/bin/python3 python3; do
                if "$p" -c 'import pytest' 2>/dev/null; then pyt=$p; break; fi
        done
        if [ -n "$pyt" ] && command -v systemd-socket-activate >/dev/null; then
                step "test_mtp.py with the daemons on cuda" env X4_TEST_DEVICE=cuda \
                        X4_BUILD_DIR="$daemon_build" X4_SOURCE_DIR="$PWD" \
                        X4_FIXTURES="$PWD/tests/fixtures" \
                        X4_CLIENT_TEST="$daemon_build/tests/integration/x4-client-test" \
                        "$pyt" -m pytest tests/integration/test_mtp.py -q -p no:cacheprovider
        else
                results+=("FAIL  test_mtp.py on cuda: the daemon is built but pytest or systemd-socket-activate is missing")
                failed=1
        fi
else
        results+=("SKIP  test_mtp.py on cuda: $daemon_build has no daemon (built with -Drpc=disabled); X4_GPU_DAEMON_BUILD=DIR names a build with it")
fi

if [ -n "${X4_GPU_FULL_MODEL:-}" ]; then
        step "cuda vs cpu, $X4_GPU_FULL_MODEL, 512 + 64 greedy" "$check" parity "$X4_GPU_FULL_MODEL" 512 64
fi
# X4_GPU_BENCH=1: decode/prefill rates on full-width synthetic models of a few layers (x4-mkmodel
# preset full with --layers N): per-layer cost at the real shapes without the 20 GB file.
if [ -n "${X4_GPU_BENCH:-}" ]; then
        for layers in 2 6; do
                mkdir -p "$tmp/full$layers" # its own folder: config.json beside demo.gguf's would break it
                if step "make full-width model, $layers layers" "$build/tools/x4-mkmodel" --preset full \
                        --layers $layers --dense 1 --nextn 0 --quiet --out "$tmp/full$layers/full.gguf"; then
                        step "x4-bench cuda, full width, $layers layers" "$build/tools/x4-bench" \
                                --model "$tmp/full$layers/full.gguf" --device cuda --prefill 512,4096 \
                                --decode-ctx 512,4096 --batch 1,16 --decode-tokens 16 --repeats 3
                fi
                rm -rf "$tmp/full$layers"
        done
fi
if command -v compute-sanitizer >/dev/null; then
        step "compute-sanitizer memcheck" compute-sanitizer --tool memcheck --error-exitcode 9 \
                --leak-check full "$check" quick "$tiny"
        step "compute-sanitizer racecheck" compute-sanitizer --tool racecheck --error-exitcode 9 \
                "$check" quick "$tiny"
        step "compute-sanitizer synccheck" compute-sanitizer --tool synccheck --error-exitcode 9 \
                "$check" quick "$tiny"
        for tool in racecheck synccheck memcheck; do
                step "compute-sanitizer $tool, MoE groupings" env X4_GPU_GROUP_QUICK=1 compute-sanitizer --tool $tool \
                        --error-exitcode 9 "$check" group "$build/kernels/cuda/xing4d-cuda.so"
        done
        # prompt passes (X4_GPU_PROMPT=1: the quick mode's prompts labeled, so the prompt kernels run:
        # mha.cu's by default)
        step "compute-sanitizer memcheck, prompts labeled" env X4_GPU_PROMPT=1 compute-sanitizer --tool memcheck \
                --error-exitcode 9 "$check" quick "$tiny"
        step "compute-sanitizer racecheck, prompts labeled" env X4_GPU_PROMPT=1 compute-sanitizer --tool racecheck \
                --error-exitcode 9 "$check" quick "$tiny"
        step "compute-sanitizer synccheck, prompts labeled" env X4_GPU_PROMPT=1 compute-sanitizer --tool synccheck \
                --error-exitcode 9 "$check" quick "$tiny"
        # the f16 cache: its decode attention (k_attn_dtc), and a 300-token prompt through it (every
        # token of an x4-logits run takes the decode kernel): ten sub-parts a part, the ring of
        # copies wrapping around, two parts a query
        long=$(awk 'BEGIN { s = 31; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 400 } }')
        # the lean layout (X4_CUDA_DTC_2SM=1) on the tiny shapes (D = 80: the last 16-value
        # step of the scores from the shared rope-key buffer): eight sub-parts a part through
        # its ring of two, the rope-key buffer rewritten every sub-part, p over the scores;
        # a refusal on stderr fails the step (the default would have run instead)
        san_lean() {
                X4_CUDA_DTC_2SM=1 X4_CUDA_ATTN_DECODE_PART=256 compute-sanitizer --tool "$1" --error-exitcode 9 \
                        "$build/tools/x4-logits" --model "$tiny" --cache f16 --prompt "$long" --decode 5,6 \
                        --device cuda --out "$tmp/san-lean.bin" 2>"$tmp/san-lean.err" || { cat "$tmp/san-lean.err"; return 1; }
                cat "$tmp/san-lean.err"
                if grep -q "X4_CUDA_DTC_2SM" "$tmp/san-lean.err"; then echo "the lean layout did not run"; return 1; fi
        }
        for tool in memcheck racecheck synccheck; do
                step "compute-sanitizer $tool, f16 cache" env X4_GPU_CACHE=f16 compute-sanitizer --tool $tool \
                        --error-exitcode 9 "$check" quick "$tiny"
                step "compute-sanitizer $tool, f16 cache, 300-token prompt" env X4_CUDA_DTC_2SM=0 compute-sanitizer --tool $tool \
                        --error-exitcode 9 "$build/tools/x4-logits" --model "$tiny" --cache f16 --prompt "$long" \
                        --decode 5,6 --device cuda --out "$tmp/san-long.bin"
                step "compute-sanitizer $tool, f16 cache, 300-token prompt, one sub-part a round" env X4_CUDA_DTC_2SM=0 X4_CUDA_DTC_PAIR=0 \
                        X4_CUDA_ATTN_DECODE_PART=256 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tools/x4-logits" \
                        --model "$tiny" --cache f16 --prompt "$long" --decode 5,6 --device cuda --out "$tmp/san-long.bin"
                step "compute-sanitizer $tool, f16 cache, 300-token prompt, two blocks an SM" san_lean $tool
                for hg in 16 8; do
                        step "compute-sanitizer $tool, f16 cache, 300-token prompt, blocks of $hg heads" env X4_CUDA_DTC_2SM=0 \
                                X4_CUDA_DTC_HG=$hg compute-sanitizer --tool $tool --error-exitcode 9 "$build/tools/x4-logits" \
                                --model "$tmp/h40/h40.gguf" --cache f16 --prompt "$long" --decode 5,6 --device cuda \
                                --out "$tmp/san-hg.bin"
                done
        done
        # the tensor-core products for every token count (X4_CUDA_MM=tc) on the demo model: a
        # 30-token prompt in chunks of 20 (k_mm_tcp, experts grouped) and 10 (k_mm_tcd, dense and
        # pairs), then decodes on k_mm_tcs (its 512-value rows two parts, a warp each); and
        # k_mm_tcs with one warp and a ring of two slots (X4_CUDA_MMTC_SPLIT=1x2: slots reused)
        if [ -f "$tmp/demo.gguf" ]; then
                p30=$(seq -s, 5 34)
                for tool in memcheck racecheck synccheck; do
                        step "compute-sanitizer $tool, tensor-core products, demo model" env X4_CUDA_MM=tc \
                                compute-sanitizer --tool $tool --error-exitcode 9 "$build/tools/x4-logits" \
                                --model "$tmp/demo.gguf" --prompt "$p30" --chunk 20 \
                                --decode 9,99 --device cuda --out "$tmp/san-tc.bin"
                        step "compute-sanitizer $tool, tensor-core products, IQ4_NL decoded once a block, demo model" \
                                env X4_CUDA_MM=tc X4_CUDA_MMTCP_DEC1=1 compute-sanitizer --tool $tool --error-exitcode 9 \
                                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$p30" --decode 9 --device cuda \
                                --out "$tmp/san-d1.bin"
                        step "compute-sanitizer $tool, tensor-core products, k_mm_tcs 1x2, demo model" env X4_CUDA_MM=tc \
                                X4_CUDA_MMTC_SPLIT=1x2 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tools/x4-logits" \
                                --model "$tmp/demo.gguf" --prompt 5,6,7 --decode 9,99 --device cuda --out "$tmp/san-tcs.bin"
                        step "compute-sanitizer $tool, tensor-core products, k_mm_tcs one-wave build, demo model" env X4_CUDA_MM=tc \
                                X4_CUDA_MMTC_ONEWAVE=force compute-sanitizer --tool $tool --error-exitcode 9 "$build/tools/x4-logits" \
                                --model "$tmp/demo.gguf" --prompt 5,6,7 --decode 9,99 --device cuda --out "$tmp/san-tcs.bin"
                        step "compute-sanitizer $tool, tensor-core products, several m-tiles a block (k_mm_tcp1), demo model" \
                                env X4_CUDA_MM=tc X4_CUDA_MMTC_PST=force compute-sanitizer --tool $tool --error-exitcode 9 \
                                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt 5,6,7 --decode 9,99 --device cuda \
                                --out "$tmp/san-pst.bin"
                        step "compute-sanitizer $tool, tensor-core products, k_mm_tcs variant 3 on a ring of one slot, demo model" \
                                env X4_CUDA_MM=tc X4_CUDA_MMTC_SPLIT=1x1 compute-sanitizer --tool $tool --error-exitcode 9 \
                                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt 5,6,7 --decode 9,99 --device cuda \
                                --out "$tmp/san-var.bin"
                        step "compute-sanitizer $tool, the mHC kernel's spread tail on chunks of 5, demo model" \
                                env X4_CUDA_HC=fused X4_CUDA_HC_GRID=1 compute-sanitizer --tool $tool --error-exitcode 9 \
                                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$(seq -s, 5 14)" --chunk 5 \
                                --decode 9,99 --device cuda --out "$tmp/san-hcg.bin"
                        h1280_model
                        step "compute-sanitizer $tool, the FFN's mHC kernel routing its token (chunks of 5 and 1), 1,280 wide" \
                                env X4_CUDA_HC=fused X4_CUDA_HC_ROUTE=1 compute-sanitizer --tool $tool --error-exitcode 9 \
                                "$build/tools/x4-logits" --model "$tmp/hcr/h1280.gguf" --prompt "$(seq -s, 5 14)" --chunk 5 \
                                --decode 9,99 --device cuda --out "$tmp/san-hcr.bin"
                        step "compute-sanitizer $tool, the spread mHC tail's release barriers and the router's ticket (chunks of 5 and 1), demo model" \
                                env X4_CUDA_HC=fused X4_CUDA_HC_RELEASE=1 X4_CUDA_ROUTER_RELEASE=1 \
                                compute-sanitizer --tool $tool --error-exitcode 9 \
                                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$(seq -s, 5 14)" --chunk 5 \
                                --decode 9,99 --device cuda --out "$tmp/san-hcrel.bin"
                        step "compute-sanitizer $tool, the attention combine's deep chains (parts of 32), demo model" \
                                env X4_CUDA_COMBINE=deep X4_CUDA_ATTN_DECODE_PART=32 X4_CUDA_ATTN_PROMPT_PART=32 \
                                compute-sanitizer --tool $tool --error-exitcode 9 "$build/tools/x4-logits" --model "$tmp/demo.gguf" \
                                --cache f16 --prompt "$(seq -s, 5 304)" --decode 9,99 --device cuda --out "$tmp/san-cd.bin"
                        # (a pass of 64 tokens: 320 pairs, k_mm_tcp's grouped tiles; passes of 20 take k_mm_tcs)
                        step "compute-sanitizer $tool, tensor-core products, narrow grouped layout, demo model" \
                                env X4_CUDA_MM=tc X4_CUDA_MMTCP_NARROW=1 compute-sanitizer --tool $tool --error-exitcode 9 \
                                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$(seq -s, 5 74)" --chunk 64 \
                                --decode 9,99 --device cuda --out "$tmp/san-nw.bin"
                        step "compute-sanitizer $tool, the Q6_K head with 16-byte input loads (passes of 64 and 6), demo model" \
                                env X4_CUDA_MM=tc X4_CUDA_MM_Q6TC=1 X4_CUDA_Q6TC_B16=1 compute-sanitizer --tool $tool --error-exitcode 9 \
                                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$(seq -s, 5 74)" --chunk 64 \
                                --decode 9,99 --device cuda --out "$tmp/san-q6b16.bin"
                        step "compute-sanitizer $tool, tensor-core products, K split one part a block, demo model" \
                                env X4_CUDA_MM=tc X4_CUDA_MMTCP_KS=1 compute-sanitizer --tool $tool --error-exitcode 9 \
                                "$build/tools/x4-logits" --model "$tmp/demo.gguf" --prompt "$(seq -s, 5 44)" --chunk 40 \
                                --decode 9,99 --device cuda --out "$tmp/san-ks.bin"
                        # the wide shapes (wide_same's model): the head's staged decode over two
                        # tiles and the 8-warp one-wave build
                        [ -f "$tmp/wide/wide.gguf" ] &&
                                step "compute-sanitizer $tool, wide shapes (Q6_K head tiles, one-wave build of 8 warps)" env X4_CUDA_MM=tc \
                                        X4_CUDA_RW=1 X4_CUDA_MMTC_ONEWAVE=force compute-sanitizer --tool $tool --error-exitcode 9 "$build/tools/x4-logits" \
                                        --model "$tmp/wide/wide.gguf" --prompt 5,6,7 --decode 9,99 --device cuda --out "$tmp/san-wide.bin"
                done
        fi
        if [ -f "$nextn_tiny" ]; then
                step "compute-sanitizer memcheck, nextn" compute-sanitizer --tool memcheck \
                        --error-exitcode 9 --leak-check full "$check" nextn "$nextn_tiny"
                # 40 of the 199 one-call-each NextN rows (two pages of 32): those calls were most of
                # the step's 114 s under racecheck; memcheck above runs all of them
                step "compute-sanitizer racecheck, nextn" env X4_GPU_NEXTN_EACH=40 compute-sanitizer --tool racecheck \
                        --error-exitcode 9 "$check" nextn "$nextn_tiny"
        fi
else
        results+=("FAIL  compute-sanitizer not found")
        failed=1
fi

if { [ -n "${X4_GPU_ONLY:-}" ] || [ -n "${X4_GPU_SKIP:-}" ]; } && [ "$ran" -eq 0 ]; then
        results+=("FAIL  X4_GPU_ONLY=${X4_GPU_ONLY:-} X4_GPU_SKIP=${X4_GPU_SKIP:-}: no step ran")
        failed=1
fi
grep -E '^(CUDA|prompts|classes|fixture|parity|batch|chunks|errors|pages|quick|nextn|x4-logits|\{"what":"generate"|FAIL)' "$log" | grep -v ' checks, ' || true
echo
printf '%s\n' "${results[@]}" | tee -a "$log"
echo "log: $log"
exit $failed
