#!/bin/bash
# SPDX-License-Identifier: MIT
# One GPU call (train/README.md): train/gpu.sh PHASE MINUTES [train.py arguments]
# Resumes from train/runs/demo when the machine still has it (ignored files stay while it is warm),
# else from train/carry/ckpt (carried), else starts fresh; copies the checkpoint shards and the log
# to $OUT. PHASE export: write the release-typed GGUF + config.json, split into 15 MiB parts for
# $OUT (join with cat). CONFIG=toy picks the toy model (a CPU dry run of the same script).
set -euo pipefail
cd "$(dirname "$0")"
phase=$1 minutes=${2:-9}
shift 2 || shift $#
run=runs/demo
out=${OUT:-/tmp/out}
mkdir -p "$run" "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}   # the GPU machine: its python3 holds PyTorch
resume=
if [ -f $run/ckpt/index.json ]; then resume="--resume $run"
elif [ -f carry/ckpt/index.json ]; then resume="--resume carry/ckpt"; fi
$py -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'
if [ "$phase" = export ]; then
        $py export.py --ckpt ${resume#--resume } --spm carry/tok/xing4-demo.model --out $run/gguf/model.gguf --types release
        split -b 15M -d $run/gguf/model.gguf "$out/model.gguf.part"
        cp $run/gguf/config.json "$out/"
        cp $run/log.jsonl "$out/" 2>/dev/null || true
        exit 0
fi
$py train.py --run $run --config "${CONFIG:-demo}" --data carry/tokens --phase "$phase" --minutes "$minutes" $resume "$@"
mkdir -p "$out/ckpt"
cp $run/ckpt/index.json $run/ckpt/shard-*.pt "$out/ckpt/"
cp $run/log.jsonl "$out/"
