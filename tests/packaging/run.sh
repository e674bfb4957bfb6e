#!/bin/bash
# The packaging test (Debian 12, as root; systemd need not be PID 1). One check per line, and
# BUILD_DIR/junit-packaging.xml with one testcase per check:
#   build        scripts/build-debs.sh builds every package (dpkg-buildpackage -us -uc -b)
#   lintian      no errors (warnings are listed in BUILD_DIR/debs/lintian.txt)
#   install      apt-get install ./*.deb
#   users        the static user xing4d (primary group xing4) exists
#   socket unit  xing4d.socket is enabled (enablement symlink + systemctl is-enabled, offline)
#   verify       systemd-analyze verify passes on every installed unit
#   default model  the installed daemon with no model configured: serves the xing4d-demo-model
#                package's model when that package was built (the tree has models/xing4-demo/
#                model.gguf, train/ship.py), else refuses to start naming the config and the path
#   daemon       the installed daemon, started as xing4d.service starts it (ExecStart, User and
#                Group parsed from the installed unit, the socket from ListenStream= handed over by
#                systemd-socket-activate), loads a demo model (x4-mkmodel) named in the config
#   x4ctl        the installed x4ctl generates through it
#   pkg-config   the example of libx4client-dev, built with pkg-config, connects and generates
#   cuda         without the CUDA runtime, --device cuda fails naming libcudart.so.13
#   stop         SIGTERM stops the daemon with status 0
#   purge        apt-get purge of every package succeeds and leaves no file behind
#
#   (first)      prerequisites: installs what this script runs and a minimal Debian 12 lacks
# Usage: tests/packaging/run.sh [BUILD_DIR]      (default build-packaging)
# Environment: X4_GPU_ARCHS (default 90) for the CUDA module; X4_DEBS=DIR reuses built .debs
# (skips the build); X4_MKMODEL=PATH an x4-mkmodel binary (default BUILD_DIR/tools/x4-mkmodel,
# else one is built in BUILD_DIR/pkgtest-mkmodel).
set -uo pipefail
[ "$(id -u)" = 0 ] || { echo "tests/packaging/run.sh installs and purges packages: run it as root" >&2; exit 2; }
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-packaging}
mkdir -p "$build"
build=$(cd "$build" && pwd)
junit=$build/junit-packaging.xml
export DEBIAN_FRONTEND=noninteractive

names=() results=() messages=() times=()
failures=0 skipped=0
t_start=$(date +%s)

xml_escape() { sed -e 's/&/\&amp;/g; s/</\&lt;/g; s/>/\&gt;/g; s/"/\&quot;/g'; }

