#!/bin/bash
# One GPU-machine call for the decode work (issue 11): build, the GPU tests, the full synthetic
# model, x4-bench decode rows with and without graphs, a profile. Output under $OUT.
# The `tests` step runs tests/gpu/run.sh (the MTP / NextN checks of issue 16 included); the `mtp`
# step (not a default: X4_COMMIT=... bash scripts/device/decode-bench.sh tests,mkmodel,mtp) the
# MTP verify-cost and demo-model measurements; the `mtpdemo` step (not a default either; it needs
# no mkmodel step) MTP on the shipped trained models/xing4-demo with chat questions
# (x4-bench --mtp-prompt), into $OUT/mtp-demo-trained.jsonl.
# Usage (on the GPU machine): X4_COMMIT=abc1234 bash scripts/device/decode-bench.sh [steps]
set -u
cd "$(dirname "$0")/../.." || exit 1
steps=${1:-tests,mkmodel,bench,profile}
out=${OUT:-/tmp/x4out}
mkdir -p "$out"
has() { case ",$steps," in *",$1,"*) return 0 ;; esac; return 1; }
say() { echo "=== $(date -u +%T) $*"; }
build=$PWD/build-gpu
export X4_COMMIT=${X4_COMMIT:-unknown}
if has peer || has peerend; then
        ( cd .devcarry/llamacpp && tar -xJf src.tar.xz && cd llamacpp-xing4-kit &&
                JOBS=12 ./build-cuda.sh ./build-cuda ) >"$out/llama-build.log" 2>&1 &
fi
if has cpu16; then
        # issue 18: llama.cpp's CPU build of the same kit, for the CPU rows beside ours
        ( mkdir -p /tmp/llcpu && cd /tmp/llcpu && tar -xJf "$OLDPWD/.devcarry/llamacpp/src.tar.xz" &&
                cd llamacpp-xing4-kit && CPU_ONLY=1 JOBS=8 ./build-cuda.sh ./build-cpu ) >"$out/llama-cpu-build.log" 2>&1 &
fi
# .devcarry/prebuilt (scripts/device/prebuilt.sh, carried): the five programs built on the
# development machine from this very tree (its stamp says so), so no build here; X4_NO_PREBUILT=1
# builds anyway
. scripts/device/prebuilt.sh
if [ -z "${X4_NO_PREBUILT:-}" ] && x4_prebuilt_ok .devcarry/prebuilt; then
        build=$PWD/.devcarry/prebuilt
        export X4_GPU_PREBUILT=1
        # the loader finds this machine's CUDA runtime (the binaries' rpath names the other's)
        cudalib=$(cd "$(dirname "$(command -v nvcc)")/../lib64" 2>/dev/null && pwd)
        [ -n "$cudalib" ] && export LD_LIBRARY_PATH=$cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        say "prebuilt: $(sed -n 2p "$build/STAMP"), no build"
else
        [ -d .devcarry/prebuilt ] && [ -z "${X4_NO_PREBUILT:-}" ] &&
                say "prebuilt: .devcarry/prebuilt was built from other sources (stamp $(head -1 .devcarry/prebuilt/STAMP 2>/dev/null), tree $(x4_src_stamp)): building"
        if [ ! -f "$build/build.ninja" ]; then
                meson setup "$build" -Drpc=disabled -Dgpu_archs=90 -Dcuda=enabled --buildtype=release \
                        >"$out/setup.log" 2>&1 || { cat "$out/setup.log"; exit 1; }
        fi
        say build
        # X4_NINJA_TARGETS: build only these (a short call)
        ninja -C "$build" -j"$(nproc)" ${X4_NINJA_TARGETS:-} >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
fi
export X4_CUDA_MODULE=$build/kernels/cuda/xing4d-cuda.so
if has tests; then
        say "tests/gpu/run.sh"
        X4_GPU_BUILD=$build bash tests/gpu/run.sh 2>&1 | tail -120
