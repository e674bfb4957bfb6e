#!/bin/bash
# SPDX-License-Identifier: MIT
# The full-size checks of the CUDA backend, on a GPU machine with ~25 GB free disk:
#
#   bash tests/gpu/full-model.sh [RPC_BIN_DIR]
#
#  1. builds build-gpu (engine, tools, CUDA module; -Drpc=disabled) unless already built;
#  2. writes the `full` synthetic model (x4-mkmodel --preset full: the release's 977 tensors,
#     ~20.1 GB) into build-gpu/full/ and reports the write time;
#  3. x4-bench --device cuda on it (load time, prefill, decode for batch 1/16/64, per-class
#     profiles; steps prefill32k and decode32k: the 32,768-token rows);
#  4. CUDA vs CPU on it: a 512-token prompt at every position + 64 greedy tokens (x4-gpu-check),
#     after the CPU reference against itself with one layer-0 weight one ulp off (conditioning:
#     positions where the model amplifies rounding past the bound are waived and reported);
#  5. with RPC_BIN_DIR (xing4d, x4ctl, xing4-http and the shared libraries they need, built on a
#     machine that has the RPC headers): the daemon on --device cuda serving x4ctl and the bridge.
# Logs go to $OUT (else build-gpu/). X4_FULL_STEPS=mkmodel,bench,prefill32k,decode32k,parity,daemon
# picks steps (default: all).
set -u
cd "$(dirname "$0")/../.." || exit 1
build=${X4_GPU_BUILD:-build-gpu}
outdir=${OUT:-$build}
steps=${X4_FULL_STEPS:-mkmodel,bench,prefill32k,decode32k,parity,daemon}
rpc=${1:-}
mkdir -p "$outdir"
export X4_COMMIT=${X4_COMMIT:-unknown}
has() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }
say() { echo "=== $(date -u +%T) $*"; }

if [ ! -f "$build/build.ninja" ]; then
        meson setup "$build" -Drpc=disabled -Dgpu_archs="${X4_GPU_ARCHS:-90}" -Dcuda=enabled \
                --buildtype=release >"$outdir/setup.log" 2>&1 || { cat "$outdir/setup.log"; exit 1; }
fi
ninja -C "$build" -j"$(nproc)" >"$outdir/build.log" 2>&1 || { tail -40 "$outdir/build.log"; exit 1; }
case $build in /*) ;; *) build=$PWD/$build ;; esac
export X4_CUDA_MODULE=$build/kernels/cuda/xing4d-cuda.so
model=$build/full/model.gguf
mkdir -p "$build/full"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv

if has mkmodel || [ ! -f "$model" ]; then
        say "x4-mkmodel --preset full"
        t0=$(date +%s.%N)
        "$build/tools/x4-mkmodel" --preset full --seed 1 --out "$model" 2>&1 | tail -2
        t1=$(date +%s.%N)
        ls -l "$model"
        awk -v a="$t0" -v b="$t1" 'BEGIN { printf "full model written in %.1f s\n", b - a }'
        df -h "$build/full" | tail -1
fi

if has bench; then
        say "x4-bench --device cuda, full model: 512 / 4096, batch 1/16/64, profiled"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512,4096 \
                --decode-ctx 512,4096 --batch 1,16,64 --decode-tokens 16 --repeats 3 --profile \
                2>&1 | tee "$outdir/bench-full.txt"
fi

# 32K: one prefill (minutes at this backend's prefill rate, so no warm-up run and one repeat),
# then decode at 32K context (x4-bench prefills 4096 tokens and copies pages up to 32K); batch 64
# × 32K needs the f16 cache (97 GB; f32 would be 195 GB)
if has prefill32k; then
        say "x4-bench --device cuda, full model: prefill 32768"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill 32768 --decode-ctx none \
                --warmup 0 --repeats 1 2>&1 | tee "$outdir/bench-prefill32k.txt"
fi
if has decode32k; then
        say "x4-bench --device cuda, full model: decode at 32768, batch 1/16 (f32 cache), 64 (f16)"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 32768 \
                --batch 1,16 --decode-tokens 16 --repeats 3 --profile \
                2>&1 | tee "$outdir/bench-decode32k.txt"
        "$build/tools/x4-bench" --model "$model" --device cuda --cache f16 --prefill none \
                --decode-ctx 32768 --batch 64 --decode-tokens 8 --repeats 2 --profile \
                2>&1 | tee -a "$outdir/bench-decode32k.txt"
fi

if has parity; then
        say "CUDA vs CPU, full model, 512 prompt + 64 greedy"
        # the whole output kept (one line per position over the bound or with a routing flip,
        # then the routing summary and the route rule's verdict); its parity/FAIL/FATAL lines shown
        # first the reference against itself one ulp off (CPU only): the positions where this
        # random model amplifies rounding past the bound, which the parity rule then waives
        X4_GPU_PARITY_DUMP=$outdir "$build/kernels/cuda/x4-gpu-check" conditioning "$model" 512 64 \
                >"$outdir/conditioning-full.txt" 2>&1
        grep -E '^(conditioning|FAIL|FATAL)' "$outdir/conditioning-full.txt"
        X4_GPU_CONDITION=$outdir/conditioning.txt \
                "$build/kernels/cuda/x4-gpu-check" parity "$model" 512 64 >"$outdir/parity-full.txt" 2>&1
        echo "x4-gpu-check parity exit status $?"
        grep -E '^(parity|FAIL|FATAL)' "$outdir/parity-full.txt" | tail -60
fi

if has daemon && [ -n "$rpc" ]; then
        say "xing4d --device cuda on the full model, x4ctl and xing4-http"
        export LD_LIBRARY_PATH=$PWD/$rpc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        run=$(mktemp -d)
        "$rpc/xing4d" --model "$model" --device cuda --listen "$run/sock" --state-dir "$run" \
                --log-level info >"$outdir/xing4d-full.log" 2>&1 &
        dpid=$!
        for _ in $(seq 1 600); do
                "$rpc/x4ctl" --socket "$run/sock" health >/dev/null 2>&1 && break
                kill -0 $dpid 2>/dev/null || break
                sleep 0.2
        done
        "$rpc/x4ctl" --socket "$run/sock" info
        "$rpc/x4ctl" --socket "$run/sock" generate --max-tokens 32 --seed 3 --show-think \
                "What is the capital of France?"
        echo
        "$rpc/x4ctl" --socket "$run/sock" --json generate --max-tokens 64 --temperature 0 \
                --no-think "Count to ten." | tail -1
        "$rpc/xing4-http" --listen 127.0.0.1:8077 --socket "$run/sock" &
        bpid=$!
        for _ in $(seq 1 100); do
                curl -sf http://127.0.0.1:8077/health >/dev/null 2>&1 && break
                sleep 0.1
        done
        curl -s http://127.0.0.1:8077/v1/chat/completions -H 'Content-Type: application/json' \
                -d '{"model":"xing4","messages":[{"role":"user","content":"Say hello."}],"max_tokens":24,"seed":1}'
        echo
        "$rpc/x4ctl" --socket "$run/sock" stats
        kill $bpid 2>/dev/null
        kill $dpid 2>/dev/null
        wait $dpid
        echo "xing4d exit status $?"
        tail -5 "$outdir/xing4d-full.log"
fi
