#!/bin/bash
# The GPU machine's build, made here instead: a GPU call is a fresh machine, and building the CUDA
# module and the tools there took 50-75 s of every call's device time (of 30 minutes a session).
# nvcc 13.0 is the same on both machines and the binaries need only glibc, libstdc++ and the CUDA
# runtime there, so the release build of the five programs the device scripts run is made here
# (build-dev, ignored) and copied to .devcarry/prebuilt (ignored) with a stamp of the
# sources it was built from. On the GPU machine decode-bench.sh and tests/gpu/run.sh use it only
# when the stamp matches the tree they run on, and build as before otherwise. A call carries
# .devcarry/pbx (the folder as one xz archive, which x4_prebuilt_ok unpacks): the tree (the demo
# model included) and the folder (the fatbin) together are over the 64 MiB a call may carry.
#
# Usage here:   bash scripts/device/prebuilt.sh          (build, then copy; ninja rebuilds only
#                                                         what changed)
# Sourced there: . scripts/device/prebuilt.sh; x4_prebuilt_ok DIR && echo usable
set -u

# The five programs, as build paths (the same layout under .devcarry/prebuilt).
X4_PREBUILT_TARGETS="kernels/cuda/xing4d-cuda.so kernels/cuda/x4-gpu-check tools/x4-bench tools/x4-logits tools/x4-mkmodel"

# A hash of every file a build reads (sources, headers, meson files, the protocol), computed the
# same way on both machines from the tree's contents (the GPU machine's copy has no usable git).
# tests/ is left out but for tests/gpu (x4-gpu-check's source).
x4_src_stamp() {
        { find . \( -path ./.git -o -path './build*' -o -path ./.devcarry -o -path ./tests -o -path ./train \
                -o -path ./bench -o -path ./docs -o -path ./models -o -path ./.whl -o -path ./.gl \
                -o -name node_modules \) -prune -o -type f \
                \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \
                -o -name '*.proto' -o -name meson.build -o -name meson_options.txt \) -print0
          find ./tests/gpu -type f \( -name '*.c' -o -name '*.h' \) -print0; } |
                LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

# 0 when DIR holds the five programs built from this tree (DIR absent but DIR/../pbx/pb.tar.xz
# there, the archive a call carries, unpacked first: the tree and the folder are over 64 MiB)
x4_prebuilt_ok() {
        local dir=$1 t
        if [ ! -d "$dir" ] && [ -f "$(dirname "$dir")/pbx/pb.tar.xz" ]; then
                tar -xJf "$(dirname "$dir")/pbx/pb.tar.xz" -C "$(dirname "$dir")" || return 1
        fi
        [ -f "$dir/STAMP" ] || return 1
        for t in $X4_PREBUILT_TARGETS; do [ -x "$dir/$t" ] || [ -f "$dir/$t" ] || return 1; done
        [ "$(head -1 "$dir/STAMP")" = "$(x4_src_stamp)" ]
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
        cd "$(dirname "$0")/../.." || exit 1
        bd=build-dev dst=.devcarry/prebuilt
        if [ ! -f "$bd/build.ninja" ]; then
                meson setup "$bd" -Drpc=disabled -Dgpu_archs=90 -Dcuda=enabled --buildtype=release || exit 1
        fi
        stamp=$(x4_src_stamp)
        # shellcheck disable=SC2086
        ninja -C "$bd" $X4_PREBUILT_TARGETS || exit 1
        [ "$(x4_src_stamp)" = "$stamp" ] || { echo "prebuilt: the sources changed during the build: run it again" >&2; exit 1; }
        rm -rf "$dst"
        for t in $X4_PREBUILT_TARGETS; do
                mkdir -p "$dst/$(dirname "$t")" && cp "$bd/$t" "$dst/$t" || exit 1
        done
        { echo "$stamp"; echo "built $(date -u +%FT%TZ) from $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo ' + changes')"; } >"$dst/STAMP"
        # the call's carry limit (64 MiB with the tree): the folder as one archive, unpacked there
        mkdir -p .devcarry/pbx && tar -cJf .devcarry/pbx/pb.tar.xz -C .devcarry prebuilt || exit 1
        echo "prebuilt: $dst ($(du -sh "$dst" | cut -f1), stamp $stamp), as .devcarry/pbx/pb.tar.xz ($(du -sh .devcarry/pbx/pb.tar.xz | cut -f1)): carry .devcarry/pbx"
fi