fi
# promptcheck V: a prompt attention variant (X4_CUDA_ATTN_PROMPT=V) on its first runs: a 700-token
# prompt labeled as a prompt (demo model) whole vs chunks of 1/7/64/100 and with parts of 64, the
# fixture vs its f64 oracle with prompts labeled, chunk and batch checks, the three sanitizers on the
# quick mode with prompts labeled (before 2026-12-03's fourth session they ran it without: no
# prompt pass); with X4_FA_BENCH=1 the full model's prefill rates beside the default kernel
promptcheck() {
        local v=$1
        say "promptcheck $v"
        export X4_CUDA_ATTN_PROMPT=$v
        ck=$build/kernels/cuda/x4-gpu-check
        fx=tests/fixtures/xing4-tiny-a
        mkdir -p /tmp/fa && [ -f /tmp/fa/demo.gguf ] || "$build/tools/x4-mkmodel" --preset demo --quiet --out /tmp/fa/demo.gguf
        prompt=$(awk 'BEGIN { s = 19; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
        for c in 0 1 7 64 100; do
                "$build/tools/x4-logits" --model /tmp/fa/demo.gguf --prompt-class --prompt "$prompt" \
                        $([ $c -gt 0 ] && echo --chunk $c) --decode 9,99 --device cuda --out /tmp/fa/$v-$c.bin 2>&1 | tail -1
                [ $c -gt 0 ] && cmp /tmp/fa/$v-0.bin /tmp/fa/$v-$c.bin && echo "$v: chunk $c = whole"
        done
        for c in 0 7; do
                X4_CUDA_ATTN_PROMPT_PART=64 "$build/tools/x4-logits" --model /tmp/fa/demo.gguf --prompt-class --prompt "$prompt" \
                        $([ $c -gt 0 ] && echo --chunk $c) --decode 9,99 --device cuda --out /tmp/fa/${v}64-$c.bin 2>&1 | tail -1
        done
        cmp /tmp/fa/${v}64-0.bin /tmp/fa/${v}64-7.bin && echo "$v: parts of 64, chunk 7 = whole"
        X4_CUDA_ATTN_PROMPT=tc2 "$build/tools/x4-logits" --model /tmp/fa/demo.gguf --prompt-class --prompt "$prompt" \
                --decode 9,99 --device cuda --out /tmp/fa/tc2-0.bin 2>&1 | tail -1
        "$build/tools/x4-logits" --model /tmp/fa/demo.gguf --prompt "$prompt" --decode 9,99 --device cpu \
                --out /tmp/fa/cpu-0.bin 2>&1 | tail -1
        V=$v python3 - <<'PY'
import os
import numpy as np
v = os.environ["V"]
a = np.fromfile('/tmp/fa/%s-0.bin' % v, dtype=np.float32)
for ref in ("tc2", "cpu"):
    b = np.fromfile('/tmp/fa/%s-0.bin' % ref, dtype=np.float32)
    n = min(a.size, b.size)
    print("%s vs %s logits: %d values, max |diff| %.3g, max |%s| %.3g, identical %d" % (v, ref, n, np.abs(a[:n] - b[:n]).max(), ref, np.abs(b[:n]).max(), int((a[:n] == b[:n]).all())))
PY
        X4_GPU_PROMPT=1 "$ck" fixture "$fx" --no-cpu 2>&1 | tail -2
        X4_GPU_PROMPT=1 "$ck" chunks /tmp/fa/demo.gguf 2>&1 | tail -1
        X4_GPU_PROMPT=1 "$ck" batch /tmp/fa/demo.gguf 2>&1 | tail -1
        for tool in memcheck racecheck synccheck; do
                X4_GPU_PROMPT=1 compute-sanitizer --tool $tool --error-exitcode 9 "$ck" quick "$fx/model.gguf" >/tmp/fa/san-$tool.log 2>&1
                echo "$v: compute-sanitizer $tool rc $?"; grep -m3 -E "ERROR|Hazard|error" /tmp/fa/san-$tool.log
        done
        unset X4_CUDA_ATTN_PROMPT
        if [ -n "${X4_FA_BENCH:-}" ]; then
                mkdir -p /tmp/fa/full && { [ -f /tmp/fa/full/full.gguf ] || "$build/tools/x4-mkmodel" --preset full --seed 1 --quiet --out /tmp/fa/full/full.gguf; }
                for k in tc2 $v; do
                        X4_CUDA_ATTN_PROMPT=$k "$build/tools/x4-bench" --model /tmp/fa/full/full.gguf --device cuda --prefill 512,4096 \
                                --decode-ctx none --repeats ${X4_FA_REPEATS:-1} --json 2>&1 | sed "s/}\$/,\"attn_prompt\":\"$k\"}/" |
                                tee -a "$out/fa-bench.jsonl" | grep -o '"tokens":[0-9]*,"tok_s":[0-9.]*' | sed "s/^/$k /"
                done
                if [ -n "${X4_FA_LONG:-}" ]; then
                        # the class profile of a 4,096-token prefill, and 32,768 tokens, with V
                        X4_CUDA_ATTN_PROMPT=$v "$build/tools/x4-bench" --model /tmp/fa/full/full.gguf --device cuda --prefill 4096 \
                                --decode-ctx none --repeats 1 --profile 2>&1 | grep -E "^  [a-z]|^prefill"
                        for k in $v tc2; do
                                X4_CUDA_ATTN_PROMPT=$k "$build/tools/x4-bench" --model /tmp/fa/full/full.gguf --device cuda --prefill 32768 \
                                        --decode-ctx none --repeats 1 --json 2>&1 | sed "s/}\$/,\"attn_prompt\":\"$k\"}/" |
                                        tee -a "$out/fa-bench.jsonl" | grep -o '"tokens":[0-9]*,"tok_s":[0-9.]*' | sed "s/^/$k /"
                        done
                fi
        fi
}
has facheck && promptcheck fa
has mhacheck && promptcheck mha
if has mhasan; then
        # the prompt passes (mha.cu, the default) under the three sanitizers and the chunk / batch
        # checks with prompts labeled (X4_GPU_PROMPT=1: without it the quick mode runs generated
        # tokens only), on the tiny fixture (column tiles of 32) and on a tiny model with the
        # release's head dims (nope 128, rope 64, v 128, latent 512: the full model's kernels)
        say "mhasan"
        ck=$build/kernels/cuda/x4-gpu-check
        mkdir -p /tmp/mhs && "$build/tools/x4-mkmodel" --preset tiny --qk-nope 128 --qk-rope 64 --v-head 128 --kv-lora 512 --quiet --out /tmp/mhs/mhs.gguf
        for m in tests/fixtures/xing4-tiny-a/model.gguf /tmp/mhs/mhs.gguf; do
                for tool in memcheck racecheck synccheck; do
                        X4_GPU_PROMPT=1 compute-sanitizer --tool $tool --error-exitcode 9 "$ck" quick "$m" >/tmp/mhs-$tool.log 2>&1
                        echo "mhasan: $m: $tool rc $? $(grep -m1 -E "SUMMARY" /tmp/mhs-$tool.log)"
                done
                X4_GPU_PROMPT=1 "$ck" chunks "$m" 2>&1 | tail -1
                X4_GPU_PROMPT=1 "$ck" batch "$m" 2>&1 | tail -1
        done
fi
if has mhaquick; then
        # a short check of mha.cu after a change (a call with little device time): demo model
        # 700-token prompt whole = chunks of 7 / 100, parts of 64 whole = chunk 7; the fixture vs
        # f64, chunk and batch checks and the three sanitizers with prompts labeled on the fixture
        # and on a tiny model with the release's head dims; the full model's prefill at 512 / 4,096
        say "mhaquick"
        ck=$build/kernels/cuda/x4-gpu-check
        fx=tests/fixtures/xing4-tiny-a
        # (each model in its own folder: x4-mkmodel writes config.json beside the file)
        mkdir -p /tmp/mq/demo /tmp/mq/mhs /tmp/mq/full
        "$build/tools/x4-mkmodel" --preset demo --quiet --out /tmp/mq/demo/demo.gguf
        "$build/tools/x4-mkmodel" --preset tiny --qk-nope 128 --qk-rope 64 --v-head 128 --kv-lora 512 --quiet --out /tmp/mq/mhs/mhs.gguf
        prompt=$(awk 'BEGIN { s = 19; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
        for pl in 1024 64; do
                for c in 0 7 100; do
                        X4_CUDA_ATTN_PROMPT_PART=$pl "$build/tools/x4-logits" --model /tmp/mq/demo/demo.gguf --prompt-class --prompt "$prompt" \
                                $([ $c -gt 0 ] && echo --chunk $c) --decode 9,99 --device cuda --out /tmp/mq/$pl-$c.bin 2>&1 | tail -1
                        [ $c -gt 0 ] && cmp /tmp/mq/$pl-0.bin /tmp/mq/$pl-$c.bin && echo "mhaquick: parts of $pl, chunk $c = whole"
                done
        done
        X4_GPU_PROMPT=1 "$ck" fixture "$fx" --no-cpu 2>&1 | tail -2
        for m in "$fx/model.gguf" /tmp/mq/mhs/mhs.gguf /tmp/mq/demo/demo.gguf; do
                X4_GPU_PROMPT=1 "$ck" chunks "$m" 2>&1 | tail -1
                X4_GPU_PROMPT=1 "$ck" batch "$m" 2>&1 | tail -1
                # the f16 cache's instance (opt-in until these pass)
                X4_CUDA_ATTN_PROMPT=mha X4_GPU_CACHE=f16 X4_GPU_PROMPT=1 "$ck" chunks "$m" 2>&1 | tail -1
                X4_CUDA_ATTN_PROMPT=mha X4_GPU_CACHE=f16 X4_GPU_PROMPT=1 "$ck" batch "$m" 2>&1 | tail -1
        done
        X4_CUDA_ATTN_PROMPT=mha X4_GPU_CACHE=f16 X4_GPU_PROMPT=1 "$ck" fixture "$fx" --no-cpu 2>&1 | tail -2
        X4_CUDA_ATTN_PROMPT=mha X4_GPU_CACHE=f16 X4_GPU_PROMPT=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
                "$ck" quick /tmp/mq/mhs/mhs.gguf >/tmp/mq/san.log 2>&1
        echo "mhaquick: f16 cache: memcheck rc $? $(grep -m1 -E "SUMMARY" /tmp/mq/san.log)"
        for m in "$fx/model.gguf" /tmp/mq/mhs/mhs.gguf; do
                for tool in memcheck racecheck synccheck; do
                        X4_GPU_PROMPT=1 compute-sanitizer --tool $tool --error-exitcode 9 "$ck" quick "$m" >/tmp/mq/san.log 2>&1
                        echo "mhaquick: $m: $tool rc $? $(grep -m1 -E "SUMMARY" /tmp/mq/san.log)"
                done
        done
        "$build/tools/x4-mkmodel" --preset full --seed 1 --quiet --out /tmp/mq/full/full.gguf
        "$build/tools/x4-bench" --model /tmp/mq/full/full.gguf --device cuda --prefill 512,4096 --decode-ctx none --repeats 1 --json 2>&1 |
                tee -a "$out/mhaquick.jsonl" | grep -o '"tokens":[0-9]*,"tok_s":[0-9.]*'
        X4_CUDA_ATTN_PROMPT=mha "$build/tools/x4-bench" --model /tmp/mq/full/full.gguf --device cuda --cache f16 --prefill 512,4096 \
                --decode-ctx none --repeats 1 --json 2>&1 | tee -a "$out/mhaquick.jsonl" | grep -o '"tokens":[0-9]*,"tok_s":[0-9.]*' | sed 's/^/f16 /'
fi
if has attncheck; then
        # a short check of the prompt kernels when a call has no time for the whole of tests/gpu:
        # two tokens a block vs one (demo model, chunkings), the classes, batch and chunk checks
        # with prompts labeled, the fixture vs its oracle, the sanitizers on the quick mode
        say "attncheck"
        ck=$build/kernels/cuda/x4-gpu-check
        fx=tests/fixtures/xing4-tiny-a
        mkdir -p /tmp/ac && "$build/tools/x4-mkmodel" --preset demo --quiet --out /tmp/ac/demo.gguf
        prompt=$(awk 'BEGIN { s = 19; for (i = 0; i < 700; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
        for v in 1 2; do
                for c in 0 7 64 100; do
                        X4_CUDA_ATTN_TOK=$v "$build/tools/x4-logits" --model /tmp/ac/demo.gguf --prompt-class --prompt "$prompt" \
                                $([ $c -gt 0 ] && echo --chunk $c) --decode 9,99 --device cuda --out /tmp/ac/tok-$v-$c.bin
                done
        done
        "$build/tools/x4-logits" --model /tmp/ac/demo.gguf --prompt-class --prompt "$prompt" --chunk 1 --decode 9,99 \
                --device cuda --out /tmp/ac/tok-c1.bin
        for c in 0 7 64 100; do
                cmp /tmp/ac/tok-1-$c.bin /tmp/ac/tok-2-$c.bin && echo "attncheck: TOK 1 = 2, chunk $c"
                cmp /tmp/ac/tok-2-0.bin /tmp/ac/tok-2-$c.bin && echo "attncheck: chunk $c = whole"
        done
        cmp /tmp/ac/tok-2-0.bin /tmp/ac/tok-c1.bin && echo "attncheck: chunk 1 = whole"
        for v in 1 4; do
                X4_CUDA_ROUTER_RB=$v "$build/tools/x4-logits" --model /tmp/ac/demo.gguf --prompt "$prompt" --chunk 100 \
                        --decode 9,99 --device cuda --out /tmp/ac/rb-$v.bin
        done
        cmp /tmp/ac/rb-1.bin /tmp/ac/rb-4.bin && echo "attncheck: router 4 rows a block = 1"
        for m in /tmp/ac/demo.gguf $fx/model.gguf; do
                "$ck" classes "$m" 2>&1 | tail -3
                X4_GPU_PROMPT=1 "$ck" batch "$m" 2>&1 | tail -2
                X4_GPU_PROMPT=1 "$ck" chunks "$m" 2>&1 | tail -2
        done
        X4_GPU_PROMPT=1 "$ck" fixture "$fx" --no-cpu 2>&1 | tail -2
        for tool in memcheck racecheck synccheck; do
                compute-sanitizer --tool $tool --error-exitcode 9 "$ck" quick "$fx/model.gguf" >/tmp/ac/san-$tool.log 2>&1
                echo "attncheck: compute-sanitizer $tool rc $? ($(grep -c 'ERROR SUMMARY: 0 errors' /tmp/ac/san-$tool.log) clean summaries)"
        done
fi
model=/tmp/x4-full/full.gguf   # its own folder: a model's config.json lies beside it, and the demo models write theirs too
mkdir -p /tmp/x4-full
if has mkmodel; then
        say mkmodel
        "$build/tools/x4-mkmodel" --preset full --seed 1 --quiet --out "$model" 2>&1 | tail -2
fi
if has mmsame; then
        # k_mm against k_matvec on the full shapes (K = 3584, 1024, 768, 512; grouped experts)
        say "k_mm on/off, full model, 600-token prompt"
        prompt=$(awk 'BEGIN { s = 5; for (i = 0; i < 600; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 100000 } }')
        X4_CUDA_MM=fp32 "$build/tools/x4-logits" --model "$model" --prompt "$prompt" --decode 9,99 --device cuda --out /tmp/mm-on.bin 2>&1 | tail -1
        X4_CUDA_MM=0 "$build/tools/x4-logits" --model "$model" --prompt "$prompt" --decode 9,99 --device cuda --out /tmp/mm-off.bin 2>&1 | tail -1
        # (the default is the tensor-core products: k_mm is the fp32 path's, X4_CUDA_MM=fp32)
        cmp /tmp/mm-on.bin /tmp/mm-off.bin && echo "mmsame: identical ($(stat -c %s /tmp/mm-on.bin) bytes)"
        for cfg in 1 2 3; do
                X4_CUDA_MM=$cfg "$build/tools/x4-logits" --model "$model" --prompt "$prompt" --decode 9,99 --device cuda \
                        --out /tmp/mm-$cfg.bin >/dev/null 2>&1
                cmp /tmp/mm-$cfg.bin /tmp/mm-off.bin && echo "mmsame: X4_CUDA_MM=$cfg identical"
        done
fi
if has prefill0; then
        say "prefill bench (default kernels)"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512,4096 --decode-ctx none \
                --repeats 3 --json 2>&1 | tee "$out/prefill.jsonl" | grep '"prefill"'
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512 --decode-ctx none \
                --repeats 1 --profile 2>&1 | tail -30 | tee "$out/prefill-profile.txt"
fi
if has mmcfg; then
        for cfg in 1 2 3; do
                say "prefill 512, k_mm configuration $cfg (X4_CUDA_MM=$cfg)"
                X4_CUDA_MM=$cfg "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512 --decode-ctx none \
                        --repeats 2 --profile 2>&1 | grep -E "^prefill|experts|projections|dense ffn"
        done
fi
if has mmtc; then
        say "tensor-core products (X4_CUDA_MM=tc): prefill and decode"
        X4_CUDA_MM=tc "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512,4096 --decode-ctx none \
                --repeats 3 --json 2>&1 | tee "$out/prefill-tc-mm.jsonl" | grep '"prefill"'
        X4_CUDA_MM=tc "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512 --decode-ctx none \
                --repeats 1 --profile 2>&1 | grep -E "^prefill|experts|projections|dense ffn|attention  "
        X4_CUDA_MM=tc "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512 \
                --batch 1,16,64 --decode-tokens 16 --repeats 3 --json 2>&1 | tee "$out/decode-tc-mm.jsonl" | grep '"decode"'
fi
if has mmtcdec; then
        # k_mm_tcd (the decode-shaped tensor-core kernel: launches of <= 16 tokens, expert launches
        # of <= 144 pairs) computes k_mm_tc's mma chains: with X4_CUDA_MM=tc the logits must be
        # byte-identical with it (X4_CUDA_MMTC_DEC=1, the default) and without (=0). Per model: a
        # prompt whole (k_mm_tc) then batch-1 decodes (k_mm_tcd), in chunks of 7 and 16 (dense
        # launches of one and two n-tiles; expert pairs one a block; on the demo model 16 tokens
        # group pairs by expert), chunks of 1 on the demo model, and x4-gpu-check's batch test
        # (16 sequences of 1..600 tokens alone and batched, three batch-16 decode steps) dumped.
        say "k_mm_tcd vs k_mm_tc (X4_CUDA_MM=tc, X4_CUDA_MMTC_DEC=0/1): cmp of logits, demo and full"
        mkdir -p /tmp/x4-demo; demo=/tmp/x4-demo/demo.gguf
        [ -f "$demo" ] || "$build/tools/x4-mkmodel" --preset demo --quiet --out "$demo" 2>&1 | tail -2
        for m in demo full; do
                mp=$([ $m = demo ] && echo "$demo" || echo "$model")
                [ -f "$mp" ] || { echo "mmtcdec: no $mp (the mkmodel step makes it)"; continue; }
                # the launch shapes k_mm_tcd takes (a 3-token prompt, one decode)
                X4_CUDA_MM=tc X4_CUDA_MMTC_DEC=log "$build/tools/x4-logits" --model "$mp" --prompt 5,6,7 \
                        --decode 9 --device cuda --out /tmp/tcd-log.bin 2>&1 | grep '^k_mm_tcd: ' | sort -u | head -16
                vmax=$([ $m = demo ] && echo 4000 || echo 100000)
                chunks=$([ $m = demo ] && echo "0 1 7 16" || echo "0 7 16")
                prompt=$(awk -v v=$vmax 'BEGIN { s = 5; for (i = 0; i < 600; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % v } }')
                for dec in 0 1; do
                        for c in $chunks; do
                                args=""
                                [ $c -gt 0 ] && args="--chunk $c"
                                X4_CUDA_MM=tc X4_CUDA_MMTC_DEC=$dec "$build/tools/x4-logits" --model "$mp" --prompt "$prompt" \
                                        $args --decode 9,99 --device cuda --out /tmp/tcd-$m-$dec-$c.bin 2>&1 | tail -1
                        done
                        X4_CUDA_MM=tc X4_CUDA_MMTC_DEC=$dec X4_GPU_BATCH_DUMP=/tmp/tcd-$m-$dec-batch.bin \
                                "$build/kernels/cuda/x4-gpu-check" batch "$mp" 2>&1 | tail -2
                done
                for c in $chunks batch; do
                        if cmp /tmp/tcd-$m-0-$c.bin /tmp/tcd-$m-1-$c.bin; then
                                echo "mmtcdec: $m, $c: identical ($(stat -c %s /tmp/tcd-$m-1-$c.bin) bytes)"
                        else
                                echo "mmtcdec: $m, $c: DIFFERENT"
                        fi
                done
                rm -f /tmp/tcd-$m-*.bin
        done
fi
if has mmtcdecbench; then
        # decode with the tensor-core products: k_mm_tc alone (X4_CUDA_MMTC_DEC=0) and with
        # k_mm_tcd (the default), then a batch-1 profile with k_mm_tcd
        for dec in 0 1; do
                say "decode bench, X4_CUDA_MM=tc, X4_CUDA_MMTC_DEC=$dec"
                X4_CUDA_MM=tc X4_CUDA_MMTC_DEC=$dec "$build/tools/x4-bench" --model "$model" --device cuda \
                        --prefill none --decode-ctx ${X4_CTX:-512,4096} --batch ${X4_BATCH:-1,16} --decode-tokens 32 \
                        --repeats 3 --json 2>&1 | tee "$out/decode-tc-dec$dec.jsonl" | grep '"decode"'
        done
        # warps a block share one staged input copy at batch 16 (default: 4, halved while the
        # matrix would have fewer blocks than SMs), forced for every dense product
        for w in 1 2 4; do
                say "decode bench batch 16, X4_CUDA_MM=tc, k_mm_tcd with X4_CUDA_MMTC_DEC_W=$w"
                X4_CUDA_MM=tc X4_CUDA_MMTC_DEC_W=$w "$build/tools/x4-bench" --model "$model" --device cuda \
                        --prefill none --decode-ctx 512 --batch 16 --decode-tokens 32 --repeats 3 --json 2>&1 |
                        tee "$out/decode-tc-dec-w$w.jsonl" | grep '"decode"'
        done
        say "profile batch 1 (eager), X4_CUDA_MM=tc with k_mm_tcd"
        X4_CUDA_MM=tc "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512 \
                --batch 1 --decode-tokens 16 --repeats 1 --profile 2>&1 | tee "$out/profile-tc-dec.txt" | tail -30
fi
if has b64; then
        say "decode bench batch 64"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512,4096 \
                --batch 64 --decode-tokens 16 --repeats 3 --json 2>&1 | tee "$out/bench-b64.jsonl" | grep '"decode"'
fi
if has bench; then
        say "decode bench (graphs)"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx ${X4_CTX:-512,4096} \
                --batch ${X4_BATCH:-1,16} --decode-tokens 32 --repeats 3 --json 2>&1 | tee "$out/bench.jsonl"
fi
if has cache16; then
        say "decode bench f16 cache"
        "$build/tools/x4-bench" --model "$model" --device cuda --cache f16 --prefill none \
                --decode-ctx ${X4_CTX:-512,4096} --batch ${X4_BATCH:-1,16} --decode-tokens 32 --repeats 3 --json \
                2>&1 | tee "$out/bench-f16.jsonl"
fi
if has profile; then
        say "profile batch 1 (eager)"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512 \
                --batch 1 --decode-tokens 16 --repeats 1 --profile 2>&1 | tee "$out/profile.txt"
fi
if has pdloff; then
        say "decode bench without programmatic dependent launch"
        X4_CUDA_PDL=0 "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                --decode-ctx ${X4_CTX:-512,4096} --batch ${X4_BATCH:-1,16} --decode-tokens 32 --repeats 3 \
                --json 2>&1 | tee "$out/bench-pdloff.jsonl" | grep '"decode"'
fi
# llama.cpp's xing4_0 port (the kit copied into .devcarry/llamacpp; built in the background since
# the start of the call) on the same file: the peer step, or peerend at the end of the call
run_peer() {
        say "waiting for the llama.cpp build"
        wait
        kit=$PWD/.devcarry/llamacpp/llamacpp-xing4-kit
        tail -3 "$out/llama-build.log"
        "$kit/run-bench.sh" "$model" "$kit/build-cuda" "$out/peer" 2>&1 | tail -12
        cp "$out/peer/bench.jsonl" "$out/peer-bench.jsonl" 2>/dev/null
}
if has peer; then
        run_peer
fi
if has mtp; then
        # issue 16: what verifying 1-3 drafts costs against a decode step at batch 1 and 16 on the
        # full synthetic model (its NextN block included), with the projected speed-up at
        # acceptance 0.6/0.75/0.9 (random weights: a measured acceptance means nothing there);
        # then acceptance and speed-up of real drafting on the demo model (greedy output must be
        # identical with MTP on and off: x4-bench fails otherwise)
        say "MTP verify cost, full model (x4-bench --mtp on --mtp-verify)"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx ${X4_CTX:-512,4096} \
                --batch ${X4_BATCH:-1,16} --decode-tokens 32 --repeats 3 --mtp on --mtp-draft 1 --mtp-verify \
                --json 2>&1 | tee "$out/mtp-verify.jsonl" | grep -E '"(decode|verify|generate)"|error|x4-bench:'
        say "MTP generate, demo model, drafts 1-3"
        mkdir -p /tmp/mtp-demo
        "$build/tools/x4-mkmodel" --preset demo --quiet --out /tmp/mtp-demo/demo.gguf 2>&1 | tail -2
        for d in 1 2 3; do
                "$build/tools/x4-bench" --model /tmp/mtp-demo/demo.gguf --device cuda --prefill none \
                        --decode-ctx none --decode-tokens 256 --repeats 3 --mtp on --mtp-draft $d --json 2>&1 |
                        tee -a "$out/mtp-demo.jsonl" | grep -E '"generate"|error|x4-bench:'
        done
fi
if has mtpdemo; then
        # issue 16: acceptance and speed-up of MTP on the shipped trained demo model (in the tree),
        # on chat questions rendered with its chat template as the daemon renders them, greedy up
        # to 128 tokens or the end of the turn, drafts 1-3; the same questions as the CPU rows of
        # bench/RESULTS.md. x4-bench exits 1 if any question's tokens differ with MTP on and off.
        say "MTP generate, trained demo model, chat questions, drafts 1-3"
        q=("What does tar do?" "What is the meaning of \"harbor\"?" "How do I list hidden files with ls?"
           "Compute 12 times 34." "What does the -r option of cp do?")
        qargs=()
        for t in "${q[@]}"; do qargs+=(--mtp-prompt "$t"); done
        : >"$out/mtp-demo-trained.jsonl"
        for d in 1 2 3; do
                "$build/tools/x4-bench" --model models/xing4-demo/model.gguf --device cuda --prefill none \
                        --decode-ctx none --decode-tokens 128 --repeats 3 --mtp on --mtp-draft $d "${qargs[@]}" \
                        --json 2>&1 | tee -a "$out/mtp-demo-trained.jsonl" |
                        grep -E '"generate_total"|error|x4-bench:'
        done
fi
if has classes; then
        # prompt tokens on the tensor-core products and attention (the default on sm_80+) against
        # the fp32 path (X4_CUDA_PROMPT=fp32) and fp32 attention for them (X4_CUDA_PROMPT_ATTN=fp32)
        for v in default fp32 attn-fp32; do
                say "prefill, prompts: $v"
                env $([ $v = fp32 ] && echo X4_CUDA_PROMPT=fp32) $([ $v = attn-fp32 ] && echo X4_CUDA_PROMPT_ATTN=fp32) \
                        "$build/tools/x4-bench" --model "$model" --device cuda --prefill ${X4_PREFILL:-512,4096} \
                        --decode-ctx none --repeats 3 --json 2>&1 | sed "s/}\$/,\"prompts\":\"$v\"}/" |
                        tee -a "$out/prefill-classes.jsonl" | grep '"prefill"'
        done
fi
if has pprofile; then
        # issue 12: where a prompt's time goes (prompt-class passes, per kernel class), and the 32K row
        say "profile prefill ${X4_PREFILL:-512,4096}"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill ${X4_PREFILL:-512,4096} --decode-ctx none \
                --repeats 1 --profile 2>&1 | tee "$out/profile-prefill.txt" | tail -60
        say "k_mm_tcp vs k_mm_tc on the full model (X4_CUDA_MM=tc, 600-token prompt, chunks of 100, decodes)"
        prompt=$(awk 'BEGIN { s = 5; for (i = 0; i < 600; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 100000 } }')
        for v in 0 1; do
                X4_CUDA_MM=tc X4_CUDA_MMTC_PROMPT=$v "$build/tools/x4-logits" --model "$model" --prompt "$prompt" --chunk 100 \
                        --decode 9,99 --device cuda --out /tmp/tcp-$v.bin 2>&1 | tail -1
        done
        cmp /tmp/tcp-0.bin /tmp/tcp-1.bin && echo "tcpsame: identical ($(stat -c %s /tmp/tcp-1.bin) bytes)"
        say "prompt attention two tokens a block vs one on the full model (--prompt-class, chunks of 100)"
        for v in 1 2; do
                X4_CUDA_ATTN_TOK=$v "$build/tools/x4-logits" --model "$model" --prompt "$prompt" --chunk 100 --prompt-class \
                        --decode 9,99 --device cuda --out /tmp/tok-$v.bin 2>&1 | tail -1
        done
        cmp /tmp/tok-1.bin /tmp/tok-2.bin && echo "toksame: identical ($(stat -c %s /tmp/tok-2.bin) bytes)"
        say "profile prefill with two tokens a block (X4_CUDA_ATTN_TOK=2)"
        X4_CUDA_ATTN_TOK=2 "$build/tools/x4-bench" --model "$model" --device cuda --prefill ${X4_PREFILL:-512,4096} \
                --decode-ctx none --repeats 1 --profile 2>&1 | sed 's/}$/,"attn_tok":2}/' | tee "$out/profile-prefill-tok2.txt" | grep -E '^prefill|attention '
        say "prefill 32,768"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill 32768 --decode-ctx none --repeats 1 \
                --json 2>&1 | tee "$out/prefill32k.jsonl" | grep '"prefill"'
fi
if has pquick; then
        # a short prefill row: the default kernels with a profile, then two tokens a block and one
        # router row a block beside them
        say "pquick: prefill ${X4_PREFILL:-512,4096}, profile"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill ${X4_PREFILL:-512,4096} --decode-ctx none \
                --repeats 1 --profile 2>&1 | tee "$out/profile-prefill.txt" | grep -E '^prefill|^  (experts|attention|router|hc)'
        say "pquick: X4_CUDA_ATTN_TOK=2 X4_CUDA_ROUTER_RB=1"
        X4_CUDA_ATTN_TOK=2 X4_CUDA_ROUTER_RB=1 "$build/tools/x4-bench" --model "$model" --device cuda \
                --prefill ${X4_PREFILL:-512,4096} --decode-ctx none --repeats 1 --json 2>&1 |
                sed 's/}$/,"attn_tok":2,"router_rb":1}/' | tee "$out/prefill-alt.jsonl" | grep '"prefill"'
fi
if has mile; then
        # a milestone row for issues 11 and 12 (run with peerend for llama.cpp on the same file in
        # the same call): prefill 512 / 4,096 and decode batch 1 at 512 / 4,096, medians of 3,
        # with a prefill profile; then prefill 32,768
        say "mile: prefill 512,4096 + decode batch 1 at 512,4096, three repeats"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512,4096 --decode-ctx 512,4096 --batch 1 \
                --decode-tokens 32 --repeats 3 --json 2>&1 | tee "$out/mile.jsonl" | grep -E '"(prefill|decode)"' | cut -c1-120
        say "mile: prefill profile"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512,4096 --decode-ctx none \
                --repeats 1 --profile 2>&1 | tee "$out/profile-prefill.txt" | grep -E '^prefill|^  [a-z]'
        say "mile: prefill 32,768"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill 32768 --decode-ctx none --repeats 1 \
                --json 2>&1 | tee "$out/prefill32k.jsonl" | grep '"prefill"' | cut -c1-120
        if [ -n "${X4_MILE_BATCH:-}" ]; then
                # the issues' batch rows: 16 and 64 at 512 / 4,096 (f32 cache), 1 at 32,768
                say "mile: decode batch 16, 64 at 512, 4,096; batch 1 at 32,768"
                "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512,4096 --batch 16,64 \
                        --decode-tokens 16 --repeats 3 --json 2>&1 | tee -a "$out/mile.jsonl" | grep '"decode"' | cut -c1-120
                "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 32768 --batch 1 \
                        --decode-tokens 16 --repeats 3 --json 2>&1 | tee -a "$out/mile.jsonl" | grep '"decode"' | cut -c1-120
        fi
fi
if has dtc; then
        # issue 11: the decode rows with the f16 cache's tensor-core decode attention (k_attn_dtc,
        # the default), with that cache's fp32 kernels (X4_CUDA_DECODE_ATTN=fp32: the path before
        # it), with the f32 cache (the exact path) and with forced part lengths; decode profiles at
        # batch 1 / 512 and / 32,768 and batch 64 / 4,096. Lines: $out/dtc-<mode>.jsonl
        # X4_DTC_MODES (default "tc fp32 f32 p128 p64"): tc the default, fp32 X4_CUDA_DECODE_ATTN=fp32,
        # f32 the f32 cache, pN parts of N forced (X4_CUDA_ATTN_DECODE_PART=N), pair1 X4_CUDA_DTC_PAIR=0 (one sub-part a round; the default takes two)
        # e:VAR=VAL+VAR=VAL any settings (the file dtc-e-<n>.jsonl, n the mode's place)
        n_mode=0
        for mode in ${X4_DTC_MODES:-tc fp32 f32 p128 p64}; do
                cache=f16 dattn=tc part= pair= extra=() tag=$mode
                n_mode=$((n_mode + 1))
                case $mode in f32) cache=f32 ;; fp32) dattn=fp32 ;; pair1) pair=0 ;; p*) part=${mode#p} ;;
                e:*) IFS=+ read -r -a extra <<<"${mode#e:}"; tag=e-$n_mode ;; esac
                export X4_CUDA_DTC_PAIR=$pair
                say "dtc: $mode: decode batch 1 / 16 / 64 at 512, 4,096; batch 1 at 32,768 (--cache $cache)"
                env ${extra[@]+"${extra[@]}"} X4_CUDA_ATTN_DECODE_PART=$part X4_CUDA_DECODE_ATTN=$dattn "$build/tools/x4-bench" --model "$model" --device cuda \
                        --cache $cache --prefill none --decode-ctx 512,4096 --batch 1,16,64 --decode-tokens 16 --repeats 3 --json 2>&1 |
                        tee -a "$out/dtc-$tag.jsonl" | grep '"decode"' | cut -c1-150
                env ${extra[@]+"${extra[@]}"} X4_CUDA_ATTN_DECODE_PART=$part X4_CUDA_DECODE_ATTN=$dattn "$build/tools/x4-bench" --model "$model" --device cuda \
                        --cache $cache --prefill none --decode-ctx 32768 --batch 1 --decode-tokens 16 --repeats 3 --json 2>&1 |
                        tee -a "$out/dtc-$tag.jsonl" | grep '"decode"' | cut -c1-150
        done
        unset X4_CUDA_DTC_PAIR
        say "dtc: decode profiles (f16 cache, tensor-core decode attention${X4_DTC_PROFILE_ENV:+, $X4_DTC_PROFILE_ENV})"
        # X4_DTC_PROFILE_ENV="VAR=VAL ...": the profiles with those settings
        # shellcheck disable=SC2086
        [ -n "${X4_DTC_PROFILE_ENV:-}" ] && export $X4_DTC_PROFILE_ENV
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512,32768 --batch 1 \
                --decode-tokens 8 --repeats 1 --profile 2>&1 | tee "$out/dtc-profile-b1.txt" | grep -E '^decode|^  [a-z]'
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 4096 --batch 64 \
                --decode-tokens 8 --repeats 1 --profile 2>&1 | tee "$out/dtc-profile-b64.txt" | grep -E '^decode|^  [a-z]'