write_junit() {
        local n=${#names[@]} i
        {
                echo '<?xml version="1.0" encoding="UTF-8"?>'
                printf '<testsuite name="packaging" tests="%d" failures="%d" errors="0" skipped="%d" time="%d">\n' \
                        "$n" "$failures" "$skipped" "$(( $(date +%s) - t_start ))"
                for ((i = 0; i < n; i++)); do
                        printf '  <testcase classname="packaging" name="%s" time="%s"' \
                                "$(printf '%s' "${names[i]}" | xml_escape)" "${times[i]}"
                        if [ "${results[i]}" = pass ]; then
                                echo '/>'
                        elif [ "${results[i]}" = skip ]; then
                                printf '>\n    <skipped message="%s"/>\n  </testcase>\n' \
                                        "$(printf '%s' "${messages[i]}" | xml_escape)"
                        else
                                printf '>\n    <failure message="%s"/>\n  </testcase>\n' \
                                        "$(printf '%s' "${messages[i]}" | head -c 2000 | xml_escape)"
                        fi
                done
                echo '</testsuite>'
        } >"$junit"
}

# check NAME COMMAND...: runs the command (a shell function usually), records pass/fail. The
# function's stdout+stderr is kept; on failure its last lines become the failure message. Status
# 77 means skipped (reported as such, never as passed).
check() {
        local name=$1 t0 out rc
        shift
        t0=$(date +%s)
        # in this shell (not a subshell): checks set variables (the daemon's pid) for later ones
        "$@" >"$build/pkgtest-check.log" 2>&1
        rc=$?
        out=$(cat "$build/pkgtest-check.log")
        names+=("$name")
        times+=("$(( $(date +%s) - t0 ))")
        if [ $rc -eq 0 ]; then
                results+=(pass)
                messages+=("")
                echo "PASS  $name"
        elif [ $rc -eq 77 ]; then
                results+=(skip)
                messages+=("$(printf '%s\n' "$out" | tail -3)")
                skipped=$((skipped + 1))
                echo "SKIP  $name: $(printf '%s' "$out" | tail -1)"
                rc=0
        else
                results+=(fail)
                messages+=("$(printf '%s\n' "$out" | tail -15)")
                failures=$((failures + 1))
                echo "FAIL  $name"
                printf '%s\n' "$out" | tail -15 | sed 's/^/      /'
        fi
        write_junit
        return $rc
}

finish() {
        write_junit
        echo "packaging: $(( ${#names[@]} - failures - skipped )) passed, $failures failed, $skipped skipped ($junit)"
        [ $failures -eq 0 ]
        exit $?
}

# ---- what this script itself runs ----------------------------------------------------------------
# A minimal Debian 12 lacks pgrep (procps) and may lack systemd's tools; install what is missing
# before the file list is taken, so the purge check does not count them as left behind.
do_prereqs() {
        local need=()
        command -v pgrep >/dev/null || need+=(procps)
        command -v systemd-socket-activate >/dev/null && command -v systemd-analyze >/dev/null ||
                need+=(systemd)
        [ ${#need[@]} -eq 0 ] && { echo "pgrep and the systemd tools are installed"; return 0; }
        echo "installing ${need[*]}"
        apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}"
}
check "prerequisites: the tools this test runs (procps for pgrep, systemd) are installed" do_prereqs || finish

# ---- build ---------------------------------------------------------------------------------------
debs=${X4_DEBS:-$build/debs}
do_build() {
        if [ -n "${X4_DEBS:-}" ]; then
                echo "reusing the packages in $X4_DEBS"
        else
                X4_GPU_ARCHS=${X4_GPU_ARCHS:-90} "$src/scripts/build-debs.sh" "$debs" || true
        fi
        expect="xing4d libx4client1 libx4client-dev x4ctl xing4-http-bridge"
        if [ -f "$src/models/xing4-demo/model.gguf" ]; then
                expect="$expect xing4d-demo-model"
        else
                echo "no models/xing4-demo/model.gguf: xing4d-demo-model is not expected"
                if ls "$debs"/xing4d-demo-model_*.deb >/dev/null 2>&1; then
                        echo "xing4d-demo-model was built without the model"
                        return 1
                fi
        fi
        if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
                expect="$expect xing4d-cuda"
        else
                echo "no nvcc: xing4d-cuda is not expected"
        fi
        for p in $expect; do
                ls "$debs/${p}"_*.deb >/dev/null 2>&1 || { echo "missing package $p in $debs"; return 1; }
        done
}
check "build: dpkg-buildpackage -us -uc -b builds every package" do_build || finish

do_lintian() {
        [ -s "$debs/lintian.txt" ] || { echo "no lintian output in $debs/lintian.txt"; return 1; }
        grep -E '^(E|W): ' "$debs/lintian.txt" || true
        ! grep -q '^E: ' "$debs/lintian.txt"
}
check "lintian: no errors" do_lintian

# ---- the file list before installing ------------------------------------------------------------
snapshot() {
        local roots=() d
        for d in /etc /usr /var /opt /srv /bin /sbin /lib /lib64; do
                [ -d "$d" ] && [ ! -L "$d" ] && roots+=("$d")
        done
        find "${roots[@]}" -xdev \( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/cache \
                -o -path /var/log -o -path /var/tmp -o -path /var/backups -o -path /var/mail \
                -o -path "$src" -o -path "$build" \) -prune -o -print 2>/dev/null |
                grep -v -E '^/etc/(passwd|group|shadow|gshadow|subuid|subgid)-?$|^/etc/ld\.so\.cache$' |
                sort
}
before=$build/pkgtest-files-before.txt
after=$build/pkgtest-files-after.txt
snapshot >"$before"

# ---- install -------------------------------------------------------------------------------------
pkgs=()
for f in "$debs"/*.deb; do
        pkgs+=("$(dpkg-deb -f "$f" Package)")
done
do_install() {
        apt-get install -y -q --no-install-recommends "${debs}"/*.deb
}
check "install: apt-get install ./*.deb" do_install || finish

do_users() {
        getent passwd xing4d || { echo "no user xing4d"; return 1; }
        getent group xing4 || { echo "no group xing4"; return 1; }
        [ "$(id -gn xing4d)" = xing4 ] || { echo "xing4d's primary group is $(id -gn xing4d), xing4 expected"; return 1; }
        [ "$(getent passwd xing4d | cut -d: -f7)" != /bin/bash ] || { echo "xing4d has a login shell"; return 1; }
}
check "users: static user xing4d in group xing4 (sysusers)" do_users

do_enabled() {
        local link=/etc/systemd/system/sockets.target.wants/xing4d.socket
        [ -L $link ] || { echo "$link: no enablement symlink"; return 1; }
        state=$(systemctl is-enabled xing4d.socket 2>&1)
        echo "systemctl is-enabled xing4d.socket: $state"
        [ "$state" = enabled ] || return 1
        # the service is socket-activated, not started on its own
        state=$(systemctl is-enabled xing4d.service 2>&1)
        echo "systemctl is-enabled xing4d.service: $state"
        [ "$state" = static ]
}
check "socket unit: xing4d.socket enabled, xing4d.service static" do_enabled

units=()
for u in xing4d.socket xing4d.service xing4-http-bridge.service; do
        for d in /lib/systemd/system /usr/lib/systemd/system; do
                [ -f $d/$u ] && { units+=("$d/$u"); break; }
        done
done
do_verify() {
        [ ${#units[@]} -eq 3 ] || { echo "installed units: ${units[*]}; 3 expected"; return 1; }
        local out
        out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify "${units[@]}" 2>&1)
        local rc=$?
        echo "$out"
        [ $rc -eq 0 ] && [ -z "$out" ]
}
check "verify: systemd-analyze verify on every unit" do_verify

# ---- the daemon as the service starts it --------------------------------------------------------
unit_key() { sed -n "s/^$2=//p" "$1" | tail -1; }
service=${units[1]:-/lib/systemd/system/xing4d.service}
socket_unit=${units[0]:-/lib/systemd/system/xing4d.socket}
exec_start=$(unit_key "$service" ExecStart)
svc_user=$(unit_key "$service" User)
svc_group=$(unit_key "$service" Group)
state_dir=/var/lib/$(unit_key "$service" StateDirectory)
sock=$(unit_key "$socket_unit" ListenStream)
conf=/etc/xing4d/xing4d.conf
work=$(mktemp -d /var/tmp/xing4d-pkgtest.XXXXXX)
chmod 0755 "$work"
daemon_pid=""
cleanup() {
        [ -n "$daemon_pid" ] && kill "$daemon_pid" 2>/dev/null && wait "$daemon_pid" 2>/dev/null
        rm -rf "$work"
}
trap cleanup EXIT

# Before the config names a model: the daemon as the service runs it, on a socket of its own.
default_model=/usr/share/xing4d/models/xing4-demo/model.gguf
do_default_model() {
        [ -n "$exec_start" ] && [ -n "$svc_user" ] || return 1
        local pid out rc
        install -d -m 0750 -o "$svc_user" -g "$svc_group" "$state_dir"
        install -d -m 0770 -o root -g "$svc_group" "$work/default"
        # shellcheck disable=SC2086
        timeout 300 setpriv --reuid="$svc_user" --regid="$svc_group" --init-groups --no-new-privs -- \
                $exec_start --threads 2 --listen "$work/default/xing4d.sock" >"$work/default.log" 2>&1 &
        pid=$!
        if dpkg-query -W -f='${Status}' xing4d-demo-model 2>/dev/null | grep -q 'ok installed'; then
                echo "xing4d-demo-model is installed: xing4d must serve $default_model"
                for _ in $(seq 1 600); do
                        x4ctl --socket "$work/default/xing4d.sock" health >/dev/null 2>&1 && break
                        kill -0 $pid 2>/dev/null || break
                        sleep 0.1
                done
                out=$(x4ctl --socket "$work/default/xing4d.sock" info 2>&1)
                rc=$?
                echo "$out"
                if [ $rc -eq 0 ]; then
                        x4ctl --socket "$work/default/xing4d.sock" generate --max-tokens 24 --thinking-budget 8 \
                                --temperature 0 "What does tar do?"
                        echo
                fi
                kill -TERM $pid 2>/dev/null
                wait $pid
                cat "$work/default.log"
                [ $rc -eq 0 ] && grep -q "serving the default $default_model" "$work/default.log" &&
                        grep -q "$default_model" <<<"$out"
        else
                echo "xing4d-demo-model not built (no models/xing4-demo/model.gguf): xing4d must refuse, naming both"
                wait $pid
                rc=$?
                cat "$work/default.log"
                [ $rc -ne 0 ] && grep -q "$conf" "$work/default.log" && grep -q "$default_model" "$work/default.log"
        fi
}
check "default model: with no model configured xing4d serves the demo model, or names both places" do_default_model

mkmodel=${X4_MKMODEL:-}
do_daemon() {
        echo "ExecStart=$exec_start User=$svc_user Group=$svc_group StateDirectory=$state_dir socket=$sock"
        [ -n "$exec_start" ] && [ -n "$svc_user" ] && [ -n "$sock" ] || return 1
        if [ -z "$mkmodel" ]; then
                if [ -x "$build/tools/x4-mkmodel" ]; then
                        mkmodel=$build/tools/x4-mkmodel
                else
                        [ -f "$build/pkgtest-mkmodel/build.ninja" ] ||
                                meson setup "$build/pkgtest-mkmodel" "$src" -Drpc=disabled -Dcuda=disabled \
                                        --buildtype=release >/dev/null || return 1
                        ninja -C "$build/pkgtest-mkmodel" tools/x4-mkmodel >/dev/null || return 1
                        mkmodel=$build/pkgtest-mkmodel/tools/x4-mkmodel
                fi
        fi
        "$mkmodel" --preset demo --seed 1 --out "$work/demo.gguf" >/dev/null || return 1
        chmod 0644 "$work/demo.gguf"
        # point the installed config at the model (the README's step), CPU threads kept small
        printf '\nmodel = %s\nthreads = 2\n' "$work/demo.gguf" >>"$conf"
        # what systemd does before ExecStart: the socket's directory and the StateDirectory
        install -d -m 0755 "$(dirname "$sock")"
        install -d -m 0750 -o "$svc_user" -g "$svc_group" "$state_dir"
        # shellcheck disable=SC2086
        systemd-socket-activate -l "$sock" \
                setpriv --reuid="$svc_user" --regid="$svc_group" --init-groups --no-new-privs -- \
                $exec_start >"$work/daemon.log" 2>&1 &
        daemon_pid=$!
        for _ in $(seq 1 100); do
                [ -S "$sock" ] && break
                sleep 0.1
        done
        [ -S "$sock" ] || { echo "no socket at $sock"; cat "$work/daemon.log"; return 1; }
        # SocketGroup=xing4, SocketMode=0660 of the unit
        chgrp "$(unit_key "$socket_unit" SocketGroup)" "$sock" && chmod "$(unit_key "$socket_unit" SocketMode)" "$sock"
        # the first connection starts the daemon; it answers once the model is loaded
        if ! x4ctl --socket "$sock" --connect-timeout 120000 health; then
                cat "$work/daemon.log"
                return 1
        fi
        local pid
        pid=$(pgrep -f -n "^/usr/sbin/xing4d --config" || true)
        [ -n "$pid" ] || { echo "no xing4d process"; cat "$work/daemon.log"; return 1; }
        local uid
        uid=$(awk '/^Uid:/ {print $2}' /proc/"$pid"/status)
        echo "xing4d pid $pid runs as uid $uid"
        [ "$uid" = "$(id -u "$svc_user")" ] || { echo "xing4d does not run as $svc_user"; return 1; }
        x4ctl --socket "$sock" info
}
check "daemon: installed xing4d started as xing4d.service starts it, serving the configured model" do_daemon
daemon_ok=$?

do_x4ctl() {
        [ $daemon_ok -eq 0 ] || { echo "no daemon"; return 1; }
        local out
        out=$(x4ctl --socket "$sock" --json generate --raw --max-tokens 16 --ignore-eos --seed 3 \
                "The packaging test says hello") || { echo "$out"; return 1; }
        echo "$out" | tail -2
        grep -q '"type":"done","finish_reason":"length".*"completion_tokens":16,' <<<"$out" ||
                { echo "no done line with 16 completion tokens"; return 1; }
}
check "x4ctl: the installed x4ctl generates 16 tokens through the daemon" do_x4ctl

do_pkgconfig() {
        [ $daemon_ok -eq 0 ] || { echo "no daemon"; return 1; }
        local ex=/usr/share/doc/libx4client-dev/examples/x4client-hello.c
        [ -f $ex ] || { echo "$ex missing"; return 1; }
        [ "$(pkg-config --modversion libx4client)" = "$(dpkg-query -W -f='${Version}' libx4client-dev | sed 's/-.*//')" ] ||
                { echo "pkg-config --modversion libx4client: $(pkg-config --modversion libx4client)"; return 1; }
        # shellcheck disable=SC2046
        cc -Wall -Werror -o "$work/hello" $ex $(pkg-config --cflags --libs libx4client) || return 1
        # (grep -q on a pipe can end it early: with pipefail the writer's SIGPIPE failed the check)
        local libs
        libs=$(ldd "$work/hello")
        grep -Eq 'libx4client.so.1 => (/usr)?/lib/' <<<"$libs" || { echo "$libs"; return 1; }
        local out
        out=$(X4_SOCKET=$sock "$work/hello" "Hello from pkg-config") || { echo "$out"; return 1; }
        echo "$out" | tail -1
        grep -Eq '^\[xing4d [0-9.]+: [0-9]+ prompt tokens, [1-9][0-9]* generated' <<<"$out" ||
                { echo "no summary line with generated tokens"; return 1; }
}
check "pkg-config: a program built against libx4client-dev connects and generates" do_pkgconfig

# Where NVIDIA's CUDA runtime is absent, the daemon must name the missing library. The loader's
# cache is ignored (ld.so --inhibit-cache), which hides libcudart.so.13 exactly as on such a host.
do_cuda_missing() {
        dpkg-query -W -f='${Status}' xing4d-cuda 2>/dev/null | grep -q 'ok installed' ||
                { echo "xing4d-cuda not built here (no nvcc)"; return 77; }
        local ldso out rc
        ldso=$(readlink -f /lib64/ld-linux-x86-64.so.2 2>/dev/null || true)
        [ -x "$ldso" ] || { echo "no dynamic loader at /lib64/ld-linux-x86-64.so.2"; return 1; }
        out=$("$ldso" --inhibit-cache /usr/sbin/xing4d --config /dev/null --model "$work/demo.gguf" \
                --device cuda --listen "$work/cuda.sock" 2>&1)
        rc=$?
        echo "$out"
        [ $rc -ne 0 ] || { echo "xing4d --device cuda started without the CUDA runtime"; return 1; }
        grep -q 'xing4d-cuda.so: libcudart.so.13: cannot open shared object file' <<<"$out" ||
                { echo "the message does not name libcudart.so.13"; return 1; }
}
check "cuda: without the CUDA runtime, xing4d --device cuda names libcudart.so.13" do_cuda_missing

do_stop() {
        [ -n "$daemon_pid" ] || return 1
        local pid
        pid=$(pgrep -f -n "^/usr/sbin/xing4d --config" || true)
        [ -n "$pid" ] || { echo "no xing4d process"; return 1; }
        kill -TERM "$pid"
        wait "$daemon_pid"
        local rc=$?
        daemon_pid=""
        echo "systemd-socket-activate/xing4d exited with $rc"
        tail -3 "$work/daemon.log"
        [ $rc -eq 0 ]
}
check "stop: SIGTERM stops the daemon with status 0" do_stop

# ---- purge ---------------------------------------------------------------------------------------
do_purge() {
        apt-get purge -y -q "${pkgs[@]}" || return 1
        rm -rf "$work"
        snapshot >"$after"
        # Policy keeps system users (xing4d, xing4): not files, so not in the lists.
        if ! diff "$before" "$after" >"$build/pkgtest-files.diff"; then
                echo "files differ before install / after purge (< gone, > left behind):"
                cat "$build/pkgtest-files.diff"
                return 1
        fi
        for p in "${pkgs[@]}"; do
                if dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -qv 'not-installed'; then
                        echo "$p still known to dpkg: $(dpkg-query -W -f='${Status}' "$p")"
                        return 1
                fi
        done
}
check "purge: apt-get purge removes every package and leaves no file behind" do_purge

finish
