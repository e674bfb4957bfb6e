#!/bin/bash
# Builds the xing4d Debian packages on Debian 12 (as root, or with sudo-less apt access):
# installs the build dependencies named in packaging/deb/debian/control (dpkg-checkbuilddeps), copies the tree to a
# scratch folder with debian/ at its top (dpkg-buildpackage needs ./debian at the source root),
# runs `dpkg-buildpackage -us -uc -b`, then lintian. The .debs end up in OUTDIR.
#
# Usage: scripts/build-debs.sh [OUTDIR]          (default: build-debs/)
# Environment:
#   X4_GPU_ARCHS=90        SM list of the CUDA module (comma separated; default: all of meson's)
#   X4_DEB_CHECK=1         run the unit tests inside the package build (default: off, CI runs
#                          them from the tree)
#   DEB_BUILD_PROFILES     e.g. nocuda; set to nocuda automatically when no nvcc is found, and
#                          pkg.xing4d.nodemo (no xing4d-demo-model) when the tree lacks the trained
#                          demo model models/xing4-demo/model.gguf (train/ship.py makes it)
# Exit status: 0 when the packages were built and lintian found no errors.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/build-debs}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export DEBIAN_FRONTEND=noninteractive

need() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
tools=""
for p in dpkg-dev debhelper lintian fakeroot; do
        need "$p" || tools="$tools $p"
done
if [ -n "$tools" ]; then
        echo "== installing packaging tools:$tools"
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $tools >/dev/null
fi

# nvcc decides whether xing4d-cuda is built (debian/rules looks in PATH and /usr/local/cuda).
profiles=${DEB_BUILD_PROFILES:-}
if ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then
        echo "== no nvcc: building without xing4d-cuda (profile nocuda)"
        profiles="${profiles:+$profiles }nocuda"
fi
opts=${DEB_BUILD_OPTIONS:-}
if [ "${X4_DEB_CHECK:-0}" != 1 ]; then
        opts="${opts:+$opts }nocheck"
        profiles="${profiles:+$profiles }nocheck"
fi
opts="${opts:+$opts }parallel=$(nproc)"

# A scratch copy of the tracked and not-ignored files (no build directories, no .git).
work=$(mktemp -d /tmp/xing4d-debs.XXXXXX)
trap 'rm -rf "$work"' EXIT
tree=$work/xing4d-0.1.0
mkdir -p "$tree"
(cd "$src" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        xargs -0 cp --parents -t "$tree") || {
        # not a git checkout: copy everything but build output
        tar -C "$src" --exclude='./build*' --exclude=./.git -cf - . | tar -C "$tree" -xf -
}
cp -r "$tree/packaging/deb/debian" "$tree/debian"

# The demo model is not in a plain clone: train/ship.py writes it (with its card) after training.
if [ ! -f "$tree/models/xing4-demo/model.gguf" ]; then
        echo "== no models/xing4-demo/model.gguf: building without xing4d-demo-model (profile pkg.xing4d.nodemo)"
        profiles="${profiles:+$profiles }pkg.xing4d.nodemo"
fi

echo "== build dependencies"
# dpkg-checkbuilddeps names what debian/control's Build-Depends (for these profiles) lacks;
# the first of each set of alternatives is installed, version constraints are left to apt.
missing=$(cd "$tree" && DEB_BUILD_PROFILES="$profiles" dpkg-checkbuilddeps 2>&1 |
        sed -n 's/.*Unmet build dependencies: //p' | sed 's/([^)]*)//g; s/|[^ ]*//g') || true
if [ -n "$missing" ]; then
        echo "   installing:$missing"
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
(cd "$tree" && DEB_BUILD_PROFILES="$profiles" dpkg-checkbuilddeps)

echo "== dpkg-buildpackage -us -uc -b (profiles: ${profiles:-none}; options: $opts)"
(cd "$tree" && DEB_BUILD_PROFILES="$profiles" DEB_BUILD_OPTIONS="$opts" \
        dpkg-buildpackage -us -uc -b) >"$out/build.log" 2>&1 || {
        tail -40 "$out/build.log"
        echo "dpkg-buildpackage failed; the whole log is $out/build.log" >&2
        exit 1
}
rm -f "$out"/*.deb "$out"/*.changes "$out"/*.buildinfo
mv "$work"/*.deb "$work"/*.changes "$work"/*.buildinfo "$out"/
echo "== built:"
ls -1 "$out"/*.deb

echo "== lintian"
changes=$(ls "$out"/*.changes)
set +e
lintian --profile debian --display-info --tag-display-limit 0 "$changes" >"$out/lintian.txt" 2>&1
set -e
cat "$out/lintian.txt"
if grep -q '^E: ' "$out/lintian.txt"; then
        echo "lintian reported errors" >&2
        exit 1
fi
echo "== done: packages in $out (lintian: $(grep -c '^W: ' "$out/lintian.txt" || true) warnings, 0 errors)"