fi
if has pre; then
        # prefill 512 / 4,096 with settings: X4_PRE_MODES="default e:VAR=VAL+VAR=VAL ..." (the file
        # pre-<n>.jsonl, n the mode's place), e.g. "default e:X4_CUDA_MMTCP_DEC1=1"
        n_mode=0
        for mode in ${X4_PRE_MODES:-default}; do
                n_mode=$((n_mode + 1))
                extra=()
                case $mode in e:*) IFS=+ read -r -a extra <<<"${mode#e:}" ;; esac
                say "pre: $mode: prefill 512, 4,096"
                env ${extra[@]+"${extra[@]}"} "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512,4096 \
                        --decode-ctx none --repeats 3 --json 2>&1 | tee -a "$out/pre-$n_mode.jsonl" | grep '"prefill"' | cut -c1-120
        done
fi
if has hcw; then
        # the mHC pre-mapping's first part a warp a token (X4_CUDA_HC=wtok, k_hc_wtok) against the
        # default tiled kernel: ncu time and DRAM bytes of a 4,096-token prefill's mHC launches
        # (both parts), then the prefill profile's classes with each
        for hc in default wtok; do
                say "hcw: mHC $hc: ncu of a 4,096-token prefill's mHC launches"
                env X4_CUDA_HC=$([ $hc = wtok ] && echo wtok) ncu --clock-control none --kernel-name regex:'k_hc_' \
                        --launch-skip 20 --launch-count 8 --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__registers_per_thread \
                        --csv "$build/tools/x4-bench" --model "$model" --device cuda --prefill 4096 --decode-ctx none \
                        --repeats 1 --warmup 0 2>/dev/null | grep '^"' >"$out/ncu-hcw-$hc.csv"
                python3 scripts/device/ncu-table.py "$out/ncu-hcw-$hc.csv"
                say "hcw: mHC $hc: prefill 4,096 profile"
                env X4_CUDA_HC=$([ $hc = wtok ] && echo wtok) "$build/tools/x4-bench" --model "$model" --device cuda \
                        --prefill 4096 --decode-ctx none --repeats 1 --profile 2>&1 | tee "$out/hcw-profile-$hc.txt" | tail -14
        done
