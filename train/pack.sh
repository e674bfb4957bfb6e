#!/bin/bash
# SPDX-License-Identifier: MIT
# Pack what a GPU call needs into train/carry/ (git-ignored; name it in the device call's `carry`):
# the token files xz-compressed (train.py unpacks a .xz next to itself), meta.json, the tokenizer,
# and, with --ckpt RUN, a checkpoint to resume from on a fresh machine. Prints the sizes; the
# working tree plus carry must stay under 64 MiB.
#   train/pack.sh [--data train/data] [--ckpt train/runs/demo] [--prose-fraction F | --no-pretrain]
# (a fresh machine resuming from the 42.8 MB demo checkpoint has room for about half of the full
# corpus's prose: --prose-fraction 0.5 for pretraining, --no-pretrain (0.2) for the chat phase)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data=$here/data
ckpt=
frac=1
while [ $# -gt 0 ]; do
        case $1 in
        --data) data=$2; shift 2 ;;
        --ckpt) ckpt=$2; shift 2 ;;
        --no-pretrain) frac=0.2; shift ;;     # the chat and MTP phases need only a little prose
        --prose-fraction) frac=$2; shift 2 ;;
        *) echo "pack.sh: unknown argument $1" >&2; exit 2 ;;
        esac
done
out=$here/carry
rm -rf "$out"
mkdir -p "$out/tokens" "$out/tok"
cp "$data/tokens/meta.json" "$out/tokens/"
for f in "$data"/tokens/*.bin "$data"/tokens/*.mask; do
        b=$(basename "$f")
        if [ "$frac" != 1 ] && [ "$b" = pretrain_train.bin ]; then
                # the first part of the prose (whole uint16 tokens)
                n=$(awk -v s="$(stat -c %s "$f")" -v f="$frac" 'BEGIN { printf "%d", int(s * f / 2) * 2 }')
                head -c "$n" "$f" | xz -T0 -9 > "$out/tokens/$b.xz"
        else
                xz -T0 -9 -c "$f" > "$out/tokens/$b.xz"
        fi
done
# the tokenizer that made these ids (tokenizer.py encode keeps a copy next to them)
cp "$data/tokens/tokenizer.model" "$out/tok/xing4-demo.model"
if [ -n "$ckpt" ]; then
        [ -d "$ckpt/ckpt" ] && ckpt=$ckpt/ckpt
        mkdir -p "$out/ckpt"
        cp "$ckpt"/index.json "$ckpt"/shard-*.pt "$out/ckpt/"
fi
du -b --max-depth=1 "$out" | sort -n
tree=$(cd "$here/.." && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$(( tree + $(du -sb "$out" | cut -f1) ))
echo "tracked tree $tree B + carry = $total B of 67108864"
[ $total -lt 67108864 ] || { echo "pack.sh: over the 64 MiB a device call carries" >&2; exit 1; }
