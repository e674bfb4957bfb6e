#!/bin/sh
# Installs what building and testing xing4d needs on Debian 12 (as root). Idempotent.
# Usage: scripts/install-deps.sh [build|test]
set -eu
what=${1:-test}

pkgs="meson ninja-build pkg-config gcc libc6-dev git
      protobuf-c-compiler libprotobuf-c-dev libevent-dev libsystemd-dev libjansson-dev
      systemd"
if [ "$what" = test ]; then
        pkgs="$pkgs libcmocka-dev clang libclang-rt-14-dev
              python3-pytest python3-numpy python3-jinja2 sentencepiece python3-sentencepiece
              python3-prometheus-client"
        # Node: the image's own Node 20 (which bundles npm) is used when present; otherwise
        # Debian's nodejs + npm (the two cannot be mixed: Debian's npm conflicts with a nodejs
        # that bundles npm).
        if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
                pkgs="$pkgs nodejs npm"
        fi
fi

missing=""
for p in $pkgs; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
        echo "installing:$missing"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