fi
if has b1env; then
        # decode batch 1 at ctx 512 (three repeats) under settings: X4_B1_MODES="default e:VAR=VAL+VAR=VAL ..."
        # (quick sweeps of a knob; lines tagged with the mode into $out/b1env.jsonl)
        for mode in ${X4_B1_MODES:-default}; do
                extra=()
                case $mode in e:*) IFS=+ read -r -a extra <<<"${mode#e:}" ;; esac
                printf '%-40s ' "$mode"
                env ${extra[@]+"${extra[@]}"} "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                        --decode-ctx ${X4_B1_CTX:-512} --batch ${X4_B1_BATCH:-1} --decode-tokens 16 --repeats 3 --json 2>&1 |
                        sed "s|}\$|,\"mode\":\"$mode\"}|" | tee -a "$out/b1env.jsonl" |
                        grep -o '"ctx":[0-9]*,"batch":[0-9]*,"tok_s":[0-9.]*' | tr '\n' ' '
                echo
        done
fi
if has modab; then
        # the tree's CUDA module against another (X4_MODAB_OTHER, a carried xing4d-cuda.so or .so.xz:
        # the last commit's, built with prebuilt.sh's options) on the same x4-bench lines, the two
        # alternating, X4_MODAB_ROUNDS times (2): X4_MODAB="ARGS;ARGS;..." (default batch 64 and 16
        # at 512 / 4,096, batch 1 at 512, prefill 512 / 4,096); lines tagged with "module" (tree or
        # other) and "round" into $out/modab.jsonl
        other=${X4_MODAB_OTHER:-.devcarry/head/xing4d-cuda.so.xz}
        if [ ! -f "$other" ]; then
                echo "modab: the module to compare against, $other, is not here: carry it (X4_MODAB_OTHER," \
                        "default .devcarry/head/xing4d-cuda.so.xz, built from the last commit)" >&2
                exit 1
        fi
        case $other in
        *.xz)
                xz -dc "$other" >/tmp/modab-other.so || { echo "modab: $other does not unpack (xz)" >&2; exit 1; }
                other=/tmp/modab-other.so
                ;;
        esac
        IFS=';' read -r -a ablines <<<"${X4_MODAB:---prefill none --decode-ctx 512,4096 --batch 64,16;--prefill none --decode-ctx 512 --batch 1;--prefill 512,4096 --decode-ctx none}"
        for r in $(seq 1 "${X4_MODAB_ROUNDS:-2}"); do
                for args in "${ablines[@]}"; do
                        for m in tree other; do
                                mod=$X4_CUDA_MODULE
                                [ $m = other ] && mod=$other
                                printf '%-6s %-56s ' "$m" "$args"
                                # shellcheck disable=SC2086
                                X4_CUDA_MODULE=$mod "$build/tools/x4-bench" --model "$model" --device cuda $args \
                                        --decode-tokens 16 --repeats 3 --json 2>&1 | grep '^{' |
                                        sed "s|}\$|,\"module\":\"$m\",\"round\":$r}|" | tee -a "$out/modab.jsonl" |
                                        grep -o '"\(ctx\|tokens\)":[0-9]*,\("batch":[0-9]*,\)\?"tok_s":[0-9.]*' | tr '\n' ' '
                                echo
                        done
                done
        done
fi
if has ncul; then
        # ncu's sections for one MoE layer's decode kernels at batch 1 / 512 (X4_NCUL_SKIP, 16
        # launches) and for the head's k_mv_small: why each takes its time
        say "ncu: sections of one layer's decode kernels at batch 1, ctx 512"
        X4_CUDA_GRAPHS=0 ncu --clock-control none --launch-skip ${X4_NCUL_SKIP:-1400} --launch-count 16 \
                --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
                --section MemoryWorkloadAnalysis --section SchedulerStats "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                --decode-ctx 512 --batch 1 --decode-tokens 4 --repeats 1 --warmup 0 2>&1 | grep -v "^{" >"$out/ncu-layer.txt"
        X4_CUDA_GRAPHS=0 ncu --clock-control none --kernel-name regex:k_mv_small --launch-skip 2 --launch-count 1 \
                --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
                --section MemoryWorkloadAnalysis --section SchedulerStats "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                --decode-ctx 512 --batch 1 --decode-tokens 4 --repeats 1 --warmup 0 2>&1 | grep -v "^{" >"$out/ncu-head.txt"
        grep -E "^  [a-z_ ]*k_|Duration|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|No Eligible|Waves Per SM" \
                "$out/ncu-layer.txt" "$out/ncu-head.txt" | cut -c1-150 | head -150
fi
if has ncusrc; then
        # ncu's full sections and source counters (the stall reasons by SASS instruction) for the
        # eager batch-1 launches of the kernels X4_NCUSRC_K (names or regexes; default the
        # tensor-core products and the mHC pre-mapping) at ctx 512: X4_NCUSRC_N launches of each
        # after X4_NCUSRC_SKIP (one layer's k_mm_tcs launches are its projections and experts)
        for k in ${X4_NCUSRC_K:-k_mm_tcs k_hc_fused}; do
                say "ncu source: $k"
                # X4_NCUSRC_SI: ncu's --warp-sampling-interval (0 samples every 32 cycles: enough
                # samples for a short kernel; the csv is then cut to the instructions sampled)
                X4_CUDA_GRAPHS=0 ncu --clock-control none --kernel-name regex:"$k" --launch-skip ${X4_NCUSRC_SKIP:-70} \
                        --launch-count ${X4_NCUSRC_N:-8} --set full --import-source yes --section SourceCounters \
                        ${X4_NCUSRC_SI:+--warp-sampling-interval "$X4_NCUSRC_SI"} \
                        -o "$out/ncusrc-$k" "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                        --decode-ctx 512 --batch 1 --decode-tokens 4 --repeats 1 --warmup 0 >"$out/ncusrc-$k.log" 2>&1
                [ -f "$out/ncusrc-$k.ncu-rep" ] || { tail -5 "$out/ncusrc-$k.log"; continue; }
                ncu --import "$out/ncusrc-$k.ncu-rep" --page source --csv --print-source sass \
                        >"/tmp/ncusrc-$k-src.csv" 2>&1
                python3 scripts/device/ncu-src-filter.py "/tmp/ncusrc-$k-src.csv" >"$out/ncusrc-$k-src.csv"
                ncu --import "$out/ncusrc-$k.ncu-rep" --page details >"$out/ncusrc-$k.txt" 2>&1
                grep -E "^  [a-z_ ]*k_|Duration|DRAM Throughput|Achieved Occupancy|No Eligible|Waves Per SM|Registers Per" \
                        "$out/ncusrc-$k.txt" | cut -c1-150 | head -80
        done
fi
if has ncudtc; then
        # ncu of the f16 cache's decode attention (k_attn_dtc) and its combine (eager launches),
        # full sections, at X4_NCUDTC="CTX/BATCH ..." (default 512/1 32768/1); X4_NCUDTC_SRC=1 adds
        # the source counters (the stall reasons by instruction: ncu-dtc-CTX-BATCH-src.txt)
        for cb in ${X4_NCUDTC:-512/1 32768/1}; do
                set -- ${cb/\// }
                say "ncu: k_attn_dtc, k_attn_combine at ctx $1, batch $2"
                X4_CUDA_GRAPHS=0 ncu --clock-control none --kernel-name regex:'k_attn_(dtc|combine)' --launch-skip 80 \
                        --launch-count 2 --set full ${X4_NCUDTC_SRC:+--import-source yes --section SourceCounters -o "$out/ncu-dtc-$1-$2"} \
                        "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                        --decode-ctx $1 --batch $2 --decode-tokens 4 --repeats 1 --warmup 0 2>&1 | grep -v "^{" \
                        >"$out/ncu-dtc-$1-$2.txt"
                if [ -n "${X4_NCUDTC_SRC:-}" ] && [ -f "$out/ncu-dtc-$1-$2.ncu-rep" ]; then
                        ncu --import "$out/ncu-dtc-$1-$2.ncu-rep" --page source --csv --print-source sass \
                                >"$out/ncu-dtc-$1-$2-src.txt" 2>&1
                        ncu --import "$out/ncu-dtc-$1-$2.ncu-rep" --page details >"$out/ncu-dtc-$1-$2.txt" 2>&1
                fi
                grep -E 'k_attn|Duration|Throughput|Registers|Achieved Occupancy|Stall|Warp Cycles|Issued|Shared Memory Configuration|Dynamic Shared' \
                        "$out/ncu-dtc-$1-$2.txt" | head -60
        done
fi
if has passes; then
        # issue 12: X4_CUDA_PASS_TOKENS (a measurement knob; passes of 512 by default). First the
        # same bits for any pass length: the demo model (3 slots a token, so passes of 2,048 run
        # the MoE grouping's unstaged instance past 4,608 pairs), a 1,500-token prompt labeled +
        # 2 decodes, passes of 64 / 1,024 / 2,048 against 512, with mha.cu and with k_attn_tc2;
        # then the full model's prefill 4,096 with passes of 512 ... 4,096, the profile at the
        # longest, and 32,768 with passes of 512 and 4,096
        say "passes"
        mkdir -p /tmp/ps/demo
        [ -f /tmp/ps/demo/demo.gguf ] || "$build/tools/x4-mkmodel" --preset demo --quiet --out /tmp/ps/demo/demo.gguf
        prompt=$(awk 'BEGIN { s = 23; for (i = 0; i < 1500; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
        for ap in mha tc2; do
                for pt in 512 64 1024 2048; do
                        X4_CUDA_ATTN_PROMPT=$ap X4_CUDA_PASS_TOKENS=$pt "$build/tools/x4-logits" --model /tmp/ps/demo/demo.gguf \
                                --prompt-class --prompt "$prompt" --decode 9,99 --device cuda --out /tmp/ps/$ap-$pt.bin 2>&1 | tail -1
                        [ $pt != 512 ] && cmp /tmp/ps/$ap-512.bin /tmp/ps/$ap-$pt.bin && echo "passes: $ap, passes of $pt = passes of 512"
                done
        done
        if [ -f "$model" ]; then
                for pt in 512 1024 2048 4096; do
                        r=$(X4_CUDA_PASS_TOKENS=$pt "$build/tools/x4-bench" --model "$model" --device cuda --prefill 4096 --decode-ctx none \
                                --repeats 3 --json 2>&1 | tee -a "$out/passes-$pt.jsonl" | grep -o '"tokens":[0-9]*,"tok_s":[0-9.]*')
                        echo "passes of $pt: $r"
                done
                X4_CUDA_PASS_TOKENS=4096 "$build/tools/x4-bench" --model "$model" --device cuda --prefill 4096 --decode-ctx none \
                        --repeats 1 --profile 2>&1 | tee "$out/profile-passes4096.txt" | grep -E '^prefill|^  [a-z]'
                for pt in 512 4096; do
                        # the daemon's cache (f16) with mha.cu
                        r=$(X4_CUDA_PASS_TOKENS=$pt "$build/tools/x4-bench" --model "$model" --device cuda --cache f16 --prefill 512,4096 \
                                --decode-ctx none --repeats 3 --json 2>&1 | tee -a "$out/passes-$pt.jsonl" | grep -o '"tokens":[0-9]*,"tok_s":[0-9.]*')
                        echo "passes of $pt, f16 cache: $r"
                done
                for pt in 512 4096; do
                        r=$(X4_CUDA_PASS_TOKENS=$pt "$build/tools/x4-bench" --model "$model" --device cuda --prefill 32768 --decode-ctx none \
                                --repeats 1 --warmup 0 --json 2>&1 | tee -a "$out/passes-$pt.jsonl" | grep -o '"tokens":[0-9]*,"tok_s":[0-9.]*')
                        echo "passes of $pt: $r"
                done
        fi
fi
if has pparts; then
        # issue 12: the prompt kernel's part length (X4_CUDA_ATTN_PROMPT_PART; default
        # CU_ATTN_PART_TC2), with the default profile first, then 128 (the decode kernels' length,
        # the prompt kernel's before), 256, 512, two tokens a block, the f16 cache, and 32K
        say "pparts: prefill ${X4_PREFILL:-512,4096}, profile (default part length)"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill ${X4_PREFILL:-512,4096} --decode-ctx none \
                --repeats 1 --profile 2>&1 | tee "$out/profile-prefill.txt" | grep -E '^prefill|^  (experts|attention|router|hc)'
        for pl in 128 256 512; do
                say "pparts: X4_CUDA_ATTN_PROMPT_PART=$pl"
                X4_CUDA_ATTN_PROMPT_PART=$pl "$build/tools/x4-bench" --model "$model" --device cuda \
                        --prefill ${X4_PREFILL:-512,4096} --decode-ctx none --repeats 3 --json 2>&1 |
                        sed "s/}\$/,\"attn_prompt_part\":$pl}/" | tee -a "$out/prefill-parts.jsonl" | grep '"prefill"'
        done
        say "pparts: default, three repeats"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill ${X4_PREFILL:-512,4096} --decode-ctx none \
                --repeats 3 --json 2>&1 | tee -a "$out/prefill-parts.jsonl" | grep '"prefill"'
        say "pparts: X4_CUDA_ATTN_TOK=2"
        X4_CUDA_ATTN_TOK=2 "$build/tools/x4-bench" --model "$model" --device cuda --prefill ${X4_PREFILL:-512,4096} \
                --decode-ctx none --repeats 3 --json 2>&1 | sed 's/}$/,"attn_tok":2}/' | tee -a "$out/prefill-parts.jsonl" | grep '"prefill"'
        say "pparts: f16 cache"
        "$build/tools/x4-bench" --model "$model" --device cuda --cache f16 --prefill ${X4_PREFILL:-512,4096} \
                --decode-ctx none --repeats 3 --json 2>&1 | tee -a "$out/prefill-parts.jsonl" | grep '"prefill"'
        say "pparts: prefill 32,768 (f32, then f16 cache)"
        for ct in f32 f16; do
                "$build/tools/x4-bench" --model "$model" --device cuda --cache $ct --prefill 32768 --decode-ctx none \
                        --repeats 1 --json 2>&1 | tee -a "$out/prefill32k.jsonl" | grep '"prefill"'
        done
fi
if has pf16; then
        say "prefill, prompts, f16 latent cache"
        "$build/tools/x4-bench" --model "$model" --device cuda --cache f16 --prefill ${X4_PREFILL:-512,4096} \
                --decode-ctx none --repeats 3 --json 2>&1 | tee "$out/prefill-f16.jsonl" | grep '"prefill"'
fi
if has b32ktc2; then
        say "decode bench 32K batch 1, X4_CUDA_ATTN=tc2"
        X4_CUDA_ATTN=tc2 "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 32768 \
                --batch 1 --decode-tokens 32 --repeats 3 --json 2>&1 | tee "$out/bench32k-tc2.jsonl" | grep '"decode"'
fi
if has b32k; then
        say "decode bench 32K batch 1"
        "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 32768 \
                --batch 1 --decode-tokens 32 --repeats 3 --json 2>&1 | tee "$out/bench32k.jsonl" | grep '"decode"'
fi
if has nograph; then
        say "decode bench without graphs"
        X4_CUDA_GRAPHS=0 "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                --decode-ctx 512 --batch 1 --decode-tokens 32 --repeats 3 2>&1 | tail -5
fi
if has ncu; then
        say "ncu: one eager decode step's kernels at batch 1, ctx 512"
        X4_CUDA_GRAPHS=0 ncu --clock-control none --launch-skip ${X4_NCU_SKIP:-1400} --launch-count ${X4_NCU_COUNT:-40} \
                --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active \
                --csv "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512 \
                --batch 1 --decode-tokens 4 --repeats 1 --warmup 0 >"$out/ncu.csv" 2>"$out/ncu.err"
        python3 - "$out/ncu.csv" <<'PY'
import csv, sys, collections
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))  # x4-bench's own lines are mixed in
hdr = rows[0]; rows = rows[1:]
ki, ni, mi, vi = hdr.index("ID"), hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value")
per = collections.OrderedDict()
for r in rows:
    per.setdefault((r[ki], r[ni][:60]), {})[r[mi]] = r[vi]
for (k, n), m in per.items():
    t = float(m.get('gpu__time_duration.sum', '0').replace(',', '')); b = float(m.get('dram__bytes_read.sum', '0').replace(',', ''))
    print(f"{k:>5} {n:60} t={t / 1000:7.2f}us MB={b / 1e6:7.2f} GB/s={b / t if t else 0:6.0f} grid={m.get('launch__grid_size','?'):>6} blk={m.get('launch__block_size','?'):>5} regs={m.get('launch__registers_per_thread','?'):>4} act%={m.get('sm__warps_active.avg.pct_of_peak_sustained_active','?')}")
PY
fi
# ab_env NAME VAR A B SEED N SHAPE...: an opt-in kernel (VAR=B) against the default (VAR=A): the
# demo model's logits bits for an N-token prompt (LCG SEED) in each x4-logits SHAPE (cmp), then
# the full model's prefill 512 / 4,096 (3 repeats, JSON lines to $out/NAME.jsonl tagged with VAR)
# and the kernel classes of a 4,096-token prefill profile matching AB_CLASS (default: router), with either
ab_env() {
        local name=$1 var=$2 a=$3 b=$4 seed=$5 n=$6 shape v i=0 prompt r
        shift 6
        mkdir -p "/tmp/$name"
        [ -f "/tmp/$name/demo.gguf" ] || "$build/tools/x4-mkmodel" --preset demo --quiet --out "/tmp/$name/demo.gguf"
        prompt=$(awk -v s="$seed" -v n="$n" 'BEGIN { for (i = 0; i < n; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }')
        for shape in "$@"; do
                for v in "$a" "$b"; do
                        # shellcheck disable=SC2086
                        env "$var=$v" "$build/tools/x4-logits" --model "/tmp/$name/demo.gguf" --prompt "$prompt" $shape \
                                --device cuda --out "/tmp/$name/$i-$v.bin" 2>&1 | tail -1
                done
                if cmp "/tmp/$name/$i-$a.bin" "/tmp/$name/$i-$b.bin"; then echo "$name: identical logits ($shape)"
                else echo "$name: FAIL: different logits ($shape)"; fi
                i=$((i + 1))
        done
        [ -f "$model" ] || return 0
        for v in "$a" "$b"; do
                r=$(env "$var=$v" "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512,4096 --decode-ctx none \
                        --repeats 3 --json 2>&1 | sed "s/}\$/,\"$var\":\"$v\"}/" | tee -a "$out/$name.jsonl" |
                        grep -o '"tokens":[0-9]*,"tok_s":[0-9.]*' | tr '\n' ' ')
                echo "$name $var=$v: $r"
                env "$var=$v" "$build/tools/x4-bench" --model "$model" --device cuda --prefill 4096 --decode-ctx none \
                        --repeats 1 --profile 2>&1 | grep -E "^  (${AB_CLASS:-router})"
        done
}
if has ncupre; then
        # issue 12: every kernel of a few layers of a 4,096-token prefill (one pass), with time and
        # DRAM bytes, the table behind the next prefill kernels (X4_NCU_PRE_SKIP launches skipped:
        # 900 passes x4-bench's warm-up forward; 300 landed in it)
        say "ncu: the kernels of a few layers of a 4,096-token prefill"
        ncu --clock-control none --launch-skip ${X4_NCU_PRE_SKIP:-900} --launch-count ${X4_NCU_PRE_COUNT:-45} \
                --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed \
                --csv "$build/tools/x4-bench" --model "$model" --device cuda --prefill 4096 --decode-ctx none \
                --repeats 1 --warmup 0 >"$out/ncu-pre.csv" 2>"$out/ncu-pre.err"
        python3 scripts/device/ncu-table.py "$out/ncu-pre.csv"
fi
if has ncub; then
        # every kernel of a few layers of a decode step at batch X4_NCUB_BATCH (16), ctx 512, eager:
        # time and DRAM bytes, then the sum by kernel name (X4_NCU_CACHE=none: the L2 kept between
        # kernels, as X4_CUDA_L2PF needs; ncu flushes it by default)
        say "ncu: decode batch ${X4_NCUB_BATCH:-16}, ctx ${X4_NCUB_CTX:-512}"
        X4_CUDA_GRAPHS=0 ncu --clock-control none --cache-control ${X4_NCU_CACHE:-all} --launch-skip ${X4_NCUB_SKIP:-3000} --launch-count ${X4_NCUB_COUNT:-120} \
                --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,sm__throughput.avg.pct_of_peak_sustained_elapsed \
                --csv "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx ${X4_NCUB_CTX:-512} \
                --batch ${X4_NCUB_BATCH:-16} --decode-tokens 8 --repeats 1 --warmup 0 >"$out/ncub.csv" 2>"$out/ncub.err"
        python3 scripts/device/ncu-table.py "$out/ncub.csv" >"$out/ncub.txt"
        python3 scripts/device/ncu-table.py "$out/ncub.csv" --sum | head -25
fi
if has nsys; then
        # issue 11: a replayed decode step's timeline, each graph node a row (nsys --cuda-graph-trace
        # node): the time between kernels against the time they run, by kernel name
        # (scripts/device/nsys-gaps.py), at X4_NSYS="CTX/BATCH ..." (default 512/1 4096/16); env
        # settings pass through (e.g. X4_CUDA_L2PF=1)
        if command -v nsys >/dev/null 2>&1; then
                for cb in ${X4_NSYS:-512/1 4096/16}; do
                        set -- ${cb/\// }
                        say "nsys: decode ctx $1, batch $2, graphs replayed"
                        nsys profile --cuda-graph-trace=node -t cuda --sample=none --cpuctxsw=none -f true \
                                -o "$out/nsys-$1-$2" "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                                --decode-ctx $1 --batch $2 --decode-tokens 16 --repeats 1 >"$out/nsys-$1-$2.log" 2>&1
                        nsys stats -r cuda_gpu_trace -f csv -o "$out/nsys-$1-$2" "$out/nsys-$1-$2.nsys-rep" \
                                >>"$out/nsys-$1-$2.log" 2>&1
                        python3 scripts/device/nsys-gaps.py "$out/nsys-$1-$2_cuda_gpu_trace.csv" 2>&1 |
                                tee "$out/nsys-$1-$2.txt" | head -30
                        rm -f "$out/nsys-$1-$2.nsys-rep" "$out/nsys-$1-$2.sqlite"
                done
        else
                say "nsys: not on this machine"
        fi
fi
if has dprof; then
        # issues 11/12: where a decode step's time goes at batch 1 / 32,768 and batch 64 / 4,096
        # X4_DPROF="CTX/BATCH ..." (default: 32768/1 4096/64 512/64)
        for cb in ${X4_DPROF:-32768/1 4096/64 512/64}; do
                set -- ${cb/\// }
                say "decode profile: ctx $1, batch $2"
                "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx $1 --batch $2 \
                        --decode-tokens 8 --repeats 1 --profile 2>&1 | tee "$out/dprof-$1-$2.txt" | grep -E '^decode|^  [a-z]'
        done
fi
if has ncufull; then
        # the same launches as `ncu` with the sections that say why each kernel takes its time
        # (stall reasons, occupancy, memory throughput), as text
        say "ncu: full sections, one decode step's kernels at batch 1, ctx 512"
        X4_CUDA_GRAPHS=0 ncu --clock-control none --launch-skip ${X4_NCU_SKIP:-1400} --launch-count ${X4_NCUF_COUNT:-20} \
                --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy \
                --section MemoryWorkloadAnalysis "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                --decode-ctx 512 --batch 1 --decode-tokens 4 --repeats 1 --warmup 0 2>&1 | grep -v "^{" >"$out/ncu-full.txt"
        grep -E "^  k_|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Grid Size" \
                "$out/ncu-full.txt" | head -200
fi
if has hcprobe; then
        # where the fused mHC kernel's time goes at batch 1: its ncu duration with parts left out
        # (X4_HC_PROBE bits: 1 no Sinkhorn, 2 no tail, 4 no collapse/norm, 8 no post-mapping)
        for p in 0 1 2 4 8; do
                X4_HC_PROBE=$p X4_CUDA_GRAPHS=0 ncu --clock-control none --kernel-name regex:k_hc_fused --launch-skip 200 \
                        --launch-count 4 --metrics gpu__time_duration.sum --csv "$build/tools/x4-bench" --model "$model" \
                        --device cuda --prefill none --decode-ctx 512 --batch 1 --decode-tokens 2 --repeats 1 --warmup 0 \
                        2>/dev/null | grep '^"' | awk -F'","' -v p=$p 'NR > 1 { gsub(/[",]/, "", $NF); s += $NF; n++ }
                        END { printf "hcprobe %d: mean %.2f us over %d launches\n", p, s / n / 1000, n }'
        done
fi
if has rw; then
        # rows a warp in the one-input decode products (X4_CUDA_RW; same bits)
        for rw in 1 2 4; do
                say "decode batch 1, X4_CUDA_RW=$rw"
                X4_CUDA_RW=$rw "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512 \
                        --batch 1 --decode-tokens 32 --repeats 3 --json 2>&1 | sed "s/}\$/,\"rw\":$rw}/" |
                        tee -a "$out/bench-rw.jsonl" | grep '"decode"'
        done
fi
if has attntc; then
        say "decode batch 1 and 16, tensor-core attention (X4_CUDA_ATTN=${X4_ATTN_TC:-tc}), f32 and f16 caches"
        for cache in f32 f16; do
                X4_CUDA_ATTN=${X4_ATTN_TC:-tc} "$build/tools/x4-bench" --model "$model" --device cuda --cache $cache --prefill none \
                        --decode-ctx 512,4096 --batch 1,16 --decode-tokens 32 --repeats 3 --json 2>&1 |
                        tee -a "$out/bench-attntc.jsonl" | grep '"decode"'
        done
fi
# a fixed 300-token prompt (three parts of the cache) for the full-model logits checks
prompt300() { awk 'BEGIN { s = 5; for (i = 0; i < 300; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 4000 } }'; }
if has split; then
        # the split attention path's launch shapes (X4_CUDA_SPLIT="AS_HG,AC_HG,AC_KS"): the same
        # logits on the full model (32 heads: several head groups, unlike the test models), then speed
        prompt=$(prompt300)
        for shape in 16,32,64 8,32,64 16,16,64 8,16,64 16,32,32 8,16,32 16,16,32; do
                X4_CUDA_ATTN=split X4_CUDA_SPLIT=$shape "$build/tools/x4-logits" --model "$model" --prompt "$prompt" \
                        --decode 9,99,999 --device cuda --out /tmp/split-$shape.bin 2>/tmp/split-$shape.err ||
                        { echo "FAIL x4-logits split $shape"; cat /tmp/split-$shape.err; }
                cmp /tmp/split-16,32,64.bin /tmp/split-$shape.bin && echo "split $shape: same logits as 16,32,64 ($(stat -c %s /tmp/split-$shape.bin) bytes)" ||
                        echo "FAIL split $shape differs"
                grep X4_CUDA /tmp/split-$shape.err
        done
        rm -f /tmp/split-*.bin
        for shape in ${X4_SPLIT_SHAPES:-16,32,64 8,32,64 8,16,64 8,16,32 16,16,32}; do
                say "decode batch 1, X4_CUDA_SPLIT=$shape"
                X4_CUDA_SPLIT=$shape "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                        --decode-ctx ${X4_CTX:-512,4096} --batch 1 --decode-tokens 32 --repeats 3 --json 2>&1 |
                        sed "s/}\$/,\"split\":\"$shape\"}/" | tee -a "$out/bench-shapes.jsonl" | grep -E '"decode"|X4_CUDA'
        done
fi
if has splitauto; then
        # the launch shapes chosen a launch give the logits a forced shape gives (full model)
        prompt=$(prompt300)
        for shape in auto 16,32,64 8,16,64; do
                if [ $shape = auto ]; then
                        "$build/tools/x4-logits" --model "$model" --prompt "$prompt" --decode 9,99,999,9999 \
                                --device cuda --out /tmp/sa-auto.bin || echo "FAIL x4-logits auto"
                        continue
                fi
                X4_CUDA_SPLIT=$shape "$build/tools/x4-logits" --model "$model" --prompt "$prompt" \
                        --decode 9,99,999,9999 --device cuda --out /tmp/sa-$shape.bin || echo "FAIL x4-logits $shape"
                cmp /tmp/sa-auto.bin /tmp/sa-$shape.bin && echo "splitauto: shape chosen a launch = $shape, bit for bit" ||
                        echo "FAIL splitauto: $shape differs"
        done
        rm -f /tmp/sa-*.bin
fi
if has minb; then
        # X4_CUDA_MINB=4: the expert products compiled for 4 blocks an SM (same bits)
        for mb in 1 4; do
                say "decode, X4_CUDA_MINB=$mb"
                X4_CUDA_MINB=$mb "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                        --decode-ctx ${X4_CTX:-512,4096} --batch ${X4_BATCH:-1,16} --decode-tokens 32 --repeats 3 --json 2>&1 |
                        sed "s/}\$/,\"minb\":$mb}/" | tee -a "$out/bench-minb.jsonl" | grep '"decode"'
        done
fi
if has cachef16; then
        # the f16 latent cache against f32 (issue 11: the CUDA default if it is faster)
        for cache in f32 f16; do
                say "decode, --cache $cache"
                "$build/tools/x4-bench" --model "$model" --device cuda --cache $cache --prefill none \
                        --decode-ctx ${X4_CTX:-512,4096} --batch ${X4_BATCH:-1,16} --decode-tokens 32 --repeats 3 --json 2>&1 |
                        tee -a "$out/bench-cache.jsonl" | grep '"decode"'
        done
fi
if has fullx; then
        # X4_CUDA_FULLX=1 (one-input decode products stage their whole input at once): the GPU
        # tests with it on (their bit-for-bit checks then cross it with the batched kernels), then
        # decode with it off and on
        say "tests/gpu/run.sh with X4_CUDA_FULLX=1"
        mkdir -p "$out/fullx"
        OUT=$out/fullx X4_CUDA_FULLX=1 X4_GPU_BUILD=$build bash tests/gpu/run.sh >"$out/gpu-tests-fullx.txt" 2>&1
        grep -E "^(PASS|FAIL|SKIP)" "$out/gpu-tests-fullx.txt" | awk '{ print $1 }' | sort | uniq -c
        grep -E "^FAIL" "$out/gpu-tests-fullx.txt"
        for fx in 0 1; do
                say "decode, X4_CUDA_FULLX=$fx"
                X4_CUDA_FULLX=$fx "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                        --decode-ctx ${X4_CTX:-512,4096} --batch ${X4_BATCH:-1,16} --decode-tokens 32 --repeats 3 --json 2>&1 |
                        sed "s/}\$/,\"fullx\":$fx}/" | tee -a "$out/bench-fullx.jsonl" | grep '"decode"'
        done
fi
if has daemon; then
        # issues 11/12's daemon rows: the daemon built with RPC from the Debian packages in
        # .devcarry/rpc-debs (carry it; scripts/device/fetch-rpc-debs.sh), test_mtp.py on cuda when
        # systemd-socket-activate runs here, then one stream on the full model: a 4,096-token
        # prompt and 256 decode tokens three times, `x4ctl stats --json` after each (its rates are
        # moving averages over steps: the third run's are the steady ones), beside x4-bench's
        # prefill 4,096 and decode at 4,096
        say "daemon build (RPC on)"
        . scripts/device/rpc-env.sh
        rb=$PWD/build-gpu-rpc
        if x4_rpc_env && { [ -f "$rb/build.ninja" ] || meson setup "$rb" -Drpc=enabled -Dgpu_archs=90 -Dcuda=enabled \
                --buildtype=release >"$out/setup-rpc.log" 2>&1; } && ninja -C "$rb" >"$out/build-rpc.log" 2>&1; then
                if systemd-socket-activate --version >/dev/null 2>&1; then
                        say "test_mtp.py with the daemon on cuda"
                        X4_TEST_DEVICE=cuda X4_BUILD_DIR=$rb X4_SOURCE_DIR=$PWD X4_FIXTURES=$PWD/tests/fixtures \
                                X4_CLIENT_TEST=$rb/tests/integration/x4-client-test \
                                python3 -m pytest tests/integration/test_mtp.py -q -rfE -p no:cacheprovider 2>&1 | tee "$out/test-mtp-cuda.log" | tail -40
                else
                        echo "daemon: systemd-socket-activate does not run here: $(systemd-socket-activate --version 2>&1 | head -1)"
                fi
                if [ -f "$model" ]; then
                        say "daemon on cuda, full model: 4,096-token prompt + 256 tokens, three times"
                        sock=/tmp/x4d.sock
                        rm -rf "$sock" /tmp/x4d-state && mkdir -p /tmp/x4d-state
                        "$rb/daemon/xing4d" --model "$model" --device cuda --listen "$sock" --state-dir /tmp/x4d-state \
                                ${X4_DAEMON_CHUNK:+--prefill-chunk $X4_DAEMON_CHUNK} --mtp off --log-level debug >"$out/daemon.log" 2>&1 &
                        dpid=$!
                        for i in $(seq 180); do "$rb/cli/x4ctl" --socket "$sock" health >/dev/null 2>&1 && break; sleep 1; done
                        ids=$(awk 'BEGIN { s = 7; for (i = 0; i < 4096; i++) { s = (s * 1103515245 + 12345) % 2147483648; printf "%s%d", i ? "," : "", 4 + s % 100000 } }')
                        for r in 1 2 3; do
                                "$rb/cli/x4ctl" --socket "$sock" generate --tokens "$ids" --max-tokens 256 --ignore-eos >/dev/null ||
                                        echo "daemon: generate failed (rc $?)"
                                "$rb/cli/x4ctl" --socket "$sock" stats --json | tee -a "$out/daemon-stats.jsonl" |
                                        grep -o '"prefill_tok_s":[0-9.]*,"decode_tok_s":[0-9.]*'
                        done
                        kill $dpid; wait $dpid 2>/dev/null
                        tail -3 "$out/daemon.log"
                        say "x4-bench beside it: prefill 4,096, decode batch 1 at 4,096"
                        "$build/tools/x4-bench" --model "$model" --device cuda --prefill 4096 --decode-ctx 4096 --batch 1 \
                                --decode-tokens 32 --repeats 3 --json 2>&1 | tee "$out/daemon-bench.jsonl" | grep -E '"(prefill|decode)"'
                fi
        else
                echo "daemon: no RPC build (see $out/setup-rpc.log, $out/build-rpc.log)"
                tail -5 "$out/setup-rpc.log" "$out/build-rpc.log" 2>/dev/null
        fi
fi
if has attn; then
        for k in part dec4 dec2 split; do
                say "attention kernel forced: $k"
                X4_CUDA_ATTN=$k "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                        --decode-ctx 512,4096,32768 --batch 1 --decode-tokens 16 --repeats 2 2>&1 | grep "^decode"
        done
fi
# ncu_prefill_one REGEX SKIP FILE: ncu's sections of one launch (after SKIP) of the kernels REGEX
# names in a 4,096-token prefill of the full model, into FILE
ncu_prefill_one() {
        ncu --clock-control none --kernel-name regex:"$1" --launch-skip "$2" --launch-count 1 \
                --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
                --section ComputeWorkloadAnalysis --section LaunchStats --section SchedulerStats \
                "$build/tools/x4-bench" --model "$model" --device cuda --prefill 4096 --decode-ctx none \
                --repeats 1 --warmup 0 2>&1 | grep -v "^{" | tail -150 >"$3"
}
if has ncuhot; then
        # issue 12: why each kernel of a 4,096-token prefill's MoE layer takes its time: ncu's
        # sections (stall reasons, occupancy, pipes, memory) for every launch of one layer (the
        # launches `ncupre` timed with X4_NCU_PRE_SKIP=900), as text, and a digest per launch
        say "ncu: full sections, one MoE layer of a 4,096-token prefill"
        ncu --clock-control none --launch-skip ${X4_NCU_PRE_SKIP:-900} --launch-count ${X4_NCU_PRE_COUNT:-22} \
                --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
                --section ComputeWorkloadAnalysis --section LaunchStats --section SchedulerStats \
                "$build/tools/x4-bench" --model "$model" --device cuda --prefill 4096 --decode-ctx none \
                --repeats 1 --warmup 0 2>&1 | grep -v "^{" >"$out/ncu-hot.txt"
        grep -E "^  [a-zA-Z_]+.*\(|Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Eligible Warps|Achieved Occupancy|Registers Per|Warp Cycles Per Issued" \
                "$out/ncu-hot.txt" | head -300
fi
if has ncuprompt; then
        # issue 12: what limits the prompt attention: ncu on one k_attn_tc2 launch and one k_attn_fa
        # launch of the 4,096-token prefill's last pass (8 passes × 40 layers a prefill; skip 300)
        for v in tc2 fa; do
                say "ncu: prompt attention, X4_CUDA_ATTN_PROMPT=$v"
                X4_CUDA_ATTN_PROMPT=$v ncu_prefill_one "k_attn_(tc2|fa)" 300 "$out/ncu-prompt-$v.txt"
                grep -E "Duration|Throughput|Hit Rate|Stall|Registers|Achieved Occupancy|Issue Slots|Warp Cycles" "$out/ncu-prompt-$v.txt" | head -30
        done
        # and the rates beside it: both kernels with the f32 and the f16 cache (k_attn_fa's f16
        # path has two cp.async buffers and no conversion pass)
        for v in tc2 fa; do
                for ct in f32 f16; do
                        X4_CUDA_ATTN_PROMPT=$v "$build/tools/x4-bench" --model "$model" --device cuda --cache $ct \
                                --prefill 512,4096 --decode-ctx none --repeats 3 --json 2>&1 |
                                sed "s/}\$/,\"attn_prompt\":\"$v\"}/" | tee -a "$out/prompt-attn.jsonl" |
                                grep -o '"tokens":[0-9]*,"tok_s":[0-9.]*' | sed "s/^/$v $ct /"
                done
        done
fi
if has ncumha; then
        # issue 12: mha.cu's two kernels apart, on the last pass of a 4,096-token prefill (8 passes ×
        # 40 layers; a layer's launches by pass: 2 2 2 2 2 2 4 4, an expansion and an attention per
        # batch of ≤ 3 parts of 1,024): the four launches of layer 20 of the last pass (skip 40 ×
        # 16 + 4 × 20), then the full sections of its first expansion and attention (skip 40 × 8 +
        # 2 × 20 launches of one kernel)
        say "ncu: mha.cu kernels, last pass of a 4K prefill"
        ncu --clock-control none --kernel-name regex:"k_mha_" --launch-skip 720 --launch-count 4 --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
                "$build/tools/x4-bench" --model "$model" --device cuda --prefill 4096 --decode-ctx none --repeats 1 --warmup 0 2>&1 |
                grep -E "k_mha_|gpu__time|sm__" | tee "$out/ncu-mha-times.txt"
        for k in expand attend; do
                ncu_prefill_one "k_mha_$k" 360 "$out/ncu-mha-$k.txt"
                grep -E "Duration|Throughput|Hit Rate|Registers|Achieved Occupancy|Issue Slots|Warp Cycles|Eligible" "$out/ncu-mha-$k.txt" | head -20
        done
fi
if has ncuattn; then
        say "ncu: attention kernel details"
        X4_CUDA_GRAPHS=0 ncu --clock-control none --kernel-name regex:k_attn_dec --launch-skip 60 --launch-count 1 \
                --section SpeedOfLight --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
                "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512 \
                --batch 1 --decode-tokens 4 --repeats 1 --warmup 0 2>&1 | grep -v "^{" | tail -80 >"$out/ncu-attn.txt"
        X4_CUDA_GRAPHS=0 ncu --clock-control none --kernel-name regex:k_hc_fused --launch-skip 100 --launch-count 1 \
                --section SpeedOfLight --section WarpStateStats --section Occupancy \
                "$build/tools/x4-bench" --model "$model" --device cuda --prefill none --decode-ctx 512 \
                --batch 1 --decode-tokens 4 --repeats 1 --warmup 0 2>&1 | grep -v "^{" | tail -60 >"$out/ncu-hc.txt"
fi
if has split; then
        say "decode bench, split attention (X4_CUDA_ATTN=split)"
        X4_CUDA_ATTN=split "$build/tools/x4-bench" --model "$model" --device cuda --prefill none \
                --decode-ctx ${X4_CTX:-512,4096,32768} --batch ${X4_BATCH:-1,16} --decode-tokens 32 --repeats 3 \
                --json 2>&1 | tee "$out/bench-split.jsonl" | grep '"decode"'
fi
if has prefill; then
        for k in default split; do
                say "prefill bench, attention $k"
                X4_CUDA_ATTN=$([ $k = default ] && echo "" || echo $k) "$build/tools/x4-bench" --model "$model" \
                        --device cuda --prefill 512,4096 --decode-ctx none --repeats 2 --json 2>&1 |
                        tee "$out/prefill-$k.jsonl" | grep '"prefill"'
        done
fi
if has tc; then
        for cache in f16 f32; do
                say "decode bench, tensor-core attention, $cache cache"
                X4_CUDA_ATTN=tc "$build/tools/x4-bench" --model "$model" --device cuda --cache $cache --prefill none \
                        --decode-ctx 512,4096,32768 --batch 1,16 --decode-tokens 32 --repeats 3 --json 2>&1 |
                        tee "$out/bench-tc-$cache.jsonl" | grep '"decode"'
        done
        say "prefill bench, tensor-core attention, f16 cache"
        X4_CUDA_ATTN=tc "$build/tools/x4-bench" --model "$model" --device cuda --cache f16 --prefill 512,4096 \
                --decode-ctx none --repeats 2 --json 2>&1 | tee "$out/prefill-tc.jsonl" | grep '"prefill"'
fi
if has hcbench; then
        # the mHC pre-mapping fused (one kernel a token) against the default (token-tiled pair of
        # kernels for more than one token; same bits), with k_mm and with tensor-core products
        for mm in ${X4_HCBENCH_MM:-default tc}; do
                for hc in ${X4_HCBENCH_HC:-fused default}; do
                        say "mHC $hc, products $mm: prefill 512/4096, decode batch 1/16/64 at 512"
                        X4_CUDA_HC=$([ $hc = fused ] && echo fused) X4_CUDA_MM=$([ $mm = tc ] && echo tc || echo fp32) \
                                "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512,4096 \
                                --decode-ctx 512 --batch 1,16,64 --decode-tokens 16 --repeats 3 --json 2>&1 |
                                sed "s/}\$/,\"hc\":\"$hc\",\"mm\":\"$mm\"}/" | tee -a "$out/hcbench.jsonl" |
                                grep -E '"(prefill|decode)"'
                done
        done
        say "profile: prefill 512 with tensor-core products"
        X4_CUDA_MM=tc "$build/tools/x4-bench" --model "$model" --device cuda --prefill 512 --decode-ctx none \
                --repeats 1 --profile 2>&1 | tail -30 | tee "$out/prefill-tc-profile.txt"
fi
if has cpu16; then
        # issue 18: the CPU backend beside llama.cpp's CPU build on this host's cores, same files,
        # one call: the demo model at 2 threads, then the full model at 16
        say "waiting for llama.cpp's CPU build"
        wait
        tail -2 "$out/llama-cpu-build.log"
        lb=/tmp/llcpu/llamacpp-xing4-kit/build-cpu/bin/llama-bench
        lscpu | grep -E "Model name|^CPU\(s\)|Thread|NUMA node\(s\)|L3" | tee "$out/cpu-lscpu.txt"
        mkdir -p /tmp/x4-cpu-demo; demo=/tmp/x4-cpu-demo/demo.gguf
        "$build/tools/x4-mkmodel" --preset demo --out "$demo" --quiet --threads 8
        # the demo rows first (issue 18's 1.0x is asked of them); the full model after, 16 threads
        # only (its 8-thread rows were cut by the call's limit once)
        say "cpu: demo model, 2 threads (three interleaved rounds)"
        for r in 1 2 3; do
                "$build/tools/x4-bench" --model "$demo" --device cpu --threads 2 --prefill 512 --decode-ctx 64 \
                        --batch 1 --repeats 3 --json 2>&1 | tee -a "$out/cpu-x4.jsonl" | grep -E '"(prefill|decode)"'
                "$lb" -m "$demo" -t 2 -p 512 -n 64 -ngl 0 -r 3 -o jsonl 2>>"$out/cpu-llama.log" | tee -a "$out/cpu-llama.jsonl"
        done
        for t in ${X4_CPU_FULL_THREADS:-16}; do
                say "cpu: full model, $t threads"
                "$build/tools/x4-bench" --model "$model" --device cpu --threads $t --prefill 512 --decode-ctx 64 \
                        --batch 1 --decode-tokens 16 --repeats 3 --json 2>&1 | tee -a "$out/cpu-x4.jsonl" | grep -E '"(prefill|decode)"'
                "$lb" -m "$model" -t $t -p 512 -n 16 -ngl 0 -r 3 -o jsonl 2>>"$out/cpu-llama.log" | tee -a "$out/cpu-llama.jsonl"
        done
fi
if has peerend; then
        run_peer # its background build overlapped the call's other steps
fi
say done
# the device tool brings back at most 8 files: past that, one archive of all of them
if [ "$(find "$out" -type f | wc -l)" -gt 8 ]; then
        tar -C "$out" -czf /tmp/x4-results.tar.gz . && find "$out" -mindepth 1 -delete &&
                mv /tmp/x4-results.tar.gz "$out/results.tar.gz" && echo "outputs packed into results.tar.gz"
fi
